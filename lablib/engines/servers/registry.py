"""The servers the lab starts, by name (:data:`SERVERS`), and what turns a name and options into a
:class:`~lablib.engines.servers.launch.Launch`.

:func:`canonical_server` maps any alias to its row's name; :func:`server_options` lists a command's own
options; :data:`SPECULATION` / :func:`speculation_options` give the options= of the speculative decoding a
server runs itself; :func:`server_command` / :func:`_command` check ``parallel`` (slots), ``threads`` (CPU
threads), ``n_ctx`` (tokens per slot) and the options, and call the row's command (nothing is started
here). Raises LabError for an unknown server, an option it does not take, or a value out of range.
"""

from __future__ import annotations

from collections.abc import Callable

from lablib.checks import whole
from lablib.engines.http.protocol import PROFILES
from lablib.engines.servers.launch import Launch, Server
from lablib.engines.servers.llama_server import _llama_server
from lablib.engines.servers.python_servers import _llama_cpp_python, _mlx_server, _transformers_serve
from lablib.engines.servers.vllm import VLLM_MAX_LORA_RANK, _vllm
from lablib.errors import LabError

# The servers the lab starts, in the lab's order: name (its kind, as the http engine knows it) -> its row
SERVERS: dict[str, Server] = {
    "llama-server": Server(_llama_server, "llama.cpp", PROFILES["llama-server"], aliases=("llama.cpp",)),
    "llama-cpp-python": Server(
        _llama_cpp_python, "llama.cpp", PROFILES["llama-cpp-python"], aliases=("llama_cpp.server", "llama-cpp")
    ),
    "mlx": Server(_mlx_server, "mlx", PROFILES["mlx"], aliases=("mlx_lm.server", "mlx-lm", "mlx_lm")),
    "transformers": Server(
        _transformers_serve, "transformers", PROFILES["transformers"], aliases=("transformers-serve",)
    ),
    # its first start compiles the model (torch.compile, cached under ~/.cache/vllm): ~4 min on 2 cores
    "vllm": Server(_vllm, "transformers", PROFILES["vllm"], aliases=("vllm-cpu",), startup_timeout_s=900.0),
}
ALIASES = {alias: name for name, s in SERVERS.items() for alias in s.aliases}
# aliases that name a choice as well as a server: the options each one sets (start_server("vllm-cpu") is vLLM's CPU
# build whatever the machine, as LABLIB_VLLM_BUILD=cpu; "vllm" is the machine's choice: its CUDA build beside an
# NVIDIA GPU it supports)
ALIAS_OPTIONS: dict[str, dict] = {"vllm-cpu": {"build": "cpu"}}

# the servers the lab starts with LoRA adapters (start_server's options={"adapters": [Adapter, ...]}, lab 11): name ->
# the largest rank it takes (None: no limit). llama-server: --lora per adapter, each request's "lora" scales; vLLM:
# --enable-lora, --lora-modules, each request's "model" naming one (vllm/config/lora.py: max_lora_rank <= 512)
ADAPTER_SERVERS: dict[str, int | None] = {"llama-server": None, "vllm": VLLM_MAX_LORA_RANK}


def canonical_server(name: str) -> str:
    """The name :data:`SERVERS` gives the server ``name`` (any alias); LabError naming them otherwise."""
    key = ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if key not in SERVERS:
        raise LabError(f"unknown server {name!r}: expected one of {', '.join(SERVERS)}")
    return key


def server_command(
    name: str,
    model,
    port: int,
    parallel: int = 1,
    threads: int | None = None,
    n_ctx: int = 4096,
    prefix_caching: bool | None = None,
    options: dict | None = None,
) -> tuple[list[str], str, str, list[str]]:
    """(argv, kind for the http engine, version, readiness URLs) to run server ``name`` on ``model``.

    ``parallel``: slots / sequences decoded together; ``threads``: CPU threads for the server
    (default: :func:`lablib.machine.threads.default_threads`); ``n_ctx``: context per slot, tokens;
    ``prefix_caching``: a server-wide prefix cache where the server has one (vLLM; None: the lab's
    default, off); ``options``: the server's own options by name, as its row's command takes them
    (:func:`server_options`: llama-server's ``batch``, ``ubatch``; vLLM's ``num_gpu_blocks``,
    ``max_num_batched_tokens``; llama-server's and vLLM's ``adapters``, a list of LoRA Adapters served beside the
    model, one per request: :func:`check_adapters`), recorded in its settings. Raises LabError when the server
    cannot run here (not installed, wrong format), does not take an option, or cannot serve the adapters.
    """
    launch = _command(name, model, port, parallel, threads, n_ctx, prefix_caching, options)
    return launch.argv, canonical_server(name), launch.version, launch.ready


# the command's own arguments, which every server's command takes: not options
_COMMAND_ARGS = ("model", "host", "port", "parallel", "threads", "n_ctx", "prefix_caching")


