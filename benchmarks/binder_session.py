"""A Binder-sized session on this machine: each notebook under a 1-CPU, 2 GiB cgroup.

mybinder.org gives a session about 1 CPU and a 2 GiB memory cap (its pods'
limits), while the node reports all its cores and RAM. This script runs each
lab notebook headless the way a Binder session would (through ``binder/start``,
quick mode), in a fresh Linux cgroup with those caps, and prints per notebook:
exit status, wall time, the cgroup's peak memory (anonymous memory plus page
cache, which the kernel reclaims before it kills) and how many processes the
cgroup's OOM killer took. With ``--build`` it first runs ``binder/postBuild``
under the same memory cap (no CPU cap: Binder builds on a build node).

It needs root and cgroup v1 (cpu and memory controllers) or cgroup v2 with
both delegated; it is not a test (it takes minutes and changes cgroups).

    sudo python benchmarks/binder_session.py [--python VENV/bin/python] [--cpus 1] [--memory-gib 2]
                                             [--build] [labs/01_*.ipynb ...]

``--python`` names the environment that runs the notebooks (default: this
one); for a Binder rehearsal, make a fresh virtual environment from
``binder/requirements.txt`` and pass its python.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
CG = Path("/sys/fs/cgroup")


class Cgroup:
    """A fresh cgroup (v1: one per controller; v2: one folder) with a CPU quota and a memory cap."""

    def __init__(self, cpus: float | None, memory_bytes: int):
        name = f"lablib-binder-{uuid.uuid4().hex[:8]}"
        self.v2 = (CG / "cgroup.controllers").is_file()
        self.dirs = (
            {"cpu": CG / name, "memory": CG / name} if self.v2 else {c: CG / c / name for c in ("cpu", "memory")}
        )
        try:
            for d in {*self.dirs.values()}:
                d.mkdir()
            self._limit(cpus, memory_bytes)
        except OSError:
            self.remove()
            raise

    def _limit(self, cpus: float | None, memory_bytes: int) -> None:
        if self.v2:
            if cpus:
                (self.dirs["cpu"] / "cpu.max").write_text(f"{int(cpus * 100_000)} 100000")
            (self.dirs["memory"] / "memory.max").write_text(str(memory_bytes))
            (self.dirs["memory"] / "memory.swap.max").write_text("0")
        else:
            if cpus:
                (self.dirs["cpu"] / "cpu.cfs_period_us").write_text("100000")
                (self.dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(int(cpus * 100_000)))
            (self.dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
            swap = self.dirs["memory"] / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(memory_bytes))

    def join(self) -> None:
        """Move the calling process into the cgroup (used as a child's preexec_fn)."""
        for d in {*self.dirs.values()}:
            (d / "cgroup.procs").write_text(str(os.getpid()))

    def peak_bytes(self) -> int:
        d = self.dirs["memory"]
        f = d / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")
        return int(f.read_text()) if f.exists() else -1

    def oom_kills(self) -> int:
        d = self.dirs["memory"]
        text = (d / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self) -> None:
        for d in {*self.dirs.values()}:
            for _ in range(50):
                if not d.exists():
                    break
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def run_capped(cmd: list[str], cg: Cgroup, env: dict, cwd: Path, timeout: float) -> dict:
    """Run ``cmd`` inside ``cg`` (killed after ``timeout`` s). {rc, wall_s, tail: its last output lines}."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            cmd,
            cwd=cwd,
            env=env,
            preexec_fn=cg.join,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        rc, out = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", e.output or ""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
    return {"rc": rc, "wall_s": time.perf_counter() - t0, "tail": "\n".join(out.splitlines()[-15:])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", help="default: labs/0*.ipynb")
    ap.add_argument("--python", default=sys.executable, help="the environment that runs them")
    ap.add_argument("--cpus", type=float, default=1.0, help="CPU quota, CPUs (mybinder.org: about 1)")
    ap.add_argument("--memory-gib", type=float, default=2.0, help="memory cap, GiB (mybinder.org: 2)")
    ap.add_argument("--build", action="store_true", help="run binder/postBuild first, memory-capped")
    ap.add_argument("--timeout", type=float, default=1800, help="per step, seconds")
    ns = ap.parse_args(argv)
    if ns.cpus < 0.01 or ns.memory_gib < 0.25:
        ap.error(
            f"--cpus {ns.cpus:g} --memory-gib {ns.memory_gib:g}: expected at least 0.01 CPU and "
            "0.25 GiB (mybinder.org: 1 CPU, 2 GiB)"
        )

    py = Path(ns.python)
    env = dict(os.environ, PATH=f"{py.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("LABLIB_QUICK", None)  # binder/start sets it, as on Binder
    env.pop("LABLIB_THREADS", None)
    cap = int(ns.memory_gib * 2**30)
    rows = []
    if ns.build:
        cg = Cgroup(None, cap)
        try:
            r = run_capped(["bash", str(ROOT / "binder" / "postBuild")], cg, env, ROOT, ns.timeout)
            rows.append(("binder/postBuild", r, cg.peak_bytes(), cg.oom_kills()))
        finally:
            cg.remove()
    notebooks = ns.notebooks or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "labs").glob("0*.ipynb"))
    with tempfile.TemporaryDirectory() as tmp:
        for nb in notebooks:
            cg = Cgroup(ns.cpus, cap)
            try:
                out = Path(tmp) / Path(nb).name
                cmd = [
                    str(ROOT / "binder" / "start"),
                    str(py),
                    "-m",
                    "jupyter",
                    "execute",
                    "--timeout=-1",
                    f"--output={out}",
                    str(ROOT / nb),
                ]
                r = run_capped(cmd, cg, env, ROOT / "labs", ns.timeout)
                rows.append((nb, r, cg.peak_bytes(), cg.oom_kills()))
            finally:
                cg.remove()
            print(f"{nb}: rc={r['rc']} in {r['wall_s']:.0f} s", file=sys.stderr, flush=True)

    mib = 2**20
    print(
        f"\nBinder-sized session: {ns.cpus:g} CPU quota, {ns.memory_gib:g} GiB memory cap, "
        f"on {psutil.cpu_count(logical=False)} cores / {psutil.virtual_memory().total / 2**30:.1f} GiB"
    )
    print(
        "peak: the cgroup's high-water mark, anonymous memory plus page cache (file pages such as "
        "mmap'ed weights, which the kernel reclaims before it kills: a peak at the cap is not a failure; "
        "an OOM kill is)"
    )
    print(f"{'step':<40} {'rc':>7} {'wall_s':>7} {'peak_MiB':>9} {'oom_kills':>9}")
    for name, r, peak, ooms in rows:
        print(f"{name:<40} {r['rc']!s:>7} {r['wall_s']:>7.0f} {peak / mib:>9.0f} {ooms:>9}")
    failed = [(name, r) for name, r, _, _ in rows if r["rc"] != 0]
    for name, r in failed:
        print(f"\n--- {name} (rc {r['rc']}), last lines:\n{r['tail']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
