"""A server's process: started, waited for, and stopped (with all it started).

:func:`start_server` runs a row of :data:`lablib.engines.servers.SERVERS` as a child process on 127.0.0.1
and a free port (:func:`free_port`), in a session of its own and tied to the lab process
(:func:`lablib.children.popen`), its log under ``$LABLIB_HOME/servers/``, and returns a
:class:`RunningServer` once one of its readiness URLs answers 200 (polled every 0.25 s; at most one
progress line every 15 s, :func:`changed_steps`). :meth:`RunningServer.stop` sends SIGTERM, then SIGKILL
after a grace period (seconds), then kills what is left of its process group (at most
:data:`KILLED_EXIT_S` s). Raises LabError: a port in use or out of range, a server that exits or is not
ready within its timeout (its log's last lines; it is then stopped), an engine asked of a server no
longer running.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lablib import children
from lablib.checks import whole
from lablib.engines.http import cards
from lablib.engines.servers.device import server_device
from lablib.engines.servers.registry import SERVERS, _command, canonical_server
from lablib.errors import LabError

_HANDED_OUT: set[int] = set()  # the ports free_port gave in this process
_HANDED_OUT_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it), never one this process was given before: two servers
    started at once from two threads (lab 05's vLLM pair) could otherwise be given the same one, the OS handing out
    a port again once the first probe closed it, and the second then found it in use."""
    with _HANDED_OUT_LOCK:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _HANDED_OUT:
                break
        _HANDED_OUT.add(port)
        return port


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
    behind: RunningServer | None = field(repr=False, default=None)  # a proxy's server (lablib.engines.servers.proxy)

    def engine(self, model=None, api: str = "completions", **kw):
        """An http engine on this server (``lablib.engines.http.HTTPEngine``), ``model`` the lab's model."""
        from lablib.engines import load_engine

        if not self.alive():  # else: "no server answers ... start one", as if it had never been started
            raise LabError(
                f"{self.name} (pid {self.pid}) is not running: it was stopped, or exited with code "
                f"{self.proc.returncode} (its log: {self.log_path}); start it again with start_server({self.name!r}, ...)"
            )
        if self.behind is not None and not self.behind.alive():  # else every request: the proxy's 502
            raise LabError(
                f"{self.name}: the server behind it ({self.behind.name}, pid {self.behind.pid}, "
                f"{self.behind.base_url}) is not running: it was stopped, or exited with code {self.behind.proc.returncode} (its log: "
                f"{self.behind.log_path}); start it again, then a proxy in front of it"
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
    ``batch=``/``ubatch=``, vLLM's ``num_gpu_blocks=``/``max_num_batched_tokens=``, both's ``adapters=``, LoRA
    adapters a request names by ``GenerationConfig.adapter``): see
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
    given, name = name, canonical_server(name)
    if port is None:  # a port the lab chooses: another process may take it first (CI's other worker): choose again
        for tries_left in range(4, -1, -1):
            port = free_port()
            try:
                _check_port_free(port)
                break
            except LabError:
                if not tries_left:
                    raise
    else:
        port = whole(port, "port", "a TCP port from 1 to 65535 (or leave it out for a free one)", hi=65535)
        _check_port_free(port)  # else a server already there that answers the readiness path looks like this one
    launch = _command(given, rm, port, parallel, threads, n_ctx, prefix_caching, options)  # an alias's choice kept
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

    def ready_then(srv: RunningServer) -> None:
        # what it computes on, read once it is ready (its log says where its weights went): every row's device
        try:
            log_text = log_path.read_text(errors="replace")
        except OSError:
            log_text = ""
        srv.settings.update(server_device(name, srv.settings, log_text))
        # for a run in another process (lablib bench, a notebook): what this server was started with
        cards.write_card(name, srv.pid, port, version, argv, log_path, srv.settings)

    return _launch(
        dict(
            name=name,
            kind=name,
            port=port,
            log_path=log_path,
            argv=argv,
            version=version,
            server_model=server_model,
            n_ctx=n_ctx,
            threads=threads or default_threads(),
            settings=dict(launch.settings, env=dict(launch.env)),
        ),
        child_env,
        launch.env,
        ready,
        timeout_s,
        log,
        ready_then,
    )


def _launch(fields: dict, child_env: dict, shown_env: dict, ready: list[str], timeout_s: float, log, ready_then=None):
    """Run ``fields["argv"]`` as a server (a :class:`RunningServer` of ``fields``): its output to
    ``fields["log_path"]`` (its command line first, with ``shown_env``), in a session of its own, tied to this
    process; return it once a URL of ``ready`` answers 200 (:func:`_wait_ready`) and ``ready_then(srv)`` ran. Stopped
    when anything fails or interrupts before then (LabError, KeyboardInterrupt raised)."""
    argv, log_path = fields["argv"], fields["log_path"]
    t0 = time.perf_counter()
    # a Ctrl-C or SIGTERM that comes while it is forked is held until the try below, which stops it: raised
    # inside Popen or before the try it lost the server, which ran on (children.interrupts_held)
    with children.interrupts_held() as held:
        with open(log_path, "ab") as log_file:
            said = " ".join(f"{k}={v}" for k, v in shown_env.items())
            log_file.write(f"# lablib: {said + ' ' if said else ''}{' '.join(argv)}\n".encode())
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
        srv = RunningServer(pid=proc.pid, proc=proc, **fields)
        try:  # an interrupt anywhere until the card is written stops the server (it is not the caller's yet)
            held.release()  # one that came while it was forked is raised here
            _wait_ready(srv, ready, timeout_s, log)
            srv.startup_s = time.perf_counter() - t0
            srv.settings["startup_s"] = round(srv.startup_s, 1)
            if ready_then is not None:
                ready_then(srv)
        except BaseException:
            # the stop carried to its end through a second Ctrl-C or SIGTERM (pressed twice, a notebook's Interrupt
            # clicked twice while vLLM stops; SIGINT and SIGTERM sent together, the second one's handler running as
            # the stop begins): it broke the stop, and the server ran on after this raised (found by a fuzz). The
            # interrupt raised is the first. Inline, not a helper: a pending handler runs as a function is entered,
            # before any try inside it
            while True:
                try:
                    srv.stop(grace_s=5)
                    break
                except KeyboardInterrupt:
                    continue  # the stop again from its start: each step of it does nothing once done
            raise
        return srv


# a log line's prefix that says nothing to a learner: vLLM's "(Worker pid=1) INFO 12-01 14:16:16 [file.py:87] "
_LOG_PREFIX = re.compile(r"^(\(\w+ pid=\d+\) )?(INFO|WARNING|DEBUG)?\s*(\d\d-\d\d [\d:.]+ )?(\[[^\]]+\] )?")


def _last_step(tail: str) -> str:
    """The last line of a starting server's log that says what it is doing (its prefix cut, 120 chars). Left
    out: indented lines, before or after the prefix (a warning's source line, a traceback's, a record spread
    over lines: lab 05 showed vLLM's ``wrapper = lookup(vars(value).get("kernel"))`` and ``reserved_cpus=[]``
    as its step), a warning's location line and vLLM's shared-memory chatter."""
    for raw in reversed(tail.splitlines()):
        line = _LOG_PREFIX.sub("", raw.rstrip())
        if raw[:1].isspace() or line[:1].isspace():
            continue
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
