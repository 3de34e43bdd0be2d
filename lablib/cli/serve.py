"""`lablib serve --server NAME ...`: a real OpenAI-compatible server on the lab's model (Ctrl-C stops it).

lablib serve --server NAME [--port P] [--parallel N] [--threads T] [--n-ctx N] [--prefix-caching]
             [--duration-s S]

``--server vllm`` installs vLLM's CPU build on first use (minutes; ``make vllm`` does it ahead) and
its first start with a new configuration compiles for a few minutes (cached under ~/.cache/vllm).
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time

from lablib.children import first_interrupt_only
from lablib.errors import LabError

HELP = "start a real OpenAI-compatible server on the lab's model (Ctrl-C stops it)"


def add_arguments(p) -> None:
    from lablib.engines.servers import SERVERS

    p.add_argument("--server", required=True, help=", ".join(SERVERS))
    p.add_argument("--model", default=None, help="the lab's model (default: SmolLM2-135M)")
    p.add_argument("--port", type=int, default=None, help="loopback port (default: a free one)")
    p.add_argument("--parallel", type=int, default=1, help="slots decoded together (llama-server, mlx, vllm)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for the server")
    p.add_argument("--n-ctx", type=int, default=4096, help="context per slot, tokens")
    p.add_argument(
        "--prefix-caching",
        action="store_true",
        help="vllm: keep its prefix cache on (off by default: measured runs reuse no KV cache)",
    )
    p.add_argument("--duration-s", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")


def run(ns) -> int:
    if ns.duration_s is not None and not ns.duration_s > 0:
        raise LabError(f"--duration-s {ns.duration_s}: expected a positive number of seconds")
    # Ctrl-C or SIGTERM while it starts (vLLM: minutes): start_server stops it; one line, no traceback. Then, while
    # it serves, either one stops it. One handler all along: restoring one between the two left a moment (its
    # ready lines) where a Ctrl-C was a traceback and a SIGTERM killed the lab, leaving the server to its death
    # signal and vLLM's workers to themselves. Only the first one: a second one broke the stop (first_interrupt_only).
    with first_interrupt_only():
        return _serve(ns)


def _serve(ns) -> int:
    from lablib.engines.servers import start_server

    try:
        srv = start_server(
            ns.server,
            ns.model,
            port=ns.port,
            parallel=ns.parallel,
            threads=ns.threads,
            n_ctx=ns.n_ctx,
            prefix_caching=True if ns.prefix_caching else None,
            log=lambda m: print(m, file=sys.stderr, flush=True),
        )
    except KeyboardInterrupt as e:
        name = e.args[0] if e.args and isinstance(e.args[0], str) else "SIGINT"
        print(f"lablib serve: interrupted by {name} while {ns.server} started; it was stopped", file=sys.stderr)
        return 128 + int(getattr(signal, name, signal.SIGINT))
    try:  # nothing between the server's return and this try: an interrupt there lost it
        deadline = math.inf if ns.duration_s is None else time.monotonic() + ns.duration_s
        print(
            f"{srv.name} {srv.version} ready at {srv.base_url} (pid {srv.pid}, {srv.startup_s:.1f} s; log "
            f"{srv.log_path})",
            flush=True,
        )
        device = ("device", "device_name", "device_source")
        print(f"runs on: {srv.settings.get('device_name')} ({srv.settings.get('device_source')})", flush=True)
        shown = {k: v for k, v in srv.settings.items() if k not in ("env", "startup_s", *device)}
        print("started with: " + ", ".join(f"{k}={v}" for k, v in shown.items()), flush=True)
        print(
            f"measure it: lablib bench --base-url {srv.base_url} --concurrency 1 --requests 4 --prompt-tokens 64 "
            "--max-new-tokens 32 --out serving.jsonl",
            flush=True,
        )
        while srv.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (first_interrupt_only)
        pass
    finally:
        died = not srv.alive()
        # a second Ctrl-C or SIGTERM while the server stops (one sent to the whole process group, as `timeout`
        # passes it on) would break the stop with a traceback and leave the server's group to the exit hook
        held = (
            {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
            if threading.current_thread() is threading.main_thread()
            else {}
        )
        try:
            code = srv.stop()
        finally:
            for s, h in held.items():
                signal.signal(s, h)
    if died:
        print(f"{srv.name} exited by itself (code {code}); its log ends:\n{srv.log_tail()}", file=sys.stderr)
        return 1
    print(f"{srv.name} stopped (pid {srv.pid})")
    return 0
