"""Files and folders written whole or not at all (lablib.staging): the helper on real files, then a real
conversion stopped by a real Ctrl-C (llama.cpp's quantizer, 100 MB written as it goes), and a merge that fails
after an earlier merge: no ``.tmp`` is left and what was there before stays."""

import contextlib
import os
import signal
import threading
import time

import pytest

from lablib.staging import staged, staging_path
from procs import ctrl_c_raises


def test_a_file_replaces_the_old_one_only_when_complete(tmp_path):
    out = tmp_path / "facts.json"
    out.write_text("old")
    with pytest.raises(ValueError), staged(out) as tmp:
        tmp.write_text("half")
        raise ValueError("the conversion failed")
    assert out.read_text() == "old" and not staging_path(out).exists()
    with pytest.raises(KeyboardInterrupt), staged(out) as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt
    assert out.read_text() == "old" and not staging_path(out).exists()
    with staged(out) as tmp:
        assert tmp == tmp_path / f"facts.json.{os.getpid()}.tmp" and not tmp.exists()
        tmp.write_text("new")
    assert out.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["facts.json"]


def test_a_folder_replaces_the_old_one_and_a_killed_runs_leftover_is_cleared(tmp_path):
    out = tmp_path / "hf"
    (out / "old").mkdir(parents=True)
    left = staging_path(out)
    (left / "sub").mkdir(parents=True)  # what a run killed outright (kill -9) left behind
    (left / "sub" / "weights").write_bytes(b"x" * 100)
    with staged(out, make_folder=True) as tmp:
        assert tmp.is_dir() and list(tmp.iterdir()) == []  # the leftover is gone before anything is written
        (tmp / "config.json").write_text("{}")
    assert [p.name for p in out.iterdir()] == ["config.json"] and not left.exists()
    with pytest.raises(RuntimeError), staged(out, make_folder=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"half")
        raise RuntimeError
    assert [p.name for p in out.iterdir()] == ["config.json"] and not left.exists()


def test_a_link_left_as_the_tmp_is_removed_not_what_it_points_to(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "file").write_text("mine")
    out = tmp_path / "out"
    staging_path(out).symlink_to(keep, target_is_directory=True)
    with staged(out) as tmp:
        tmp.write_text("new")
    assert out.read_text() == "new" and (keep / "file").read_text() == "mine"


# a process that stages `out` (a file, or a folder with "made_by"), says so in `ready`, waits for `go`, finishes
_WRITER = """
import sys, time
from pathlib import Path
from lablib.staging import staged
out, folder = Path(sys.argv[1]), sys.argv[2] == "folder"
with staged(out, make_folder=folder) as tmp:
    (tmp / "made_by" if folder else tmp).write_text("child")
    (out.parent / "ready").touch()
    while not (out.parent / "go").exists():
        time.sleep(0.01)
"""


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_two_processes_making_the_same_file_at_once_each_finish_whole(tmp_path, kind):
    """Two processes convert the same thing at once (two kernels quantizing the Q4_0 rung: lab 06 and lab 10's
    draft): each writes its own staging file, the last rename wins, whole, and neither fails. Was (one
    ``<out>.tmp`` for all): the second cleared the first's file as it began, and the first failed
    (FileNotFoundError) or renamed the second's half-written file into place."""
    import subprocess
    import sys

    out = tmp_path / "Q4_0.gguf"
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(out), kind], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert child.poll() is None and time.monotonic() < deadline, child.stderr.read()
            time.sleep(0.01)
        with staged(out, make_folder=kind == "folder") as tmp:  # while the child's is half-written
            (tmp / "made_by" if kind == "folder" else tmp).write_text("parent")
        made = (out / "made_by") if kind == "folder" else out
        assert made.read_text() == "parent"
        assert (tmp_path / f"{out.name}.{child.pid}.tmp").exists()  # the child's, still being written: left alone
        (tmp_path / "go").touch()
        assert child.wait(60) == 0, child.stderr.read()
    finally:
        child.kill()
        child.wait()
    assert made.read_text() == "child"  # the last one in place, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Q4_0.gguf", "go", "ready"]  # nothing else left


