"""The llama.cpp build's expensive checks, each run once per test session and shared by the tests
that judge it: the CPU probe once per CPU (this machine's, or a QEMU model emulated by qemu-user),
the smoke test once per wheel (by its contents) and CPU.

Each is the real function of :mod:`lablib.build.llama` on the real programs, the real wheel and the
real model, called with the same arguments a test would pass; only a second test asking the same
question gets the first answer instead of another run (a smoke test under qemu-user takes minutes
on two cores). Results are handed out as copies, so no test can change another's. A call that
raises is not kept: the next test asking runs it again and sees the error itself.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
from pathlib import Path

from lablib.build import llama as llama_build


@functools.cache
def emulator(cpu: str) -> tuple[str, ...]:
    """:func:`lablib.build.llama.emulator` of ``cpu`` (qemu-x86_64's CPU model), made and checked once."""
    return llama_build.emulator(cpu)


def runner(cpu: str | None) -> tuple[str, ...]:
    """The command prefix that runs a program on ``cpu`` (None: natively, on this machine)."""
    return emulator(cpu) if cpu else ()


@functools.cache
def _probe(cpu: str | None, cc: str | None, cxx: str | None) -> dict[str, bool]:
    return llama_build.probe_cpu_features(runner=runner(cpu))


def probe(cpu: str | None = None) -> dict[str, bool]:
    """:func:`lablib.build.llama.probe_cpu_features` on this CPU (``cpu`` None) or under the
    emulation of the QEMU model ``cpu``: probed once per CPU and compilers (CC, CXX)."""
    return dict(_probe(cpu, os.environ.get("CC"), os.environ.get("CXX")))


@functools.cache
def _digest(path: Path, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wheel_key(wheel: Path) -> str:
    st = Path(wheel).stat()
    return _digest(Path(wheel).resolve(), st.st_size, st.st_mtime_ns)


@functools.cache
def _smoke(key: str, wheel: Path, model: Path, cpu: str | None, threads: int | None, timeout: float) -> dict:
    return llama_build.smoke_test(wheel, model, threads=threads, timeout=timeout, runner=runner(cpu))


def smoke(wheel: Path, model: Path, cpu: str | None = None, threads: int | None = None, timeout: float = 300) -> dict:
    """:func:`lablib.build.llama.smoke_test` of ``wheel`` on ``model``, natively (``cpu`` None) or
    on the emulated QEMU model ``cpu``: run once per wheel (its contents), model, CPU, threads
    and timeout in a test session; the verdict, as smoke_test returns it."""
    wheel, model = Path(wheel), Path(model)
    return copy.deepcopy(_smoke(_wheel_key(wheel), wheel.resolve(), model.resolve(), cpu, threads, timeout))
