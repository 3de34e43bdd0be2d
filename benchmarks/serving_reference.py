"""Lab 05's rate sweep in full, on this machine, kept as a reference the lab draws beside a learner's quick run.

The three servers of lab 05 (llama-cpp-python's one slot, llama-server's four, vLLM's two sequences, one thread
each, as the notebook starts them) under lab 05's full Poisson sweep (``BUDGETS["serving"]`` without quick mode:
12 requests at each of 0.25, 0.5, 1, 2 and 4 requests/s, the lab's TTFT and TPOT targets). Writes one row per
(server, rate), each with this machine's identity (hostname, CPU model, cores, RAM) and the sweep's settings, to
``data/reference/serving-rates-<machine>.jsonl`` (or ``--out``), and prints the table (the machine should be quiet:
the shipped file was measured while the test suite ran beside it)::

    python benchmarks/serving_reference.py [--machine ci-2cpu-intel-xeon] [--out FILE]

About 15 minutes on two cores (vLLM's start included); needs vLLM's environment (``make vllm``).
"""

from __future__ import annotations

import argparse
import json
import re

import lablib
from lablib.build.llama import llama_tool
from lablib.config import data_dir
from lablib.engines.servers import start_server
from lablib.machine.identity import hardware_info
from lablib.studies import serving


def machine_name(hw: dict) -> str:
    """A file-name tag for this machine: ``ci-<cores>cpu-<amd-epyc|intel-xeon|the CPU model>``."""
    cpu = (hw.get("cpu_model") or "cpu").lower()
    kind = "amd-epyc" if "epyc" in cpu else "intel-xeon" if "xeon" in cpu else re.sub(r"[^a-z0-9]+", "-", cpu)[:24]
    return f"ci-{hw.get('cores_logical')}cpu-{kind.strip('-')}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default=None, help="the machine's name in the file name (default: cores and CPU)")
    ap.add_argument("--out", default=None, help="default: data/reference/serving-rates-<machine>.jsonl")
    args = ap.parse_args()
    model = lablib.prepare()
    d = serving.quick_defaults(quick=False)
    llama_tool("llama-server")
    servers = [start_server("llama-cpp-python", model, threads=1)]
    try:
        servers.append(start_server("llama-server", model, parallel=4, threads=1))
        servers.append(
            start_server("vllm", model, parallel=serving.VLLM_PARALLEL, n_ctx=serving.VLLM_N_CTX, threads=1, log=print)
        )
        table = serving.rate_sweep_table(
            servers,
            model,
            d["rates"],
            d["requests"],
            d["prompt_tokens"],
            d["max_new_tokens"],
            ttft_s=d["ttft_s"],
            tpot_s=d["tpot_s"],
        )
    finally:
        for s in servers:
            s.stop()
    hw = hardware_info()
    machine = {k: hw.get(k) for k in ("hostname", "cpu_model", "cores_logical", "ram_bytes")}
    sweep = {k: d[k] for k in ("requests", "prompt_tokens", "max_new_tokens", "ttft_s", "tpot_s")}
    out = args.out or data_dir() / "reference" / f"serving-rates-{args.machine or machine_name(hw)}.jsonl"
    with open(out, "w") as f:
        for row in table.to_dict("records"):
            f.write(json.dumps({**row, **sweep, **machine, "lablib_version": lablib.__version__}, default=str) + "\n")
    print(table.to_string())
    print(f"\n{len(table)} rows in {out}")


if __name__ == "__main__":
    main()
