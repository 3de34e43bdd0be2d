"""benchmarks/gpu_kit.py (the GPU check's kit, carried to a GPU machine without network in two device calls) and
gpu_check.py's wait for a llama.cpp build started before it. The kit's whole run (prepare, start, check) is
rehearsed by hand on a CPU (its docstring says how); these hold its parts: the two calls' sizes, the model
joined from its parts, the checkout's travelling files, and the wait."""

import hashlib
import json
import subprocess
import threading
import time

import pytest

from benchmark_modules import load as _load

kit = _load("gpu_kit")
gpu_check = _load("gpu_check")
MiB = 2**20


def test_the_model_is_split_so_the_two_calls_carry_about_as_much():
    # the default GGUF's 98,362,432 bytes beside 8.9 MB of source and wheels, a 3.8 MiB checkout
    part1, part2 = kit.split_sizes(98_362_432, 8_900_000, 4 * MiB)
    assert part1 + part2 == 98_362_432
    assert part1 == (98_362_432 - 8_900_000) // 2
    assert abs((8_900_000 + part1) - part2) <= 1
    assert 4 * MiB + part2 <= kit.LIMIT - kit.MARGIN


def test_a_kit_that_cannot_fit_two_calls_says_the_sizes():
    with pytest.raises(ValueError) as e:
        kit.split_sizes(120 * MiB, 9 * MiB, 4 * MiB)
    assert str(e.value) == (
        "the kit does not fit two device calls: the checkout carries 4.0 MiB, kit a 64.5 MiB, kit b 64.5 MiB, "
        "and a call at most 64 MiB less 2 MiB: make the checkout smaller"
    )


def _kit_with_model(tmp_path, data: bytes, part1: int, recorded: str):
    work, kit_dir = tmp_path / "work", tmp_path / "kit"
    (work / "site" / kit.DEFAULT_MODEL_PACKAGE).mkdir(parents=True)
    (kit_dir / "b").mkdir(parents=True)
    (work / "model.part1").write_bytes(data[:part1])
    (kit_dir / "b" / "model.part2").write_bytes(data[part1:])
    (work / "kit.json").write_text(json.dumps({"gguf": "m.gguf", "gguf_sha256": recorded}))
    return kit_dir, work


def test_the_model_is_joined_from_its_parts_and_checked(tmp_path):
    data = bytes(range(256)) * 4099  # not a multiple of the copy's block
    kit_dir, work = _kit_with_model(tmp_path, data, 300_001, hashlib.sha256(data).hexdigest())
    path = kit.join_model(kit_dir, work)
    assert path == work / "site" / kit.DEFAULT_MODEL_PACKAGE / "m.gguf"
    assert path.read_bytes() == data
    assert not path.with_suffix(".partial").exists()


def test_parts_of_two_kits_are_refused_and_leave_no_model(tmp_path):
    data = b"GGUF" + bytes(1000)
    kit_dir, work = _kit_with_model(tmp_path, data, 500, hashlib.sha256(b"another kit").hexdigest())
    with pytest.raises(SystemExit) as e:
        kit.join_model(kit_dir, work)
    assert f"the joined m.gguf has SHA-256 {hashlib.sha256(data).hexdigest()}" in str(e.value)
    assert "run `prepare` again" in str(e.value)
    assert list((work / "site" / kit.DEFAULT_MODEL_PACKAGE).iterdir()) == []


