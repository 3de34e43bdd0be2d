"""Children tied to the lab process (lablib.children), with real programs: ``kill -9`` of a Python
process takes the program it started through the guard with it (sleep, and a real llama-server
started by lablib.engines.servers, its port then free), while an untied one lives on; the exec keeps the
pid; a child forked by a short-lived thread dies with that thread unless :func:`popen` forks it;
the guard's race branch, a missing program and bad input."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import psutil
import pytest

from lablib.children import popen, tied
from lablib.errors import LabError
from procs import BOUND_S, gone, wait_gone

if not sys.platform.startswith("linux"):
    pytest.fail(f"these tests check a Linux guarantee (prctl PR_SET_PDEATHSIG); platform is {sys.platform}")


def _execd(p: psutil.Process, argv: list[str]) -> bool:
    """Whether ``p`` runs ``argv`` (the guard has exec'd it) within BOUND_S; /proc/PID/cmdline
    reads empty for a moment during an exec, so it is polled."""
    deadline = time.monotonic() + BOUND_S
    while p.cmdline() != argv and time.monotonic() < deadline:
        time.sleep(0.01)
    return p.cmdline() == argv


# A "lab process": starts `sleep 60` tied (and one untied, the control), prints both pids, waits.
_TWO_SLEEPS = """\
import subprocess, sys, time
from lablib.children import tied
a = subprocess.Popen(tied(["sleep", "60"]))
b = subprocess.Popen(["sleep", "61"])
print(a.pid, b.pid, flush=True)
time.sleep(600)
"""


def test_kill_9_of_the_parent_takes_the_tied_program_and_only_it():
    lab = subprocess.Popen([sys.executable, "-c", _TWO_SLEEPS], stdout=subprocess.PIPE, text=True)
    untied = None
    try:
        a, b = map(int, lab.stdout.readline().split())
        tied_sleep, untied = psutil.Process(a), psutil.Process(b)
        # the guard exec'd sleep in place: same pid, the lab process its parent
        assert _execd(tied_sleep, ["sleep", "60"]) and tied_sleep.ppid() == lab.pid
        t0 = time.monotonic()
        os.kill(lab.pid, signal.SIGKILL)
        lab.wait()
        died_s = wait_gone(tied_sleep, t0)
        assert not gone(untied) and untied.cmdline() == ["sleep", "61"]  # the control lives on
        print(f"tied sleep (pid {a}) gone {died_s:.3f} s after kill -9 of its parent; untied sleep still runs")
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait()
        if untied is not None and not gone(untied):
            os.kill(untied.pid, signal.SIGKILL)


# A "lab process" whose worker thread starts `sleep 60` twice, tied: once by a plain Popen on the
# worker thread, once by children.popen; the worker waits until both have exec'd sleep (the guard
# has run: a thread gone before the prctl hands its children and the signal to another thread of
# the process), then exits; prints both pids once the worker's OS thread is gone.
_FROM_A_THREAD = """\
import os, subprocess, threading, time
from lablib.children import popen, tied
started = {}
def worker():
    started["native_id"] = threading.get_native_id()
    started["plain"] = subprocess.Popen(tied(["sleep", "60"]))
    started["popen"] = popen(["sleep", "61"])
    for p in (started["plain"], started["popen"]):
        while open(f"/proc/{p.pid}/comm").read().strip() != "sleep":
            time.sleep(0.01)
t = threading.Thread(target=worker)
t.start()
t.join()
while os.path.exists(f"/proc/self/task/{started['native_id']}"):  # the OS thread itself is gone
    time.sleep(0.01)
print(started["plain"].pid, started["popen"].pid, flush=True)
time.sleep(600)
"""


def test_popen_from_a_short_lived_thread_outlives_the_thread_not_the_process():
    lab = subprocess.Popen([sys.executable, "-c", _FROM_A_THREAD], stdout=subprocess.PIPE, text=True)
    try:
        plain, forked = (psutil.Process(int(x)) for x in lab.stdout.readline().split())
        # the signal follows the forking *thread*: a plain Popen on the worker died with it
        wait_gone(plain)
        # children.popen forked it on the lablib-children thread: still running, same pid, same parent
        assert not gone(forked) and forked.ppid() == lab.pid
        assert _execd(forked, ["sleep", "61"])
        t0 = time.monotonic()
        os.kill(lab.pid, signal.SIGKILL)
        lab.wait()
        died_s = wait_gone(forked, t0)
        print(f"sleep started by popen() from a finished thread gone {died_s:.3f} s after kill -9 of its parent")
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait()


def test_popen_on_the_main_thread_and_its_errors_in_the_caller():
    p = popen(["sh", "-c", "exit 3"])
    assert p.wait(timeout=BOUND_S) == 3
    r = subprocess.run(tied(["no-such-program-lablib"]), capture_output=True, text=True)
    assert r.returncode == 127 and "lablib: cannot run no-such-program-lablib: [Errno 2]" in r.stderr
    with pytest.raises(FileNotFoundError):  # Popen's own error (a missing cwd), raised on the thread...
        popen(["true"], cwd="/no/such/folder/lablib")
    errors = []

    def worker():  # ...and on a worker thread, forked by the lablib-children thread
        try:
            popen(["true"], cwd="/no/such/folder/lablib")
        except FileNotFoundError as e:
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert len(errors) == 1 and "/no/such/folder/lablib" in str(errors[0])


# A process that uses popen from a worker thread, forks (os.fork), and does it again in the copy.
_FORKED = """\
import os, signal, threading
from lablib.children import popen
def worker(out):
    out.append(popen(["sh", "-c", "exit 7"]).wait())
for who in ("parent", "copy"):
    out = []
    t = threading.Thread(target=worker, args=(out,))
    t.start()
    t.join()
    print(who, out, sorted(t.name for t in threading.enumerate()), flush=True)
    if who == "parent":
        if os.fork() != 0:
            os.wait()
            break
        signal.alarm(60)  # the copy: a liveness bound of its own (a hang here would outlive the test)
"""


def test_a_forked_copy_of_the_process_starts_its_own_forking_thread():
    r = subprocess.run([sys.executable, "-c", _FORKED], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "parent [7] ['MainThread', 'lablib-children']",
        "copy [7] ['MainThread', 'lablib-children']",
    ], r


def test_a_child_whose_parent_is_not_the_one_named_exits_before_running_anything(tmp_path):
    """The race branch: the parent died between the fork and the prctl (no signal will come)."""
    made = tmp_path / "made"
    r = subprocess.run(tied(["touch", str(made)], parent=os.getppid()), capture_output=True, text=True)
    assert r.returncode == 1
    assert f"the process that started this command (pid {os.getppid()}) has exited; not running touch" in r.stderr
    assert not made.exists()
    r = subprocess.run(tied(["touch", str(made)]), capture_output=True, text=True)
    assert r.returncode == 0 and made.exists()


def test_the_program_gets_default_signal_dispositions_and_the_environment():
    """Python ignores SIGPIPE and SIGXFSZ at start and an exec keeps ignored signals ignored: the
    guard restores them, as subprocess does, so the program ignores exactly what the same program
    started untied ignores (what this process inherited, e.g. from a CI harness, and nothing more)."""
    cmd = ["sh", "-c", "grep SigIgn /proc/self/status; echo $LABLIB_CHILD_TEST"]
    env = dict(os.environ, LABLIB_CHILD_TEST="seen")
    untied = subprocess.run(cmd, capture_output=True, text=True, env=env)
    r = subprocess.run(tied(cmd), capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.split() == untied.stdout.split(), (r, untied)
    ignored = int(r.stdout.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)), r.stdout


def test_bad_input_is_one_clear_error():
    with pytest.raises(LabError, match=r"cmd='sleep 60': expected a non-empty list of program and arguments"):
        tied("sleep 60")
    with pytest.raises(LabError, match=r"cmd=\[\]: expected a non-empty list"):
        tied([])
    with pytest.raises(LabError, match=r"cmd=\['sleep', 60\]: expected .*\(str or Path\)"):
        tied(["sleep", 60])
    with pytest.raises(LabError, match=r"parent=0: expected a process id"):
        tied(["true"], parent=0)
    assert tied(["true"])[-2:] == [str(os.getpid()), "true"]


# A "lab process" that starts a real llama-server through lablib.engines.servers on the default model, from
# the main thread (argv[1] "main") or from a worker thread ("worker") whose OS thread is gone
# before it prints the server's pid and port.
_SERVER = """\
import os, sys, threading, time
from lablib.engines.servers import start_server
out = {}
def start():
    out["native_id"] = threading.get_native_id()
    out["srv"] = start_server("llama-server", threads=1, n_ctx=256, timeout_s=600)
if sys.argv[1] == "worker":
    t = threading.Thread(target=start)
    t.start()
    t.join()
    while os.path.exists(f"/proc/self/task/{out['native_id']}"):
        time.sleep(0.01)
else:
    start()
print(out["srv"].pid, out["srv"].port, flush=True)
time.sleep(900)
"""


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket() as s:  # and a new server could listen there (SO_REUSEADDR, as servers bind)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


@pytest.mark.engine
@pytest.mark.parametrize("thread", ["main", "worker"])
def test_kill_9_of_the_lab_process_takes_its_llama_server_and_frees_the_port(thread):
    lab = subprocess.Popen(
        [sys.executable, "-c", _SERVER, thread], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    server = None
    try:
        line = lab.stdout.readline()
        assert line, f"the lab process exited ({lab.wait()}) before its llama-server was ready"
        pid, port = map(int, line.split())
        server = psutil.Process(pid)
        assert server.name() == "llama-server" and server.ppid() == lab.pid
        assert os.getsid(pid) == pid  # still in a session of its own (start_new_session)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            assert r.status == 200  # ready, and alive after the thread that started it has exited
        t0 = time.monotonic()
        os.kill(lab.pid, signal.SIGKILL)
        lab.wait()
        died_s = wait_gone(server, t0)
        assert _port_free(port), f"port {port} still taken after llama-server (pid {pid}) was gone"
        print(f"llama-server (pid {pid}, started on the {thread} thread) gone {died_s:.3f} s after kill -9, port free")
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait()
        if server is not None and not gone(server):
            os.kill(server.pid, signal.SIGKILL)


def test_the_program_gets_exactly_the_environment_it_was_given_even_a_c_locale():
    """Python's start coerces a C/POSIX locale by setting LC_CTYPE=C.UTF-8 in its own environment
    (PEP 538; ``-I`` cannot turn that off): the guard must exec the program with the environment
    the caller gave (``env=``), not the one the guard's interpreter ended up with."""
    for env in ({"PATH": os.defpath, "LANG": "C"}, {"PATH": os.defpath, "LC_CTYPE": "POSIX", "X": "a=b"}, {}):
        untied = subprocess.run(["env"], capture_output=True, text=True, env=env)
        r = subprocess.run(tied(["env"]), capture_output=True, text=True, env=env)
        assert r.returncode == 0 and r.stderr == ""
        assert (
            sorted(r.stdout.splitlines())
            == sorted(untied.stdout.splitlines())
            == sorted(f"{k}={v}" for k, v in env.items())
        ), (env, r.stdout)


def test_interrupts_held_puts_ctrl_c_back_when_a_sigterm_comes_between_its_two_swaps(monkeypatch):
    """interrupts_held swaps SIGINT's handler, then SIGTERM's: a SIGTERM between the two ran its own handler (it
    raises, as lablib serve's does) inside __enter__, so no block was entered, nothing restored, and Ctrl-C's handler
    stayed the holder's (Ctrl-C then did nothing for the rest of the process). Found by reading (a helper's pass)."""
    import signal

    from lablib import children

    class Terminated(BaseException):
        pass

    def terminated(signum, frame):
        raise Terminated

    real_signal, swaps = signal.signal, []

    def signal_then_sigterm(sig, handler):
        old = real_signal(sig, handler)
        swaps.append(sig)
        if sig == signal.SIGINT and len(swaps) == 1:
            signal.raise_signal(signal.SIGTERM)  # SIGTERM's handler is still its own: it raises here
        return old

    prior = {signal.SIGINT: real_signal(signal.SIGINT, signal.default_int_handler)}
    prior[signal.SIGTERM] = real_signal(signal.SIGTERM, terminated)
    try:
        monkeypatch.setattr(children.signal, "signal", signal_then_sigterm)
        with pytest.raises(Terminated):
            with children.interrupts_held():
                pass
        monkeypatch.undo()
        after = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    finally:
        monkeypatch.undo()
        for sig, handler in prior.items():
            real_signal(sig, handler)
    assert after == (signal.default_int_handler, terminated)


def _interrupt_swallowed_in_a_callback(sig) -> None:
    """``sig`` taken while Python runs a callback whose exceptions it can only print ("Exception ignored in ..."),
    as llama.cpp's log callback while it loads a model, or a weakref's or the garbage collector's callback: here a
    weakref's (signal.raise_signal runs the handler before it returns)."""
    import weakref

    class Thing:
        pass

    thing = Thing()
    ref = weakref.ref(thing, lambda _: signal.raise_signal(sig))
    del thing  # the callback runs here; its KeyboardInterrupt goes to sys.unraisablehook, not to this frame
    assert ref() is None


def test_an_interrupt_python_could_only_print_is_sent_again_and_a_later_one_still_raises(capsys):
    """first_interrupt_only drops signals after the first: the first must have reached the code. One swallowed
    in a callback (found by fuzzing: SIGTERM while llama.cpp loaded a model, then Ctrl-C, SIGTERM, Ctrl-C: all
    ignored, the sweep ran to its end) is sent again a moment later, where it raises, and nothing is printed."""
    from lablib.children import first_interrupt_only
    from procs import ctrl_c_raises

    hook_before = sys.unraisablehook
    for sig in (signal.SIGTERM, signal.SIGINT):
        with ctrl_c_raises(), first_interrupt_only():  # ctrl_c_raises: a background job (CI) inherits SIGINT ignored
            _interrupt_swallowed_in_a_callback(sig)
            t0 = time.monotonic()
            with pytest.raises(KeyboardInterrupt) as got:
                while time.monotonic() - t0 < 5:
                    time.sleep(0.01)
            assert got.value.args == (signal.Signals(sig).name,) and time.monotonic() - t0 < 2
            # taken now: a later one is dropped, as ever
            signal.raise_signal(signal.SIGINT)
            time.sleep(0.2)
        assert "Exception ignored" not in capsys.readouterr().err
    assert sys.unraisablehook is hook_before  # the hook put back: another callback's exception is printed as before


def test_a_signal_after_a_swallowed_first_one_is_named_after_the_first(capsys):
    """A Ctrl-C swallowed in a callback, then a SIGTERM before the Ctrl-C is sent again: the command was stopped
    by Ctrl-C (KeyboardInterrupt "SIGINT": exit code 130), as when the first was taken at once; the Ctrl-C sent
    again is then dropped. Was: "SIGTERM", exit code 143 (CI, stop 52: tests/test_sweep.py's Ctrl-C then SIGTERM
    0.2 s later, the Ctrl-C swallowed in a ``__del__`` or a callback)."""
    from lablib.children import REDELIVER_S, first_interrupt_only
    from procs import ctrl_c_raises

    with ctrl_c_raises(), first_interrupt_only():
        _interrupt_swallowed_in_a_callback(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt) as got:
            signal.raise_signal(signal.SIGTERM)  # at once: well before REDELIVER_S
        assert got.value.args == ("SIGINT",)
        time.sleep(REDELIVER_S * 4)  # the Ctrl-C sent again, if it were, would raise here
    assert "Exception ignored" not in capsys.readouterr().err


def test_a_sweeps_ctrl_c_is_the_commands_first_signal(capsys):
    """`lablib sweep`'s Ctrl-C handler (ctrl_c_also_cancels, which also stops the sweep) inside the command's
    (first_interrupt_only): the Ctrl-C raises KeyboardInterrupt("SIGINT") and sets the cancel event, and a SIGTERM
    after it, on the way out, is dropped. Was: the command's handler never saw the Ctrl-C, the SIGTERM raised
    "SIGTERM", and the sweep exited 143 saying "interrupted (SIGTERM)" (CI, stops 52 and 53)."""
    from lablib.children import first_interrupt_only
    from lablib.cli.common import ctrl_c_also_cancels

    before = signal.getsignal(signal.SIGINT)
    # a terminal's process (Python's handler), and a background job's (SIGINT ignored, as in CI: the command's
    # handler is then on SIGTERM alone, and the sweep's is the only one that takes a Ctrl-C)
    for sigint in (signal.default_int_handler, signal.SIG_IGN):
        try:
            signal.signal(signal.SIGINT, sigint)
            with first_interrupt_only():
                with pytest.raises(KeyboardInterrupt) as got, ctrl_c_also_cancels() as cancel:
                    signal.raise_signal(signal.SIGINT)
                assert got.value.args == ("SIGINT",) and cancel.is_set()
                signal.raise_signal(signal.SIGTERM)  # dropped: no KeyboardInterrupt here
                time.sleep(0.1)
        finally:
            signal.signal(signal.SIGINT, before)


def test_lablib_main_called_from_python_leaves_the_callers_signal_handlers(monkeypatch, tmp_path):
    """Only a lablib process takes SIGTERM as Ctrl-C for its command; a script calling lablib.cli.main([...]) keeps
    its own handlers (a SIGTERM ends the script, as before)."""
    import lablib.cli.sweep
    from lablib.cli import main

    seen = []
    monkeypatch.setattr(lablib.cli.sweep, "run", lambda ns: seen.append(signal.getsignal(signal.SIGTERM)) or 0)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["sweep", "context", "--engines", "llama.cpp", "--out", str(tmp_path / "x.jsonl")]) == 0
    assert seen == [before] and signal.getsignal(signal.SIGTERM) is before
