"""`lablib quantize`: the quantization ladder without a notebook.

    lablib quantize [--types Q8_0,Q4_K_M,...] [--model M] [--out FILE] [--no-speed] [--no-measure]

Every figure is relative to the F32 reference of the source model (for the default model: the
dequantized Q4_1, see lablib.studies.quant).
"""

from __future__ import annotations

HELP = "quantize with llama.cpp's quantizer and measure each rung (size, quality vs the F32 reference, speed)"


def add_arguments(p) -> None:
    p.add_argument(
        "--types",
        default=None,
        help="comma-separated llama.cpp types (default: the whole ladder, or a short one in quick mode)",
    )
    p.add_argument("--model", default=None, help="source model (default: SmolLM2-135M Q4_1 GGUF)")
    p.add_argument("--out", default=None, help="results file, .jsonl or .parquet (appended per rung)")
    p.add_argument("--no-speed", action="store_true", help="quality only")
    p.add_argument("--no-measure", action="store_true", help="only make the files and print their facts")
    p.add_argument("--n-ctx", type=int, default=None, help="perplexity chunk length, tokens")
    p.add_argument("--chunks", type=int, default=None, help="perplexity chunks of the shipped prose")


def keywords(ns) -> dict:
    """The ladder's keywords that are not the flags' names, as the flags (:func:`lablib.cli.in_flags`)."""
    return {"n_chunks": "--chunks"}


def run(ns) -> int:
    from lablib.results.store import _suffix
    from lablib.studies import quant
    from lablib.studies.ladder import run_ladder
    from lablib.ui.text import ladder_line

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
        line = ladder_line(row) + (f" mix=[{row['type_mix']}]" if row.get("type_mix") else "")
        # the kernel prefill multiplied each type with (lablib.engines.ggml_kernels): why prefill_tps differ
        print(line + (f" kernels=[{row['matmul_kernels']}]" if row.get("matmul_kernels") else ""))
    if ns.out:
        print(f"{len(rows)} rows appended to {ns.out}")
    return 0