def test_the_travelling_files_are_the_tracked_and_the_untracked_not_ignored(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("/.gpukit/\n")  # 10 bytes
    (tmp_path / "tracked.py").write_bytes(b"x" * 1000)
    git("add", ".gitignore", "tracked.py")
    (tmp_path / "untracked.txt").write_bytes(b"y" * 300)
    (tmp_path / ".gpukit").mkdir()
    (tmp_path / ".gpukit" / "model.part1").write_bytes(b"z" * 5000)  # carried by name, not with the tree
    assert kit.travelling_bytes(tmp_path) == 10 + 1000 + 300


def test_gpu_check_waits_for_a_build_started_before_it(tmp_path):
    (tmp_path / "llama-build.log").write_text("building\n")
    build = gpu_check.StartedBuild(tmp_path)
    threading.Timer(0.2, lambda: (tmp_path / "llama-build.rc").write_text("0\n")).start()
    assert build.wait(timeout=30) == 0
    assert build.returncode == 0
    assert build.log == tmp_path / "llama-build.log"


def test_gpu_check_names_a_build_that_failed_or_is_not_done_or_never_started(tmp_path):
    with pytest.raises(RuntimeError, match="no llama.cpp build was started here: .*llama-build.log is missing"):
        gpu_check.StartedBuild(tmp_path).wait(timeout=60)  # at once, not after the minute
    (tmp_path / "llama-build.log").write_text("building\n")
    (tmp_path / "llama-build.rc").write_text("2\n")
    assert gpu_check.StartedBuild(tmp_path).wait(timeout=1) == 2
    (tmp_path / "llama-build.rc").unlink()
    with pytest.raises(subprocess.TimeoutExpired):
        gpu_check.StartedBuild(tmp_path).wait(timeout=0.1)


def test_the_check_is_stopped_at_the_calls_deadline_children_and_all(tmp_path):
    """gpu_kit's check stops gpu_check.py before the device's limit of a call would end the call (and its files
    would not be packed): the whole process group, a benchmark script it started too."""
    import sys
    from pathlib import Path

    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen(['sleep', '120'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "p.wait()\n"
    )
    assert kit.run_until([sys.executable, "-c", script], deadline_s=3) == 124
    pid = int(pid_file.read_text())
    for _ in range(100):  # killed: gone, or a zombie until init reaps it
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the script's child {pid} outlived the deadline")
    assert kit.run_until([sys.executable, "-c", "raise SystemExit(3)"], deadline_s=60) == 3


def test_a_rerun_of_the_check_writes_its_own_table(tmp_path):
    path = tmp_path / "gpu-check.txt"
    gpu_check.Table(path).add("doctor", True, 3.2, "first run")
    gpu_check.Table(path).add("doctor", False, 1.0, "second run")
    assert path.read_text().splitlines() == [f"{'doctor':<12} {'FAILED':<7} {1:>5} s  second run"]


def test_a_check_on_a_fresh_machine_says_so_and_what_to_do(tmp_path):
    with pytest.raises(SystemExit) as e:
        kit.check(tmp_path / "kit", tmp_path / "work", None, [])
    assert str(e.value).startswith(f"gpu_kit: {tmp_path / 'work'} holds no kit: this is a fresh machine")
    assert str(e.value).endswith("run `start` (carry .gpukit/a), then `check` at once")


def test_the_real_cmake_and_ninja_come_first_on_the_builds_path(tmp_path, monkeypatch):
    """pip's cmake and ninja packages put Python scripts in a venv's bin/ that fail inside pip's isolated build
    environment; the folders of their real programs go first on PATH, and scikit-build-core is told which cmake."""
    import sys
    import types

    real = tmp_path / "cmake-data" / "bin"
    real.mkdir(parents=True)
    (real / "cmake").write_text("#!/bin/sh\n")
    (real / "cmake").chmod(0o755)
    monkeypatch.setitem(sys.modules, "cmake", types.SimpleNamespace(CMAKE_BIN_DIR=str(real)))
    monkeypatch.setitem(sys.modules, "ninja", types.SimpleNamespace(BIN_DIR=str(tmp_path / "no-such-folder")))
    env = kit.kit_env(tmp_path / "work")
    assert env["PATH"].split(":")[0] == str(real)
    assert env["CMAKE_EXECUTABLE"] == str(real / "cmake")
    assert env["PIP_NO_INDEX"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert int(env["CMAKE_BUILD_PARALLEL_LEVEL"]) == max(1, kit.cores() - 2)
