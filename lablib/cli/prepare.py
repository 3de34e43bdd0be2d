"""`lablib prepare [MODEL]`: resolve a model and derive its GGUF/HF/MLX formats (cached)."""

from __future__ import annotations

import time

from lablib.model.formats import FORMATS
from lablib.model.resolve import prepare

HELP = "resolve a model and derive its GGUF/HF/MLX formats (cached)"


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, help="GGUF file, HF or MLX folder, hub id (default: SmolLM2-135M)")


def run(ns) -> int:
    t0 = time.perf_counter()
    rm = prepare(ns.model)
    dt = time.perf_counter() - t0
    print(
        f"{rm.name}: {rm.source_format}, {rm.architecture}, {rm.parameters / 1e6:.1f}M parameters, "
        f"{rm.quantization}, sha256 {rm.sha256[:16]}"
    )
    for fmt in FORMATS:
        print(f"  {fmt:<5} {getattr(rm, f'{fmt}_path') or '-'}")
    how = "nothing to derive" if not rm.derived else f"derived: {rm.derived}" if dt > 2 else "cached"
    print(f"ready in {dt:.2f} s ({how})")
    return 0
