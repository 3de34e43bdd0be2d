"""`lablib quality --engine E ...`: quality (and speed) of one engine/model against the F32 reference.

lablib quality --engine E [--model M] [--variant V] [--base M] --out FILE [--no-speed]
"""

from __future__ import annotations

HELP = "quality (and speed) of one engine/model against the F32 reference"


def add_arguments(p) -> None:
    p.add_argument("--engine", required=True, help="llama.cpp, transformers or mlx")
    p.add_argument("--model", default=None, help="llama.cpp: a GGUF file; others: the model (default: SmolLM2)")
    p.add_argument(
        "--variant",
        default=None,
        help="llama.cpp: a quantization type (a ladder rung); "
        "transformers: float32|bfloat16|float16; mlx: float32|8bit|4bit",
    )
    p.add_argument("--base", default=None, help="the model whose F32 reference is used (default: the default model)")
    p.add_argument("--out", required=True, help="results file, .jsonl or .parquet (appended)")
    p.add_argument("--no-speed", action="store_true", help="quality only")
    p.add_argument("--n-ctx", type=int, default=None)
    p.add_argument("--chunks", type=int, default=None)


def keywords(ns) -> dict:
    """The ladder's keywords that are not the flags' names, as the flags (:func:`lablib.cli.in_flags`)."""
    return {"n_chunks": "--chunks"}


def run(ns) -> int:
    import sys

    from lablib.results.store import _suffix
    from lablib.studies.ladder import measure_one
    from lablib.ui.text import ladder_line

    _suffix(ns.out)
    row = measure_one(
        ns.engine,
        model=ns.model,
        variant=ns.variant,
        base=ns.base,
        speed=not ns.no_speed,
        out=ns.out,
        n_ctx=ns.n_ctx,
        n_chunks=ns.chunks,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(
        ladder_line(row) + f" kl_p99={row['kl_p99']:.5f} kl_max={row['kl_max']:.5f} "
        f"dp_top_abs_mean={row['dp_top_abs_mean']:.4f} n_tokens={row['n_tokens']}"
    )
    print(f"1 row appended to {ns.out}")
    return 0
