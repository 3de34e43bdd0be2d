"""What the lab may use of this machine: cgroup CPU quota and memory cap, threads, free memory.

Two kinds of test: cgroup trees written as the kernel lays them out (v1 and v2,
so both layouts are checked on any machine), and a real cgroup on this machine
when the test may create one (root with cgroup v1 or v2 writable, as in CI).
"""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from lablib import machine as hardware
from lablib.errors import LabError
from lablib.machine import limits
from lablib.machine.threads import default_threads

GIB = 2**30


def write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_cgroup_v2_caps_read_from_the_process_cgroup(tmp_path):
    fs, proc = tmp_path / "cgroup", tmp_path / "proc_cgroup"
    proc.write_text("0::/user.slice/session\n")
    write(
        fs,
        {
            "cgroup.controllers": "cpu memory\n",
            "user.slice/cpu.max": "max 100000\n",
            "user.slice/memory.max": f"{8 * GIB}\n",
            "user.slice/session/cpu.max": "150000 100000\n",
            "user.slice/session/memory.max": "max\n",
            "user.slice/session/memory.current": f"{GIB}\n",
            "user.slice/session/memory.stat": f"anon 1\nfile {GIB // 4}\ninactive_file 5\n",
        },
    )
    assert hardware.cpu_quota(str(fs), str(proc)) == 1.5
    assert hardware.memory_limit_bytes(str(fs), str(proc)) == 8 * GIB  # the parent's cap binds
    assert limits._working_set(fs / "user.slice" / "session") == GIB - GIB // 4
    # the parent's own working set counts against the parent's cap (its other children use memory too)
    write(fs, {"user.slice/memory.current": f"{7 * GIB}\n", "user.slice/memory.stat": "file 0\n"})
    assert hardware.memory_headroom_bytes(str(fs), str(proc)) == GIB


