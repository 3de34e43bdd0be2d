"""`lablib quantize` and `lablib quality`: the quantization ladder without a notebook.

    lablib quantize [--types Q8_0,Q4_K_M,...] [--model M] [--out FILE] [--no-speed] [--no-measure]
    lablib quality --engine E [--model M] [--variant V] [--base M] --out FILE [--no-speed]

Every figure is relative to the F32 reference of the source model (for the default model: the
dequantized Q4_1, see lablib.studies.quant).
"""

from __future__ import annotations


def cmd_quantize(ns) -> int:
    from lablib.studies import quant
    from lablib.studies.ladder import format_row, run_ladder
    from lablib.results.store import _suffix

    types = quant.parse_types(ns.types) if ns.types else None  # refuse unknown types before any work
    if ns.out:
        _suffix(ns.out)
    if ns.no_measure:
        for rec in quant.quantize_ladder(types or quant.LADDER, model=ns.model):
            print(
                f"type={rec['type']} bytes={rec['bytes']} bpw={rec['bpw']:.2f} "
                f"mix=[{quant.type_mix(rec['types'])}] {'cached' if rec['cached'] else 'made'} {rec['path']}"
            )
        return 0
    rows = run_ladder(
        types, model=ns.model, out=ns.out, speed=not ns.no_speed, n_ctx=ns.n_ctx, n_chunks=ns.chunks, log=lambda m: None
    )
    for row in rows:
        print(format_row(row) + (f" mix=[{row['type_mix']}]" if row.get("type_mix") else ""))
    if ns.out:
        print(f"{len(rows)} rows appended to {ns.out}")
    return 0


def cmd_quality(ns) -> int:
    import sys

    from lablib.studies.ladder import format_row, measure_one
    from lablib.results.store import _suffix

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
        format_row(row) + f" kl_p99={row['kl_p99']:.5f} kl_max={row['kl_max']:.5f} "
        f"dp_top_abs_mean={row['dp_top_abs_mean']:.4f} n_tokens={row['n_tokens']}"
    )
    print(f"1 row appended to {ns.out}")
    return 0


def add_parsers(sub) -> None:
    q = sub.add_parser(
        "quantize",
        help="quantize with llama.cpp's quantizer and measure each rung (size, quality vs the F32 reference, speed)",
    )
    q.add_argument(
        "--types",
        default=None,
        help="comma-separated llama.cpp types (default: the whole ladder, or a short one in quick mode)",
    )
    q.add_argument("--model", default=None, help="source model (default: SmolLM2-135M Q4_1 GGUF)")
    q.add_argument("--out", default=None, help="results file, .jsonl or .parquet (appended per rung)")
    q.add_argument("--no-speed", action="store_true", help="quality only")
    q.add_argument("--no-measure", action="store_true", help="only make the files and print their facts")
    q.add_argument("--n-ctx", type=int, default=None, help="perplexity chunk length, tokens")
    q.add_argument("--chunks", type=int, default=None, help="perplexity chunks of the shipped prose")
    q.set_defaults(func=cmd_quantize)

    m = sub.add_parser("quality", help="quality (and speed) of one engine/model against the F32 reference")
    m.add_argument("--engine", required=True, help="llama.cpp, transformers or mlx")
    m.add_argument("--model", default=None, help="llama.cpp: a GGUF file; others: the model (default: SmolLM2)")
    m.add_argument(
        "--variant",
        default=None,
        help="llama.cpp: a quantization type (a ladder rung); "
        "transformers: float32|bfloat16|float16; mlx: float32|8bit|4bit",
    )
    m.add_argument("--base", default=None, help="the model whose F32 reference is used (default: the default model)")
    m.add_argument("--out", required=True, help="results file, .jsonl or .parquet (appended)")
    m.add_argument("--no-speed", action="store_true", help="quality only")
    m.add_argument("--n-ctx", type=int, default=None)
    m.add_argument("--chunks", type=int, default=None)
    m.set_defaults(func=cmd_quality)
