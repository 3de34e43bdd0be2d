"""Which sum changed under load: one prompt alone, prefilled in the pieces llama.cpp cuts it into when prompts are
admitted together, against the same prompt prefilled whole (lab 04, worked example 5).

With one KV stream per sequence, llama.cpp's ``split_equal`` prefills the prompts admitted in one step in pieces as
long as the shortest one's remaining tokens (:func:`lablib.studies.batch_invariance.prefill_pieces`). For the eight
:data:`lablib.studies.batch_invariance.QUESTIONS` in the groups a closed loop of C clients admits them in (C at a
time, every answer the same length), this prefills each question **alone** in its pieces (one ``llama_decode`` a
piece, through llama-cpp-python's ``Llama.eval``) and prints max |logit - logit(whole)| of its last position, in the
table's layout of ``benchmarks/batch_logits.py`` (which reads the same logits from the batched run itself), then the
pieces.

    python benchmarks/prefill_pieces.py [--model PATH] [--flash-attn]

Measured on the 2-core Intel Xeon (AVX-512, AMX; llama-cpp-python 0.3.36), the shipped Q4_1 file, 2026-12-08::

    C=2: 0  0  0  0  0  0  0  0
          pieces: 37,5 | 37 | 37 | 37 | 35,1 | 35 | 34 | 34,6
    C=4: 0  0  0  0  0  0.71  0  0
          pieces: 37,5 | 37 | 37 | 37 | 34,1,1 | 34,1 | 34 | 34,1,1,4
    C=8: 0.52  0  0.54  0  0  0.71  0  0
          pieces: 34,1,1,1,3,2 | 34,1,1,1 | 34,1,1,1 | 34,1,1,1 | 34,1,1 | 34,1 | 34 | 34,1,1,1,3

Every number equals ``batch_logits.py``'s for the shipped file at the same C and question (0.71 = 0.708601 to the
printed digits): the other sequences of the batch change nothing but where each prompt is cut. A piece of one token
takes the row-by-row dot product for attention's two products (K times Q, V times the softmax), a piece of two or
more llamafile's tinyBLAS (sgemm.cpp: ``if (n < 2) return false``). Pieces of one token do not always move a logit:
q1, q3, q4 and q7 at C=8 had them and stayed bitwise the same. With ``--flash-attn``, every cell is 0.

Cuts of one prompt alone, same machine ("How do airplanes fly?", 35 tokens; max |dlogit|, flash attention off):
pieces of 1, 2, 3, 5, 8, 16 tokens (``n_batch``) 0.91, 0.71, 0, 0, 0, 0; a cut after token 1, 2, 10 or 33: 0; after
token 34 (the last token alone): 0.71; after 17 and 18: 0.24. With flash attention on: 0 for all. Flash attention
computes each query row alone only for pieces under 64 tokens (``GGML_FA_TILE_Q``; 64 or more take a tiled kernel):
a 100-token prompt of the lab's prose prefilled whole against pieces of 1, 2, 32, 63, 64, 65, 99 tokens moved by
0.60, 0.60, 0.60, 0.60, 0.56, 0.46, 0.43 with flash attention on, and by 0.89, 0, 0, 0, 0, 0, 0 with it off.
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF file (default: the shipped model)")
    ap.add_argument("--flash-attn", action="store_true", help="llama.cpp's fused attention (llama-server's choice)")
    args = ap.parse_args()

    import llama_cpp

    from lablib.model import prepare
    from lablib.studies.batch_invariance import prefill_pieces, prompt_ids

    model = prepare(args.model)
    ids, _ = prompt_ids(model, None)
    llm = llama_cpp.Llama(
        model.gguf_path,
        n_ctx=512,
        n_batch=512,
        n_ubatch=512,
        flash_attn=args.flash_attn,
        logits_all=True,
        verbose=False,
        n_threads=2,
    )

    def last_logits(seq, pieces):
        llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
        at = 0
        for n in pieces:
            llm.eval(seq[at : at + n])
            at += n
        return np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32).copy()

    for c in (2, 4, 8):
        moved, cuts = [None] * len(ids), [None] * len(ids)
        for start in range(0, len(ids), c):
            group = list(range(start, min(start + c, len(ids))))
            for q, pieces in zip(group, prefill_pieces([len(ids[q]) for q in group])):
                whole = last_logits(ids[q], [len(ids[q])])
                moved[q] = float(np.abs(last_logits(ids[q], pieces) - whole).max())
                cuts[q] = pieces
        print(f"C={c}: " + "  ".join(f"{d:.2g}" for d in moved))
        print("      pieces: " + " | ".join(",".join(map(str, p)) for p in cuts))


if __name__ == "__main__":
    main()