def test_cgroup_v1_caps_and_a_container_without_cgroup_namespace(tmp_path):
    """Docker on cgroup v1 shows the host's path in /proc/self/cgroup but mounts its own
    cgroup at the controller's root: the caps are read there."""
    fs, proc = tmp_path / "cgroup", tmp_path / "proc_cgroup"
    proc.write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    write(
        fs,
        {
            "cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
            "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            "memory/memory.limit_in_bytes": f"{2 * GIB}\n",
            "memory/memory.usage_in_bytes": f"{GIB // 2}\n",
            "memory/memory.stat": f"cache 9\ntotal_cache {GIB // 8}\ntotal_inactive_file 7\n",
        },
    )
    assert hardware.cpu_quota(str(fs), str(proc)) == 2.0
    assert hardware.memory_limit_bytes(str(fs), str(proc)) == 2 * GIB
    assert limits._working_set(fs / "memory") == GIB // 2 - GIB // 8
    assert hardware.memory_headroom_bytes(str(fs), str(proc)) == 2 * GIB - (GIB // 2 - GIB // 8)


def test_uncapped_cgroups_read_as_no_cap(tmp_path):
    fs, proc = tmp_path / "cgroup", tmp_path / "proc_cgroup"
    proc.write_text("5:memory:/\n2:cpu:/\n")
    write(
        fs,
        {
            "cpu/cpu.cfs_quota_us": "-1\n",
            "cpu/cpu.cfs_period_us": "100000\n",
            "memory/memory.limit_in_bytes": "9223372036854771712\n",
        },
    )
    assert hardware.cpu_quota(str(fs), str(proc)) is None
    assert hardware.memory_limit_bytes(str(fs), str(proc)) is None
    assert hardware.memory_headroom_bytes(str(fs), str(proc)) is None
    assert hardware.cpu_quota(str(fs), str(tmp_path / "missing")) is None


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5", "\u00b2", "100000"])
def test_lablib_threads_must_be_a_whole_number_up_to_four_per_cpu(monkeypatch, value):
    """'²' is a digit to str.isdigit but not to int(); 100000 threads crash llama.cpp and torch."""
    monkeypatch.setenv("LABLIB_THREADS", value)
    with pytest.raises(
        LabError,
        match=rf"LABLIB_THREADS='{value}'.*whole number of threads from 1 to "
        rf"{4 * os.cpu_count()}",
    ):
        default_threads()


def test_lablib_threads_overrides(monkeypatch):
    monkeypatch.setenv("LABLIB_THREADS", "3")
    assert default_threads() == 3


def test_default_threads_follow_the_affinity_mask():
    """A process pinned to one CPU gets one engine thread (a real child process)."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this OS")
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from lablib.machine.threads import default_threads; print(default_threads())"
    )
    env = {k: v for k, v in os.environ.items() if k != "LABLIB_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def _v1_cgroup(controller: str):
    base = Path(hardware.CGROUP_ROOT) / controller
    if not (base / "cgroup.procs").is_file() or not os.access(base, os.W_OK):
        return None
    path = base / f"lablib-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError:
        return None
    return path


def in_memory_cgroup(limit_bytes: int, argv: list[str], timeout: float = 600):
    """Run ``argv`` in a fresh cgroup v1 memory group capped at ``limit_bytes``: (CompletedProcess,
    OOM kills), or None when no group can be made here."""
    mem = _v1_cgroup("memory")
    if mem is None:
        return None
    try:
        (mem / "memory.limit_in_bytes").write_text(str(limit_bytes))
        env = {k: v for k, v in os.environ.items() if k != "LABLIB_THREADS"}
        p = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=lambda: (mem / "cgroup.procs").write_text(str(os.getpid())),
        )
        ooms = [ln for ln in (mem / "memory.oom_control").read_text().splitlines() if ln.startswith("oom_kill ")]
        return p, int(ooms[0].split()[1]) if ooms else 0
    finally:
        import time

        for _ in range(50):
            try:
                mem.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@pytest.mark.parametrize("engine", ["transformers", "llama.cpp"])
def test_an_engine_that_cannot_fit_a_memory_cap_is_refused_not_killed(engine):
    """Under a 450 MiB cap (real cgroup), `lablib run` refuses with the numbers instead of being
    OOM-killed. The lab's tokenizer (transformers, which imports torch) already holds about 300 MiB;
    transformers' float32 weights are 513 MiB; llama.cpp's 8192-token KV cache and logits buffers
    come to about 400 MiB with its weights."""
    ran = in_memory_cgroup(
        450 * 2**20, [sys.executable, "-m", "lablib.cli", "run", "--engine", engine, "--max-new-tokens", "2"]
    )
    if ran is None:
        pytest.skip("cannot create a cgroup v1 memory group here (needs root and cgroup v1)")
    p, ooms = ran
    assert (p.returncode, ooms) == (2, 0), p.stderr[-500:]
    assert f"memory: {engine} needs about" in p.stderr and "GiB is available" in p.stderr
    assert "Traceback" not in p.stderr


def test_a_real_binder_sized_cgroup_is_seen():
    """In a real cgroup v1 with 1 CPU of quota and a 2 GiB cap (Binder's size), the lab sees
    1.0 CPU, 2 GiB, 1 engine thread and at most 2 GiB free."""
    cpu, mem = _v1_cgroup("cpu"), _v1_cgroup("memory")
    try:
        if cpu is None or mem is None:
            pytest.skip("cannot create cgroup v1 cpu and memory groups here (needs root and cgroup v1)")
        (cpu / "cpu.cfs_period_us").write_text("100000")
        (cpu / "cpu.cfs_quota_us").write_text("100000")
        (mem / "memory.limit_in_bytes").write_text(str(2 * GIB))
        code = (
            "import os, sys\n"
            f"open('{cpu}/cgroup.procs', 'w').write(str(os.getpid()))\n"
            f"open('{mem}/cgroup.procs', 'w').write(str(os.getpid()))\n"
            "from lablib import machine as h\n"
            "from lablib.machine.threads import default_threads\n"
            "print(h.cpu_quota(), h.memory_limit_bytes(), default_threads(), h.available_ram_bytes())\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "LABLIB_THREADS"}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        quota, limit, threads, free = out.stdout.split()
        assert (float(quota), int(limit), int(threads)) == (1.0, 2 * GIB, 1)
        assert 0 < int(free) <= 2 * GIB
    finally:
        for group in (cpu, mem):
            if group is not None:
                for _ in range(50):  # the child has exited; its cgroup empties asynchronously
                    try:
                        group.rmdir()
                        break
                    except OSError:
                        import time

                        time.sleep(0.1)
