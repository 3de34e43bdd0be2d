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
=====================  ===========================================  ==========================

Everything the lab knows of a server it starts is one row of :data:`SERVERS` (a :class:`Server`):
how to start it (``command``), its in-process ``twin`` engine (lab 05 compares the two), how it
streams (``profile``: the http engine's :class:`lablib.engines.http.ServerProfile` for its kind,
which also covers the servers the lab only measures: vLLM, any other OpenAI-compatible one) and
the other names it goes by.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import os
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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    def engine(self, model=None, api: str = "completions", **kw):
        """An http engine on this server (``lablib.engines.http.HTTPEngine``), ``model`` the lab's model."""
        from lablib.engines import load_engine

        kw.setdefault("server_version", self.version)
        kw.setdefault("n_ctx", self.n_ctx or None)
        return load_engine(
            "http", model, base_url=self.base_url, api=api, server=self.kind, server_model=self.server_model, **kw
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Stop this server by its pid: SIGTERM, then SIGKILL after ``grace_s``. Returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


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


def _llama_server(model, host: str, port: str, parallel: int, threads: int, n_ctx: int):
    """llama.cpp's llama-server with ``parallel`` slots (continuous batching), built on first use from
    the in-process engine's source and flags (:func:`lablib.build.llama.llama_tool`; minutes)."""
    from lablib.build.llama import BuildError, llama_tool

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
    return argv, "llama.cpp (built by lablib)", ["/health"], "lab-model"


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
}
ALIASES = {alias: name for name, s in SERVERS.items() for alias in s.aliases}


def server_command(
    name: str, model, port: int, parallel: int = 1, threads: int | None = None, n_ctx: int = 4096
) -> tuple[list[str], str, str, list[str]]:
    """(argv, kind for the http engine, version, readiness URLs) to run server ``name`` on ``model``.

    ``parallel``: slots / sequences decoded together; ``threads``: CPU threads for the server
    (default: :func:`lablib.machine.threads.default_threads`); ``n_ctx``: context per slot, tokens.
    Raises LabError when the server cannot run here (not installed, wrong format).
    """
    argv, version, ready, _ = _command(name, model, port, parallel, threads, n_ctx)
    return argv, canonical_server(name), version, ready


def _command(name: str, model, port: int, parallel: int, threads: int | None, n_ctx: int):
    """(argv, version, readiness URLs, the model id requests name) for :func:`server_command`."""
    from lablib.machine.threads import check_threads, default_threads

    name = canonical_server(name)
    threads = check_threads(threads) if threads is not None else default_threads()
    parallel = whole(parallel, "parallel", "a whole number of slots, at least 1")
    n_ctx = whole(n_ctx, "n_ctx", "a whole number of tokens per slot, at least 1")
    host = "127.0.0.1"
    server = SERVERS[name]
    argv, version, paths, model_id = server.command(model, host, str(port), parallel, threads, n_ctx)
    return argv, version, [f"http://{host}:{port}{path}" for path in paths], model_id or server.profile.model_id


def start_server(
    name: str,
    model=None,
    port: int | None = None,
    parallel: int = 1,
    threads: int | None = None,
    n_ctx: int = 4096,
    timeout_s: float = 180.0,
    env: dict | None = None,
) -> RunningServer:
    """Start server ``name`` (see :data:`SERVERS`) on ``model`` (default: the lab's model), on
    127.0.0.1 and ``port`` (default: a free one); return when it answers its readiness URL.

    The log goes to ``$LABLIB_HOME/servers/<name>-<port>-<time>.log``. Raises LabError with the
    log's last lines when the server exits or is not ready within ``timeout_s`` (it is then
    stopped).
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
    argv, version, ready, server_model = _command(name, rm, port, parallel, threads, n_ctx)
    logs = lab_home() / "servers"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_path = logs / f"{name}-{port}-{stamp}.log"
    child_env = dict(os.environ, **(env or {}))
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
    with open(log_path, "ab") as log:
        log.write(f"# lablib: {' '.join(argv)}\n".encode())
        log.flush()
        # tied: it dies with this process; forked by a thread that outlives it (children.popen)
        proc = children.popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env, start_new_session=True
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
    )
    try:
        _wait_ready(srv, ready, timeout_s)
    except BaseException:
        srv.stop(grace_s=5)
        raise
    srv.startup_s = time.perf_counter() - t0
    return srv


def _wait_ready(srv: RunningServer, urls: list[str], timeout_s: float) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
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
        time.sleep(0.25)
    raise LabError(
        f"{srv.name} did not answer {', '.join(urls)} within {timeout_s:.0f} s; it was stopped. "
        f"Its log ({srv.log_path}) ends:\n{srv.log_tail()}"
    )
