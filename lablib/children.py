"""Child processes that die with the lab process that started them, even under ``kill -9``.

A restarted Jupyter kernel, an out-of-memory kill or ``kill -9`` ends a process without running
its cleanup, and a child it started (a server, a model build) runs on as an orphan, keeping its
memory, model and port. :func:`tied` turns a command into one that the kernel kills (SIGKILL)
when its parent dies:

    ``tied(["llama-server", "-m", "m.gguf"])`` ->
    ``[sys.executable, "-I", "-S", "-c", GUARD, "<this pid>", "llama-server", "-m", "m.gguf"]``

The guard (a few lines of Python, stdlib only) asks for the signal (Linux: ``prctl(PR_SET_PDEATHSIG,
SIGKILL)`` through libc), exits at once if its parent is already gone (it died between the fork and
the prctl: no signal would come), restores SIGPIPE and SIGXFSZ (Python ignores them, an exec would
keep them ignored), then execs the command (``os.execvpe``) with the environment it was given
(Linux: read back from ``/proc/self/environ``: under a C locale Python's start adds LC_CTYPE=C.UTF-8,
PEP 538, and ``-I`` does not stop it): same pid, so the caller stops it by ``proc.pid`` as before,
and a ``start_new_session`` child stays its session's leader. The death signal survives the exec
(not into set-user-id programs). Elsewhere (macOS: no prctl) the guard only execs. Cost: one
interpreter start per child (``-I -S``: ~20 ms measured on the 2-core VM). Only the child is tied: children it starts itself (pip's compilers, say) are not.

Why not ``preexec_fn``: it runs Python between fork and exec, which Python documents as unsafe
where threads exist (a Jupyter kernel always has some). Why it matters which *thread* forks: the
signal fires when the thread that called fork exits, not the process (a thread that exits before
the child's prctl hands the child, and so the signal, to another thread of the process). A
blocking call (``subprocess.run``) outlives its child on any thread; a child that outlives the
call (a server from ``Popen``) must be forked by a thread that lives as long as the process:
:func:`popen` forks on the main thread when called there (a notebook cell, a script, the CLI),
and otherwise on one daemon thread kept for this (``lablib-children``), so a server started
from a worker thread is not killed when that thread ends (measured: a llama-server started by a
plain tied Popen on a worker thread died with the thread).

:class:`interrupts_held` keeps a Ctrl-C or SIGTERM that comes while such a child is forked until the
caller's ``try`` that stops it (else the interrupt could land inside ``Popen`` and lose the child).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from contextlib import contextmanager

from lablib.checks import whole
from lablib.errors import LabError

# argv[1]: the pid of the process that started the child; argv[2:]: the command. Exit codes:
# 1 the parent is gone, 127 the command cannot be executed (as a shell says).
GUARD = """\
import os, signal, sys
parent, cmd = int(sys.argv[1]), sys.argv[2:]
if sys.platform.startswith("linux"):
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL)) != 0:  # 1: PR_SET_PDEATHSIG
        print(f"lablib: prctl(PR_SET_PDEATHSIG) failed (errno {ctypes.get_errno()}): {cmd[0]} is not tied", file=sys.stderr)
    if os.getppid() != parent:
        sys.exit(f"lablib: the process that started this command (pid {parent}) has exited; not running {cmd[0]}")
for s in ("SIGPIPE", "SIGXFSZ"):  # ignored by Python at start; an exec keeps ignored signals ignored
    if hasattr(signal, s):
        signal.signal(getattr(signal, s), signal.SIG_DFL)
env = os.environ  # Python's start may have changed it: a C locale gets LC_CTYPE=C.UTF-8 (PEP 538)
try:
    with open("/proc/self/environ", "rb") as f:  # the environment as given to this process
        env = {}
        for e in f.read().split(b"\\0"):
            k, eq, v = e.partition(b"=")
            if eq and k not in env:
                env[k] = v
except OSError:
    pass
try:
    os.execvpe(cmd[0], cmd, env)
except OSError as e:
    print(f"lablib: cannot run {cmd[0]}: {e}", file=sys.stderr)
    sys.exit(127)
"""


def tied(cmd: list[str], parent: int | None = None) -> list[str]:
    """``cmd`` (program and arguments, as for ``subprocess``) run tied to process ``parent``
    (default: this process, which must be the one that starts it): ``python -I -S -c GUARD PARENT
    *cmd``. Start it from a thread that outlives the child (see the module docstring; :func:`popen`
    does). Raises LabError when ``cmd`` is not a non-empty list of strings or paths, or ``parent``
    no pid."""
    if (
        isinstance(cmd, (str, bytes))
        or not isinstance(cmd, (list, tuple))
        or not cmd
        or not all(isinstance(a, (str, os.PathLike)) for a in cmd)
    ):
        raise LabError(
            f"cmd={cmd!r}: expected a non-empty list of program and arguments (str or Path), e.g. ['sleep', '60']"
        )
    if parent is None:
        parent = os.getpid()
    else:
        parent = whole(parent, "parent", "a process id (a positive int), or None for this process")
    return [sys.executable, "-I", "-S", "-c", GUARD, str(parent), *map(os.fspath, cmd)]


def popen(cmd: list[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(tied(cmd), **kwargs)`` forked by a thread that lives as long as this
    process: the calling thread when it is the main thread, else the ``lablib-children`` daemon
    thread (started on first use). The child dies with this process, not with the calling thread.
    ``Popen``'s own errors are raised here, in the caller's thread."""
    argv = tied(cmd)
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(argv, **kwargs)
    done: Future = Future()
    _forker().put((argv, kwargs, done))
    return done.result()


