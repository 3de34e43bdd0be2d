"""How long a learner waits for the first ``lablib prepare`` (empty lab home) and a second one.

Each run is the CLI as a user types it, in a fresh process: the cold run derives the Hugging
Face and MLX folders from the default GGUF into an empty ``LABLIB_HOME``; the warm run finds
them cached. Medians over ``--reps`` cold/warm pairs; prints one line::

    prepare_cold_s=X prepare_warm_s=Y

    python benchmarks/prepare.py [--reps 3]

The machine is shared and noisy: compare runs made together, not absolute times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LABLIB = Path(sys.executable).with_name("lablib")


def timed(home: str) -> float:
    t = time.perf_counter()
    subprocess.run([str(LABLIB), "prepare"], env=dict(os.environ, LABLIB_HOME=home), check=True, capture_output=True)
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    cold, warm = [], []
    for _ in range(args.reps):
        home = tempfile.mkdtemp(prefix="lablib-prepare-")
        try:
            cold.append(timed(home))
            warm.append(timed(home))
        finally:
            shutil.rmtree(home, ignore_errors=True)
    print(f"prepare_cold_s={statistics.median(cold):.2f} prepare_warm_s={statistics.median(warm):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