def test_what_a_killed_writer_left_is_cleared_and_a_running_ones_kept(tmp_path):
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, running = gone.stdout.strip(), os.getppid()
    out = tmp_path / "reference-F32.gguf"
    for name in (f"{dead}.tmp", f"{dead}.old", f"{running}.tmp", "copy.tmp"):
        (tmp_path / f"{out.name}.{name}").write_text("half")
    (tmp_path / f"{out.name}.tmp").mkdir()  # an earlier version's one name, a folder
    with staged(out) as tmp:
        tmp.write_text("whole")
    # a living writer's kept, and a file of another name
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name, f"{out.name}.{running}.tmp", f"{out.name}.copy.tmp"]


@contextlib.contextmanager
def ctrl_c_once_there(path):
    """A Ctrl-C sent to this process (Python's handler: a script's, a notebook kernel's) as soon as ``path``
    exists, from a thread, unless the block ends first. Yields the list that gets the file's size then."""
    sent, done, main = [], threading.Event(), threading.main_thread().ident

    def watch():
        while not path.exists() and not done.is_set():
            time.sleep(0.002)
        if not done.is_set():
            sent.append(path.stat().st_size)
            signal.pthread_kill(main, signal.SIGINT)  # as a terminal's Ctrl-C reaches the main thread

    with ctrl_c_raises():
        t = threading.Thread(target=watch)
        t.start()
        try:
            yield sent
        finally:
            done.set()
            t.join()


def test_a_ctrl_c_while_a_reference_gguf_is_written_leaves_no_half_file(model, tmp_path):
    """write_reference writes its .tmp tensor by tensor (gguf's writer, Python): a Ctrl-C sent once the file is
    there lands in the middle of it; before, the half file stayed beside the ladder in the lab home."""
    from gguf import GGUFReader

    from lablib.model.reference import write_reference

    out = tmp_path / "F16.gguf"
    tmp = staging_path(out)
    with ctrl_c_once_there(tmp) as sent, pytest.raises(KeyboardInterrupt):
        write_reference(model.gguf_path, out, "F16")
        time.sleep(5)  # a write that ended before the Ctrl-C: it lands here (the test fails below)
    assert sent, "write_reference never wrote its .tmp"
    assert not tmp.exists() and not out.exists()
    assert write_reference(model.gguf_path, out, "F16") == out and not tmp.exists()
    assert len(GGUFReader(out).tensors) == len(GGUFReader(model.gguf_path).tensors)  # whole this time


def test_a_ctrl_c_during_a_real_quantization_is_not_lost(model, tmp_path):
    """llama.cpp's quantizer is one C call that logs each tensor through a Python callback: a Ctrl-C (a script's
    or a notebook kernel's handler) is raised in that callback, where Python can only print it, and was lost: the
    quantization, and the ladder after it, ran on. Now it is sent again until it lands, at the latest as the call
    returns; no .tmp is left, and a file in place is whole."""
    from gguf import GGUFReader

    from lablib.studies.quant import quantize_file

    src, out = model.gguf_path, tmp_path / "Q8_0.gguf"
    tmp = staging_path(out)
    with ctrl_c_once_there(tmp) as sent, pytest.raises(KeyboardInterrupt):
        quantize_file(src, out, "Q8_0")
        time.sleep(5)  # where an interrupt sent again after the call's end lands; a lost one never does
    assert sent, "the quantizer never wrote its .tmp"
    assert not tmp.exists()
    if out.exists():  # the Ctrl-C landed after the last tensor: the file was complete and kept
        assert len(GGUFReader(out).tensors) == len(GGUFReader(src).tensors)


def test_a_ctrl_c_during_a_merge_leaves_no_half_file_to_refuse_the_next(tmp_path):
    """lablib merge writes a new file and refuses one that exists: a merge stopped half way used to leave its
    half file under the name asked for, and the next merge refused it ("exists"). Now the half file is removed."""
    from lablib.results.store import merge_results

    rows = tmp_path / "a.jsonl"
    line = '{{"engine": "llama.cpp", "model": "m", "ttft_s": {}, "tpot_s": 0.01, "decode_tps": 100.0}}\n'
    rows.write_text("".join(line.format(i / 1e6) for i in range(100_000)))  # 100,000 different rows
    out = tmp_path / "room.jsonl"
    tmp = staging_path(out)
    with ctrl_c_once_there(tmp) as sent, pytest.raises(KeyboardInterrupt):
        merge_results([rows], out)
        time.sleep(5)  # a merge that ended before the Ctrl-C: it lands here (the test fails below)
    assert sent and not tmp.exists() and not out.exists()
    assert len(merge_results([rows], out)) == 100_000 and len(out.read_text().splitlines()) == 100_000