_lock = threading.Lock()
_queue: queue.SimpleQueue | None = None  # the lablib-children thread's work, once it runs


def _forker() -> queue.SimpleQueue:
    global _queue
    with _lock:
        if _queue is None:
            _queue = queue.SimpleQueue()
            threading.Thread(target=_fork_forever, args=(_queue,), name="lablib-children", daemon=True).start()
        return _queue


def _after_fork_in_child() -> None:  # an os.fork() copy has no lablib-children thread (and a fresh lock)
    global _lock, _queue
    _lock, _queue = threading.Lock(), None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _fork_forever(q: queue.SimpleQueue) -> None:
    while True:  # never returns: a child's death signal fires when this thread exits
        argv, kwargs, done = q.get()
        try:
            done.set_result(subprocess.Popen(argv, **kwargs))
        except BaseException as e:  # handed to the caller
            done.set_exception(e)


class interrupts_held:
    """``with interrupts_held() as held:`` a Ctrl-C (SIGINT) or SIGTERM that comes inside is kept, not
    handled, until :meth:`release`, which restores the handlers and raises what came there, in the
    caller's ``try``; leaving the block without ``release`` restores the handlers and drops what came.

    For a child that outlives the call (a server): ``Popen`` returns it only once it runs, and an
    interrupt inside ``Popen`` or before the caller's ``try`` lost it, running on (found by CI: a
    SIGTERM sent as ``lablib serve``'s llama-server appeared left it running after the lab had said
    "it was stopped"). Held: only signals whose handler is Python's (a callable: ``default_int_handler``,
    ``lablib serve``'s); SIG_DFL and SIG_IGN act as before. Only on the main thread, the one Python
    runs signal handlers on; elsewhere it holds nothing (no handler can interrupt that thread)."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __enter__(self) -> interrupts_held:
        self.came: list[int] = []
        self._prior: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            try:
                for name in self.SIGNALS:
                    sig = getattr(signal, name, None)
                    handler = None if sig is None else signal.getsignal(sig)
                    if callable(handler):
                        self._prior[sig] = handler
                        signal.signal(sig, self._keep)
            except BaseException:  # a SIGTERM between the two swaps, its own handler raising: no block, no exit
                self._restore()
                raise
        return self

    def _keep(self, signum, frame) -> None:
        self.came.append(signum)

    def _restore(self) -> None:
        try:
            while self._prior:
                sig, handler = self._prior.popitem()
                signal.signal(sig, handler)
        finally:
            if self._prior:  # a handler just put back raised (its signal came between two restores): the rest too
                self._restore()

    def release(self) -> None:
        """Restore the handlers, then raise each signal that came (its handler runs here: Ctrl-C's raises
        KeyboardInterrupt)."""
        self._restore()
        came, self.came = self.came, []
        for sig in came:
            signal.raise_signal(sig)

    def __exit__(self, *exc) -> bool:
        self._restore()
        return False


def first_interrupt_handler():
    """A signal handler that raises KeyboardInterrupt named after its signal ("SIGINT", "SIGTERM") the first
    time it runs and drops every later signal: a second Ctrl-C (pressed twice; SIGINT and SIGTERM sent together,
    both pending at once, Python running the second handler at its next check, in the middle of the first one's
    way out) cannot break what the first began: stopping a server, writing the rows of the requests in flight.
    Raised too, it did (found by fuzzing `lablib serve`, `bench` and `replay`: a server left to its death signal;
    "RuntimeError: release unlocked lock" from a queue's Condition.wait, exit 1, the rows in flight not written).
    One handler may serve several signals: the first of any of them is the one raised. Used by
    :func:`first_interrupt_only` and by each client process of :func:`lablib.measure.load.run_load_processes`.

    ``handler.swallowed(exc)``: True when ``exc`` is the interrupt it raised, which never reached the code it
    was meant for (Python printed it as "Exception ignored in ...": raised inside a callback of C code, such as
    llama.cpp's log callback while it loads a model, or of the garbage collector); the signal counts as not
    taken: it is sent again ``REDELIVER_S`` later (from another thread: the main thread takes it at its next
    check, in Python code of its own once the C code returns), and a later signal raises too, named after the
    first (Ctrl-C then SIGTERM: "SIGINT", exit code 130, whichever lands in Python code first). Without it, such a
    first signal left the command deaf to every later one (found by fuzzing: Ctrl-C and SIGTERM ignored while a
    sweep ran to its end); named after itself, a SIGTERM 0.2 s after a swallowed Ctrl-C made a sweep say
    "interrupted (SIGTERM)" and exit 143 (CI, stop 52, once in 500 llama.cpp requests: not in llama.cpp's log
    callback, silent between requests, so in a ``__del__`` or the garbage collector's callback)."""
    state = {"first": None, "taken": None, "raised": None}  # the first signal, the one taken, the interrupt raised

    def first_only(signum, frame):
        if state["first"] is None:
            state["first"] = signum
        if state["taken"] is None:
            state["taken"] = signum
            state["raised"] = KeyboardInterrupt(signal.Signals(state["first"]).name)
            raise state["raised"]

    def swallowed(exc) -> bool:
        if exc is None or exc is not state["raised"]:
            return False
        state["taken"], state["raised"] = None, None
        _send_again(state["first"], unless=lambda: state["taken"] is not None)  # unless another came meanwhile
        return True

    first_only.first_interrupt_only = True  # what first_interrupt_only finds set by an outer block
    first_only.swallowed = swallowed
    return first_only


REDELIVER_S = 0.05  # a swallowed interrupt sent again this much later (seconds): past the hook that reported it


def _send_again(signum: int, unless=lambda: False) -> None:
    """``signum`` sent again :data:`REDELIVER_S` from now to the main thread, from a timer thread, unless
    ``unless()`` is then true. To the main thread itself (``pthread_kill``): a signal raised in the timer thread
    (``raise_signal``) left a main thread blocked in a system call (``time.sleep``, a socket's read) blocked to
    its end: measured in a notebook's kernel, a Ctrl-C during a quantization landed only after the 3 s sleep that
    followed it."""
    main = threading.main_thread().ident

    def again():
        if not unless():
            signal.pthread_kill(main, signum)

    t = threading.Timer(REDELIVER_S, again)
    t.daemon = True
    t.start()


@contextmanager
def swallowed_interrupts_sent_again():
    """``with swallowed_interrupts_sent_again():`` around C code that calls back into Python (llama.cpp's log
    callback, called per line while it loads or quantizes a model): a Ctrl-C that Python raised inside such a
    callback can only be printed ("Exception ignored on calling ctypes callback function ... KeyboardInterrupt")
    and the C code goes on; here it is sent again :data:`REDELIVER_S` later, until it lands in Python code of
    the caller's own (at the latest once the C code returns). Without it, a Ctrl-C in a notebook's kernel or a
    script during a quantization was lost: lab 06's ladder ran on (found by tests/test_staging.py). For the
    Python handler that raises KeyboardInterrupt (a terminal's, a kernel's); inside :func:`first_interrupt_only`
    (every ``lablib`` command), whose own hook sends its interrupt again, and off the main thread, it does
    nothing."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        or getattr(signal.getsignal(signal.SIGTERM), "first_interrupt_only", False)
    ):
        yield
        return

    def sent_again(exc) -> bool:
        if isinstance(exc, KeyboardInterrupt):
            _send_again(signal.SIGINT)
            return True
        return False

    with _unraisable_taken_by(sent_again):
        yield


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (``kill(pid, 0)``; one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def _unraisable_taken_by(take):
    """For the block, an exception Python can only print ("Exception ignored in ...": raised in a callback of C
    code, a ``__del__``, the garbage collector) goes first to ``take(exc)``; what it does not take (False) goes on
    to the hook before. That hook is put back after, unless the block set another meanwhile."""
    prior_hook = sys.unraisablehook

    def hook(unraisable):
        if not take(unraisable.exc_value):
            prior_hook(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        if sys.unraisablehook is hook:
            sys.unraisablehook = prior_hook


@contextmanager
def first_interrupt_only():
    """``with first_interrupt_only():`` Ctrl-C (SIGINT) and SIGTERM raise KeyboardInterrupt named after the signal
    (SIGTERM the same way out as Ctrl-C) the first time; later ones are dropped until the block ends
    (:func:`first_interrupt_handler`), unless Python could only print the first (raised in a callback of C code:
    then it is sent again, and a later one raises too). Around every command of a ``lablib`` process
    (:func:`lablib.cli.main`), its message included; a block inside one (`lablib serve`, `bench` and `replay`
    hold their own, for their functions' callers too) keeps the outer one's handler, so a signal the outer block
    already took is not raised again. Only on the main thread (no handler can be set elsewhere); SIGINT only where
    a Python handler is set (ignored in a background job, it stays ignored)."""
    if threading.current_thread() is not threading.main_thread() or getattr(
        signal.getsignal(signal.SIGTERM), "first_interrupt_only", False
    ):
        yield
        return
    handler = first_interrupt_handler()
    prior = {}
    for s in (signal.SIGTERM, signal.SIGINT):
        if s == signal.SIGTERM or callable(signal.getsignal(s)):
            prior[s] = signal.signal(s, handler)
    try:
        with _unraisable_taken_by(handler.swallowed):  # an interrupt Python could only print: not taken
            yield
    finally:
        for s, h in prior.items():
            if signal.getsignal(s) is handler:  # one the block set meanwhile (an exit's SIG_IGN) is left as it is
                signal.signal(s, h if h is not None else signal.SIG_DFL)
