"""How far llama.cpp's first-token logits move when a prompt is prefilled beside others, per weight format, with
flash attention off (llama-cpp-python's default) or on (lab 04, worked example 5: the same prompt, another answer
under load).

For each GGUF file: the eight questions of :data:`lablib.studies.batch_invariance.QUESTIONS` through llama.cpp's
continuous batching (:func:`lablib.measure.closed_loop.run_closed_loop`, mode ``batched``) at 1, 2, 4 and 8
concurrent sequences, one output token each, and the logits each prompt's first token was sampled from
(``llama_get_logits_ith`` of its batch entry, read where the session samples). Printed: max |logit(C) - logit(1)|
per prompt, in the questions' order (0: bitwise the same as through the batched path alone).

Files: the shipped model, and what llama.cpp's own quantizer makes of it (into ``--out``): ``F32`` and ``F16``
(products in float: activations as they are, or rounded to f16) and ``Q4_1-head`` (the shipped type with the
tied output head in Q4_1 instead of Q8_0). The quantized products quantize each activation block to 8 bits
first (Q8_1 for Q4_1, Q8_0 for Q8_0), so a last-bit difference that crosses a rounding step moves a value by a
whole step.

    python benchmarks/batch_logits.py [--out /tmp/batch_logits] [--files a.gguf b.gguf ...] [--flash-attn]

Measured on the 2-core Intel Xeon (AVX-512, AMX; llama-cpp-python 0.3.36), 2026-12-07:

    file        C  max|dlogit| per prompt (the eight questions in order)
    shipped     2  0 0 0 0 0 0 0 0
    shipped     4  0 0 0 0 0 0.71 0 0
    shipped     8  0.52 0 0.54 0 0 0.71 0 0
    Q4_1-head   2  0 0 0 0 0 0 0 0
    Q4_1-head   4  0 0 0 0 0.52 0 0 0
    Q4_1-head   8  0.62 0.66 0.24 0.48 0.52 0 0 0
    F16         2  0 0 1.7e-05 1.6e-05 0.02 0 0 0
    F16         4  0 0.0014 1.7e-05 1.6e-05 0.023 0.018 0 0
    F16         8  0.023 0.019 0.03 0.013 0.022 0.018 0 0
    F32         2  0 0 1.8e-05 2e-05 0.0055 0 0 0
    F32         4  0 2.6e-05 1.8e-05 2e-05 0.006 0.0069 0 0
    F32         8  0.014 0.012 0.0082 0.0056 0.0049 0.0069 0 0

In float, the logits moved by rounding (at most 0.03); with 8-bit activations they stayed bitwise the same or moved
by 0.24 to 0.71, a whole rounding step carried through 30 layers.

With ``--flash-attn`` (llama.cpp's fused attention, llama-server's choice on the CPU), same machine and day: the
shipped and Q4_1-head files bitwise the same at 2, 4 and 8 for every prompt; F16 at most 0.014, F32 at most 0.01
(their float products still change shape with the batch):

    F16         2  0 0 0.00025 2e-05 0.014 0 0 0
    F16         8  0 7e-05 0.00025 2e-05 0 0 0 0
    F32         2  0 0 1.9e-05 1.8e-05 0.01 0 0 0
    F32         8  0 1.9e-05 1.9e-05 1.8e-05 0 0 0 0
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import lablib
from lablib.engines.base import GenerationConfig
from lablib.measure.closed_loop import run_closed_loop
from lablib.studies.batch_invariance import prompt_ids
from lablib.studies.quant import quantize_file

LEVELS = (1, 2, 4, 8)


def first_logits(path, ids: list[list[int]], flash_attn: bool = False) -> dict[int, list[np.ndarray]]:
    """{concurrency: each prompt's first-token logits (float32 copies), in prompt order}."""
    e = lablib.load_engine(
        "llama.cpp", str(path), n_seq_max=max(LEVELS), n_ctx=max(LEVELS) * 256, flash_attn=flash_attn
    )
    lib, captured = e._lib, []
    n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(e.llm.model))
    sample = e._sample

    def keeping(smpl, cfg, i):  # the row the session samples from, copied before it samples
        row = lib.llama_get_logits_ith(e.ctx, i)
        captured.append(np.ctypeslib.as_array(row, shape=(n_vocab,)).copy())
        return sample(smpl, cfg, i)

    e._sample = keeping
    out = {}
    try:
        for c in LEVELS:
            captured.clear()
            run = run_closed_loop(e, ids, c, "batched", GenerationConfig(max_new_tokens=1))
            # one token per request: sampled in the order of their first tokens (within one step, admission order)
            order = sorted(run.traces, key=lambda t: (t.t_tokens[0], t.request_index))
            logits = [None] * len(ids)
            for t, row in zip(order, captured):
                logits[t.request_index] = row
            out[c] = logits
    finally:
        e.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out", default=None, help="folder for the F32, F16 and Q4_1-head files (default: a temporary one)"
    )
    ap.add_argument("--files", nargs="*", help="GGUF files to measure instead of the four")
    ap.add_argument(
        "--flash-attn", action="store_true", help="llama.cpp's fused attention (llama-server's choice on the CPU)"
    )
    a = ap.parse_args()
    model = lablib.prepare()
    ids, _ = prompt_ids(model, None)
    if a.files:
        files = {Path(f).name: Path(f) for f in a.files}
    else:
        out = Path(a.out or tempfile.mkdtemp(prefix="batch_logits_"))
        out.mkdir(parents=True, exist_ok=True)
        files = {"shipped": Path(model.gguf_path)}
        import llama_cpp

        from lablib.studies.quant import known_types

        head = out / "Q4_1-head.gguf"
        if not head.is_file():
            p = llama_cpp.llama_model_quantize_default_params()
            p.ftype, p.allow_requantize, p.token_embedding_type = known_types()["Q4_1"], True, llama_cpp.GGML_TYPE_Q4_1
            if llama_cpp.llama_model_quantize(str(model.gguf_path).encode(), str(head).encode(), p) != 0:
                raise SystemExit(f"llama.cpp's quantizer failed to write {head}")
        files["Q4_1-head"] = head
        for t in ("F16", "F32"):
            f = out / f"{t}.gguf"
            if not f.is_file():
                quantize_file(model.gguf_path, f, t)
            files[t] = f
    for name, path in files.items():
        logits = first_logits(path, ids, a.flash_attn)
        for c in LEVELS[1:]:
            d = [float(np.max(np.abs(x - y))) for x, y in zip(logits[1], logits[c])]
            print(f"{name:<12} C={c}  max|dlogit| per prompt: {' '.join(f'{v:.2g}' for v in d)}", flush=True)


if __name__ == "__main__":
    main()
