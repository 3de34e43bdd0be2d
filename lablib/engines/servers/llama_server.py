"""llama.cpp's llama-server: its command (a row of :data:`lablib.engines.servers.SERVERS`) and defaults.

:func:`_llama_server` returns the :class:`~lablib.engines.servers.launch.Launch` of ``parallel`` slots of
``n_ctx`` tokens each, its step budget ``batch`` / ``ubatch`` (tokens; llama.cpp's defaults
:data:`LLAMA_SERVER_BATCH`, :data:`LLAMA_SERVER_UBATCH`) and its own speculative decoding with a draft
GGUF; it builds llama-server on first use (minutes) and starts nothing. Raises LabError when the build
fails, the model has no GGUF, the draft file is missing, or an option is not a whole number.
"""

from __future__ import annotations

from pathlib import Path

from lablib.checks import whole
from lablib.engines.servers.launch import Launch
from lablib.errors import LabError

# llama.cpp's own defaults (common/common.h): a logical batch of 2048 tokens (-b), a physical one of 512 (-ub)
LLAMA_SERVER_BATCH = 2048
LLAMA_SERVER_UBATCH = 512


def _llama_server(
    model,
    host: str,
    port: str,
    parallel: int,
    threads: int,
    n_ctx: int,
    batch: int | None = None,
    ubatch: int | None = None,
    draft: str | None = None,
    draft_max: int | None = None,
    draft_min: int | None = None,
    adapters: list | None = None,
):
    """llama.cpp's llama-server with ``parallel`` slots (continuous batching), built on first use from
    the in-process engine's source and flags (:func:`lablib.build.llama.llama_tool`; minutes).

    ``batch`` (``-b``, tokens; None: llama.cpp's 2048): the most tokens one step of its loop decodes, the
    running slots' next tokens first, then waiting prompts' tokens up to the budget (``update_slots``), so
    a prompt longer than the budget is prefilled in chunks between decode steps (llama.cpp's chunked
    prefill). ``ubatch`` (``-ub``; None: llama.cpp's 512, at most ``batch``): how many of them one
    compute pass takes (a step's tokens come out together, after all its passes). Its settings record what
    it runs with (``batch`` at most the whole context, ``n_ctx`` x ``parallel``).

    ``draft`` (a GGUF path: ``--model-draft``): speculative decoding with that draft model, llama.cpp's own
    (``--spec-draft-n-max`` ``draft_max`` tokens drafted per step, default 3; ``--spec-draft-n-min``
    ``draft_min``; ``--spec-type draft-simple``); its responses' ``timings`` then carry ``draft_n`` and
    ``draft_n_accepted``.

    ``adapters`` (a list of :class:`lablib.model.adapters.Adapter` of this model, checked by
    :func:`lablib.engines.servers.registry.check_adapters`): LoRA adapters served beside the base model, each
    ``--lora <its GGUF>`` (made on first use: llama.cpp's convert_lora_to_gguf.py), all loaded at scale 0
    (``--lora-init-without-apply``), so a request that names none runs the base model; the http engine sends
    each request's ``lora`` list (the named adapter's id at scale 1, the others at 0; ids in this order, as
    ``GET /lora-adapters`` lists them). Requests whose lists differ are never in one decode step
    (server-context.cpp: a slot batches only with slots whose ``lora`` equals its own, ``can_batch_with``)."""
    from lablib.build.llama import BuildError, llama_tool

    if batch is not None:
        batch = whole(batch, "batch", "a whole number of tokens per step (-b), at least 1")
    if ubatch is not None:
        ubatch = whole(ubatch, "ubatch", "a whole number of tokens per compute pass (-ub), at least 1")

    try:
        exe = str(llama_tool("llama-server"))
    except BuildError as e:
        raise LabError(f"llama-server could not be built: {e}") from None
    gguf = model.path_for("gguf", "llama-server")
    argv = [
        exe,
        "-m",
        gguf,
        "--host",
        host,
        "--port",
        port,
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-c",
        str(n_ctx * parallel),
        "--parallel",
        str(parallel),
        "--cont-batching",
        "--metrics",  # Prometheus /metrics (the server's own counters, lablib.engines.http.metrics)
        "--no-webui",
        "--alias",
        "lab-model",
        # log verbosity 4: llama.cpp's own load lines too (its hyperparameters and the KV caches it allocated,
        # lablib.engines.llamacpp.read_load_log), about 200 lines at start; requests log as at the default
        "-lv",
        "4",
    ]
    argv += ["-b", str(batch)] if batch is not None else []
    argv += ["-ub", str(ubatch)] if ubatch is not None else []
    spec = {}
    if draft is not None:
        if not Path(draft).is_file():
            raise LabError(f"draft={draft!r}: no such GGUF file; expected the path of a draft model's GGUF")
        # --spec-type: this build's default is none (a draft model loaded and never used)
        argv += ["--model-draft", str(draft), "--spec-type", "draft-simple", "-td", str(threads), "-ngld", "0"]
        spec = {"draft": str(draft)}
    for key, flag, value in (
        ("draft_max", "--spec-draft-n-max", draft_max),
        ("draft_min", "--spec-draft-n-min", draft_min),
    ):
        if value is not None:
            if draft is None:
                raise LabError(
                    f"{key}={value!r} without draft=: expected a draft model's GGUF (draft=PATH) to draft with"
                )
            lo = 0 if key == "draft_min" else 1  # llama.cpp's --spec-draft-n-min defaults to 0
            spec[key] = whole(value, key, f"a whole number of draft tokens per step, at least {lo}", lo=lo)
            argv += [flag, str(spec[key])]
    loras = []
    for ad in adapters or ():
        path = ad.path_for("gguf")  # made on first use (llama.cpp's converter, seconds)
        if "," in path:  # --lora splits its value on commas
            raise LabError(f"adapter {ad.name}'s GGUF path {path!r} has a comma, which llama-server's --lora splits on")
        argv += ["--lora", path]
        loras.append({"name": ad.name, "rank": ad.rank})
    if loras:
        argv += ["--lora-init-without-apply"]  # all at scale 0: a request without an adapter runs the base model
        spec["adapters"] = loras
    # what it runs with: llama.cpp takes -b at most the whole context (-c), and -ub at most -b (llama-context.cpp)
    b = min(batch or LLAMA_SERVER_BATCH, n_ctx * parallel)
    settings = {"batch": b, "ubatch": min(b, ubatch or LLAMA_SERVER_UBATCH), **spec}
    return Launch(argv, "llama.cpp (built by lablib)", ["/health"], "lab-model", settings=settings)
