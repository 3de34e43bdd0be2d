"""`lablib merge FILE... --out ALL`: results files of several machines combined into one."""

from __future__ import annotations

from lablib.results.store import merge_results
from lablib.results.tables import machine_names, shared_hostnames

HELP = "combine results files (several machines) into one"


def add_arguments(p) -> None:
    p.add_argument("files", nargs="+")
    p.add_argument("--out", required=True, help=".jsonl or .parquet")
    p.add_argument(
        "--one-clock",
        action="store_true",
        help="one run from several client machines (lablib bench --start-at): their rows on the Unix time line",
    )


def run(ns) -> int:
    df = merge_results(ns.files, ns.out, one_clock=ns.one_clock)
    machines = sorted(set(machine_names(df))) if "hostname" in df else []
    print(f"{len(df)} rows from {len(ns.files)} file(s), {len(machines)} machine(s) {machines} -> {ns.out}")
    for host, names in shared_hostnames(df).items():  # by machine_id, else by file (lablib.results.tables)
        print(f"  {len(names)} machines share the hostname {host!r}; the report names them {names}")
    return 0
