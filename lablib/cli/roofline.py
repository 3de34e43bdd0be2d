"""`lablib roofline`: this machine's ceilings and each engine's last measured decode against its bound."""

from __future__ import annotations

import json

from lablib.engines import NAMES

OUT = "results/roofline.jsonl"  # under results/, where report() looks by default: measured once, read back after
HELP = "this machine's bandwidth and FLOP/s, each engine's decode against its bound"


def add_arguments(p) -> None:
    p.add_argument(
        "--results",
        nargs="*",
        default=None,
        help="results files (default: results/ and labs/results/ here; none: a quick measurement)",
    )
    p.add_argument(
        "--engines",
        default=None,
        help=f"comma-separated (default: those of {','.join(NAMES)} that can read the model; lablib doctor --model "
        "says which)",
    )
    p.add_argument("--model", default=None)
    p.add_argument("--refresh", action="store_true", help="measure the machine again (else the cached measurement)")
    p.add_argument(
        "--out",
        default=OUT,
        help=f"where the rows of engines measured now go, .jsonl or .parquet (default: {OUT}, which the next "
        "lablib roofline run here reads back; '' keeps none)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")


def run(ns) -> int:
    from lablib.studies.roofline import report

    out = report(results=ns.results, engines=ns.engines, model=ns.model, refresh=ns.refresh, out=ns.out or None)
    if ns.json:
        print(json.dumps(out, default=str))
        return 0
    m = out["machine"]
    rates = ", ".join(f"{k} {v:.0f} G/s" for k, v in m["gflops"].items())
    print(
        f"{m['cpu_model']}, {m['threads']} threads: bandwidth {m['bandwidth_gbps']:.1f} GB/s (read, best pass; STREAM copy "
        f"{m['copy_gbps']:.1f}, triad {m['triad_gbps']:.1f}), matmul {rates}"
    )
    for e, r in out["engines"].items():
        print(
            f"  {e:<13} decode {r['decode_tps']:.1f} tok/s of a {r['decode_bound_tps']:.1f} tok/s bound "
            f"({100 * r['fraction_of_bound']:.0f} %, bound by {r['bound_by']}), prompt {r['prompt_tokens']} tokens; "
            f"{r['source']}"
        )
        if r.get("launch_floor_ms") is not None:
            print(
                f"  {'':<13} launch floor {r['launch_floor_ms']:.2f} ms a step ({1e3 / r['launch_floor_ms']:.0f} tok/s at "
                "most, whatever the bandwidth: the model's skeleton decoded on the same device and threads)"
            )
        elif r.get("launch_floor_error"):
            print(f"  {'':<13} no launch floor: {r['launch_floor_error']}")
    for line in out["above_bound"]:
        print(line)
    return 0
