"""What this process may use of the machine: CPUs and memory under container caps.

A container (mybinder.org, Docker, Kubernetes) caps CPU time and memory with Linux cgroups while
psutil and ``os.cpu_count`` still report the whole node: a Binder session sees 64 cores and
200 GB but may use 1 CPU and 2 GiB. :func:`cpu_quota` and :func:`memory_limit_bytes` read those
caps (cgroup v2 ``cpu.max`` / ``memory.max``; v1 ``cpu.cfs_quota_us`` / ``memory.limit_in_bytes``;
kernel docs: Documentation/admin-guide/cgroup-v2.rst and cgroup-v1/).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

# --- what this process may use: cgroup caps ------------------------------------------------
CGROUP_ROOT = "/sys/fs/cgroup"
_UNLIMITED = 2**60  # v1 writes "no limit" as a page-rounded 2**63 - 1


def _cgroup_dirs(controller: str, root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup") -> list[Path]:
    """Folders holding this process's ``controller`` settings, innermost first, up to the mount.

    Reads ``proc`` (lines ``id:controllers:path``; v2 is ``0::path``). v1 mounts a
    controller at ``root/<controller>`` (or a joint ``cpu,cpuacct``), v2 all at ``root``.
    A container without its own cgroup namespace shows the host's path, which
    is not under its mount: then the mount itself is the container's cgroup.
    """
    try:
        lines = Path(proc).read_text().splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        names = controllers.split(",") if controllers else []
        if controller in names:  # v1
            base = Path(root) / controllers
            base = base if base.is_dir() else Path(root) / controller
            mounts.append((base, path))
        elif not controllers:  # v2: the unified mount (under root/unified in a hybrid layout)
            for base in (Path(root), Path(root) / "unified"):
                if (base / "cgroup.controllers").is_file():
                    mounts.append((base, path))
                    break
    dirs = []
    for base, path in mounts:
        here = base / path.lstrip("/")
        if not here.is_dir():
            here = base
        if not here.is_dir():
            continue
        while True:
            dirs.append(here)
            if here == base:
                break
            here = here.parent
    return dirs


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_quota(root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup") -> float | None:
    """CPUs' worth of time this process may use (cgroup CFS quota / period), or None if uncapped.

    The tightest cap between the process's cgroup and its mount counts. 1.5 means
    one and a half CPUs of time per wall-clock second, whatever the core count.
    """
    quotas = []
    for d in _cgroup_dirs("cpu", root, proc):
        v2 = _read(d / "cpu.max")
        if v2:
            quota, _, period = v2.partition(" ")
        else:
            quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
        if quota and period and quota.lstrip("-").isdigit() and period.isdigit() and int(quota) > 0 < int(period):
            quotas.append(int(quota) / int(period))
    return min(quotas) if quotas else None


def _memory_limit(d: Path) -> int | None:
    raw = _read(d / "memory.max") or _read(d / "memory.limit_in_bytes")
    return int(raw) if raw and raw.isdigit() and int(raw) < _UNLIMITED else None


def _working_set(d: Path) -> int | None:
    """Usage minus file cache at cgroup folder ``d``, bytes: page cache (model files read, Python
    modules imported) is reclaimed before the cgroup's OOM killer runs, so only the rest is
    memory in use. (Docker subtracts only inactive file pages; a file read a moment ago, such as a
    model just hashed, is still active and would count as used.)"""
    usage = _read(d / "memory.current") or _read(d / "memory.usage_in_bytes")
    if not usage or not usage.isdigit():
        return None
    stat = dict(line.partition(" ")[::2] for line in (_read(d / "memory.stat") or "").splitlines())
    cache = next((stat[k] for k in ("file", "total_cache", "cache") if stat.get(k, "").isdigit()), "0")
    return max(int(usage) - int(cache), 0)


def memory_limit_bytes(root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup") -> int | None:
    """The cgroup memory cap on this process, bytes, or None if uncapped (tightest level counts)."""
    limits = [x for x in map(_memory_limit, _cgroup_dirs("memory", root, proc)) if x is not None]
    return min(limits) if limits else None


def memory_headroom_bytes(root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup") -> int | None:
    """Bytes this process may still allocate before a cgroup cap binds: the least, over the levels
    that have a cap, of cap minus the memory in use at that level (:func:`_working_set`); None when no
    level has a cap."""
    room = []
    for d in _cgroup_dirs("memory", root, proc):
        limit = _memory_limit(d)
        if limit is not None:
            room.append(max(limit - (_working_set(d) or 0), 0))
    return min(room) if room else None


def cpus_usable() -> int:
    """Whole CPUs this process can keep busy: the least of physical cores, CPUs in its affinity
    mask, and its cgroup quota rounded up (at least 1)."""
    import psutil

    counts = [psutil.cpu_count(logical=False) or os.cpu_count() or 1]
    if hasattr(os, "sched_getaffinity"):
        counts.append(len(os.sched_getaffinity(0)))
    quota = cpu_quota()
    if quota:
        counts.append(math.ceil(quota))
    return max(1, min(counts))


def available_ram_bytes() -> int:
    """Memory available to new allocations now, bytes: psutil's 'available', or less when a
    cgroup caps this process (its limit minus its working set)."""
    import psutil

    available = psutil.virtual_memory().available
    room = memory_headroom_bytes()
    return available if room is None else min(available, room)