def check_adapters(name: str, model, adapters) -> list:
    """``adapters`` (a list of :class:`lablib.model.adapters.Adapter`) checked for server ``name`` on ``model`` (a
    ResolvedModel): a server that serves adapters (:data:`ADAPTER_SERVERS`), each an Adapter of this model
    (:func:`lablib.model.adapters.check_adapter_for`), names unique, ranks within what the server takes. Returns
    them as a list; one LabError naming every problem otherwise, before anything is built or started."""
    from lablib.model.adapters import Adapter, check_adapter_for

    name = canonical_server(name)
    if name not in ADAPTER_SERVERS:
        raise LabError(
            f"adapters=: {name} serves no LoRA adapters in the lab; expected one of {', '.join(ADAPTER_SERVERS)} "
            "(several adapters on one server, one per request), or an in-process engine with its adapter "
            "(load_engine(..., adapter=))"
        )
    if isinstance(adapters, Adapter) or not isinstance(adapters, (list, tuple)):
        raise LabError(
            f"adapters= a {type(adapters).__name__}: expected a list of Adapters "
            "(lablib.model.adapters.make_adapter(model, rank=8)), several on one server"
        )
    problems = []
    for i, ad in enumerate(adapters):
        if not isinstance(ad, Adapter):
            problems.append(f"adapters[{i}] is a {type(ad).__name__}, not an Adapter (make_adapter(model, rank=...))")
            continue
        try:
            check_adapter_for(ad, model)
        except LabError as e:
            problems.append(str(e))
        top = ADAPTER_SERVERS[name]
        if top is not None and ad.rank > top:
            problems.append(f"adapter {ad.name} has rank {ad.rank}, above the {top} {name} takes")
    names = [ad.name for ad in adapters if isinstance(ad, Adapter)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        problems.append(f"adapter names {twice} given more than once: expected each adapter once")
    if problems:
        raise LabError(f"adapters= for {name}: " + "; ".join(problems))
    return list(adapters)


def server_options(name: str) -> tuple[str, ...]:
    """The options server ``name``'s command takes besides the common ones (start_server's ``options=``)."""
    import inspect

    params = inspect.signature(SERVERS[canonical_server(name)].command).parameters
    return tuple(p for p in params if p not in _COMMAND_ARGS)


# the speculative decoding each server runs itself (lab 10): method -> its options for k draft tokens a step and a
# draft (llama-server: a GGUF path), as start_server's options= takes them
SPECULATION: dict[str, dict[str, Callable]] = {
    "llama-server": {"draft model": lambda k, draft: {"draft": str(draft), "draft_max": k, "draft_min": 0}},
    "vllm": {
        "ngram": lambda k, draft: {
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": k,
                "prompt_lookup_max": 3,
                "prompt_lookup_min": 2,
            }
        }
    },
}


def speculation_methods(name: str) -> tuple[str, ...]:
    """The speculative methods server ``name`` runs itself (:data:`SPECULATION`; () = none)."""
    return tuple(SPECULATION.get(canonical_server(name), {}))


def speculation_options(name: str, method: str, k: int, draft=None) -> dict:
    """``options=`` for :func:`start_server` that make server ``name`` speculate with ``method``, ``k`` draft
    tokens a step (``draft``: the draft model's GGUF where the method takes one). LabError for another method."""
    name = canonical_server(name)
    k = whole(k, "k", "a whole number of draft tokens per step, at least 1")
    make = SPECULATION.get(name, {}).get(method)
    if make is None:
        raise LabError(
            f"{name} runs no {method!r} speculation in the lab; expected one of {', '.join(speculation_methods(name)) or 'none'}"
        )
    if method == "draft model" and draft is None:
        raise LabError(f"{name} speculating with a draft model needs draft= (the draft's GGUF path)")
    return make(k, draft)


def _command(
    name: str,
    model,
    port: int,
    parallel: int,
    threads: int | None,
    n_ctx: int,
    prefix_caching=None,
    extra: dict | None = None,
):
    """The :class:`Launch` of :func:`server_command`, its readiness paths as URLs; ``name`` as given (an alias of
    :data:`ALIAS_OPTIONS` sets its options)."""
    from lablib.machine.threads import check_threads, default_threads

    given = str(name).strip().lower()
    name = canonical_server(name)
    pinned = ALIAS_OPTIONS.get(given, {})
    clash = {k: v for k, v in (extra or {}).items() if k in pinned and v is not None and v != pinned[k]}
    if clash:
        raise LabError(
            f"options {clash} with the server name {given!r}, which means {pinned}: give the name {name!r} with "
            f"options={clash}, or {given!r} without them"
        )
    if pinned:
        extra = {**(extra or {}), **pinned}
    threads = check_threads(threads) if threads is not None else default_threads()
    parallel = whole(parallel, "parallel", "a whole number of slots, at least 1")
    n_ctx = whole(n_ctx, "n_ctx", "a whole number of tokens per slot, at least 1")
    host = "127.0.0.1"
    server = SERVERS[name]
    options = {}
    if prefix_caching is not None:
        import inspect

        if "prefix_caching" not in inspect.signature(server.command).parameters:
            raise LabError(
                f"prefix_caching={prefix_caching!r}: {name} has no server-wide prefix cache switch "
                "(llama-server's prompt cache is per request: the http engine turns it off); "
                "expected it left out for this server"
            )
        options["prefix_caching"] = bool(prefix_caching)
    if extra:
        if extra.get("adapters") is not None:  # checked first: a server without adapters is said as such
            extra = {**extra, "adapters": check_adapters(name, model, extra["adapters"]) or None}
        takes = server_options(name)
        unknown = sorted(k for k in extra if k not in takes)
        if unknown:
            raise LabError(
                f"options {unknown}: {name} takes {', '.join(takes) or 'no options'} "
                "(lablib.engines.servers.server_options)"
            )
        options.update({k: v for k, v in extra.items() if v is not None})
    launch = server.command(model, host, str(port), parallel, threads, n_ctx, **options)
    if not isinstance(launch, Launch):
        launch = Launch(*launch)
    launch.ready = [f"http://{host}:{port}{path}" for path in launch.ready]
    launch.model_id = launch.model_id or server.profile.model_id
    launch.settings = {"parallel": parallel, "threads": threads, "n_ctx": n_ctx, **launch.settings}
    return launch
