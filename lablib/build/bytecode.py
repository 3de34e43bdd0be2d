"""python -m lablib.build.bytecode: byte-compile the lab's environment once, on every core, at install time.

`make setup` and a wheelhouse's install.sh install with ``pip install --no-compile``: pip compiles the ~20,000
.py files of torch, transformers and the rest one after another (about two minutes on two cores). Leaving it
to "the first import" only works where Python may write its cache: with ``PYTHONDONTWRITEBYTECODE=1`` (common
in container images, and set on this project's CI machines) no ``__pycache__`` is ever written, and every
process that imports torch and transformers compiles some 2,000 files again, about 5 s on two cores (measured:
`lablib run --n-ctx=0` took 9.5 s to refuse its flag, 4.5 s once compiled; ``builtins.compile`` was 5.2 s of
it). The test suite starts hundreds of such processes, and so does a learner's day of kernels, servers and CLI
runs.

:func:`compile_environment` writes the caches explicitly (:mod:`compileall` writes them whatever
PYTHONDONTWRITEBYTECODE says) with one worker per core: 34 s for the lab's 19,500 files on two cores. Files
that do not compile on this Python (torch ships one written for 3.12) are skipped, as pip skips them.

Standard library only: it runs from the Makefile right after the installs.
"""

from __future__ import annotations

import argparse
import compileall
import sys
import sysconfig
import time
from pathlib import Path


def site_dirs() -> list[Path]:
    """This interpreter's site-packages folders (purelib, and platlib where it differs), those that exist."""
    paths = sysconfig.get_paths()
    seen: list[Path] = []
    for key in ("purelib", "platlib"):
        p = Path(paths[key])
        if p.is_dir() and p not in seen:
            seen.append(p)
    return seen


def compile_environment(dirs: list[Path] | None = None, workers: int = 0, log=print) -> float:
    """Byte-compile every .py under ``dirs`` (default :func:`site_dirs`) with ``workers`` processes (0: one
    per core). Returns the seconds it took. Files that fail to compile are skipped quietly (``quiet=2``);
    the return value of :func:`compileall.compile_dir` is ignored for them, as pip ignores them."""
    dirs = site_dirs() if dirs is None else dirs
    t0 = time.perf_counter()
    for d in dirs:
        compileall.compile_dir(str(d), quiet=2, workers=workers)
    took = time.perf_counter() - t0
    if log is not None:
        log(f"lablib.build.bytecode: byte-compiled {', '.join(map(str, dirs))} in {took:.0f} s")
    return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lablib.build.bytecode", description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", type=Path, help="folders to compile (default: this interpreter's site-packages)")
    ap.add_argument("--workers", type=int, default=0, help="processes (default 0: one per core)")
    args = ap.parse_args(argv)
    compile_environment(args.dirs or None, workers=args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
