"""Peak memory of one engine-vs-model comparison (lablib.studies.compare) at a given prompt length.

Each run is a fresh child process (so one run's pages never count for another); the
table gives its peak resident set (``ru_maxrss`` of the child, MiB) and wall time.

    .venv/bin/python benchmarks/compare_memory.py [--tokens 2048 ...] [--engines transformers llama.cpp mlx]

Measured (2 shared CPU cores, 24 GiB, three engines, 2,048 tokens, 8 generated): before the logit
checks streamed, peak RSS at least 9,897 MiB (the run was stopped unfinished after 56 min); streamed
in blocks of 64 positions, 2,712 MiB (31.5 min under the machine's load), most of it the three
engines' weights and runtimes held at once.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

CHILD = """
import sys
from lablib.studies import compare as cmp
from lablib.model.resolve import prepare
from lablib.measure.workload import prompt_of_length
m = prepare(log=lambda *a: None)
ids = prompt_of_length(m, {tokens})
r = cmp.compare(m, engines={engines!r}, ids=ids, max_new_tokens={new})
print(r.verdict["layer"], file=sys.stderr)
"""


def peak_rss_mib(tokens: int, engines: list[str], new: int) -> tuple[float, float, int]:
    """(peak RSS MiB, wall s, exit status) of one compare in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    rc = subprocess.run([sys.executable, "-c", CHILD.format(tokens=tokens, engines=engines, new=new)]).returncode
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB, the largest child so far
    if peak <= before:
        print(f"note: {tokens} tokens peaked below an earlier run; run one length per call for exact figures")
    return peak / 1024, wall, rc


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[2048])
    p.add_argument("--engines", nargs="+", default=["transformers", "llama.cpp", "mlx"])
    p.add_argument("--max-new-tokens", type=int, default=8)
    a = p.parse_args(argv)
    print(f"{'tokens':>7} {'peak RSS MiB':>13} {'wall s':>7} rc")
    for n in a.tokens:
        mib, wall, rc = peak_rss_mib(n, a.engines, a.max_new_tokens)
        print(f"{n:>7} {mib:>13.0f} {wall:>7.1f} {rc}")


if __name__ == "__main__":
    main()
