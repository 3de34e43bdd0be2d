"""What a quantization costs in quality, measured the way llama.cpp's perplexity tool measures it.

Definitions follow ``tools/perplexity`` of llama.cpp (perplexity.cpp and its README):

- The text is tokenized once (BOS only where the vocabulary asks for it) and cut into chunks of
  ``n_ctx`` tokens; the first token of each chunk becomes BOS when the vocabulary adds one.
  Each chunk is evaluated from an empty KV cache; only its second half is scored: the logits at
  positions ``j`` in ``[n_ctx // 2, n_ctx - 1)`` predict token ``j + 1`` (so every scored token
  has at least ``n_ctx / 2`` tokens of context).
- Perplexity: ``PPL = exp(mean over scored tokens of -log p(token))`` (natural log, nats).
- KL divergence per token: ``KL(P_ref || P_q) = sum_v p_ref(v) (log p_ref(v) - log p_q(v))``, nats,
  over the whole vocabulary; reported as mean, p99 and max over scored tokens.
- Top-1 agreement ("same top p"): the share of tokens where argmax p_q equals argmax p_ref.
- Δp: ``p_q(t) - p_ref(t)``. llama.cpp reports it for the text's next token (``dp_mean``,
  ``dp_rms``); this lab also reports the mean ``|Δp|`` of the reference's top token
  (``dp_top_abs_mean``).

Memory: logits are never held for the whole text at once. The reference's scored log-probs are
written to a float32 file on disk (``[scored tokens, vocab]``, memory-mapped), chunk by chunk; a
candidate is then evaluated chunk by chunk against it (``[n_ctx, vocab]`` float32 in memory at a
time: 50 MB for 256 positions of a 49,152-token vocabulary).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from lablib.errors import LabError
from lablib.results.schema import QUALITY
from lablib.staging import staged
from lablib.studies.logits import log_softmax

STATS = QUALITY  # the statistics of a comparison, declared with the row's columns (lablib.results.schema)


def perplexity_chunks(ids, n_ctx: int, n_chunks: int | None = None, bos: int | None = None) -> list[list[int]]:
    """``ids`` cut into whole chunks of ``n_ctx`` tokens, as llama-perplexity cuts them; the first
    token of each chunk replaced by ``bos`` when given. Raises LabError when the text holds fewer
    than one chunk (llama-perplexity needs ``2 * n_ctx`` tokens: the same rule here)."""
    ids = [int(i) for i in ids]
    if n_ctx < 16:
        raise LabError(f"n_ctx={n_ctx}: expected at least 16 tokens per chunk (llama-perplexity uses 512)")
    have = len(ids) // n_ctx
    if have < 1 or len(ids) < 2 * n_ctx:
        raise LabError(
            f"the text holds {len(ids)} tokens; perplexity with n_ctx={n_ctx} needs at least "
            f"{2 * n_ctx} (llama-perplexity's rule): use a longer text or a smaller n_ctx"
        )
    n = have if n_chunks is None else min(int(n_chunks), have)
    if n < 1:
        raise LabError(f"n_chunks={n_chunks}: expected at least 1")
    chunks = [ids[i * n_ctx : (i + 1) * n_ctx] for i in range(n)]
    if bos is not None:
        for c in chunks:
            c[0] = int(bos)
    return chunks


def scored_positions(n_ctx: int) -> slice:
    """Positions of a chunk whose logits are scored: ``[n_ctx // 2, n_ctx - 1)``."""
    return slice(n_ctx // 2, n_ctx - 1)


def token_stats(ref_logp, q_logp, targets) -> dict:
    """Per-token statistics of candidate log-probs ``q_logp`` against reference ``ref_logp``
    (both ``[n, vocab]`` log-softmax, nats) for next tokens ``targets`` ``[n]``: arrays ``kl``,
    ``nll`` (candidate), ``nll_ref``, ``same_top`` (bool), ``dp`` (Δp of the target token),
    ``dp_top`` (Δp of the reference's top token)."""
    import numpy as np

    ref_logp, q_logp = np.asarray(ref_logp, np.float64), np.asarray(q_logp, np.float64)
    rows = np.arange(len(targets))
    t = np.asarray(targets)
    p_ref = np.exp(ref_logp)
    kl = (p_ref * (ref_logp - q_logp)).sum(axis=1)
    top_ref, top_q = ref_logp.argmax(axis=1), q_logp.argmax(axis=1)
    return {
        "kl": np.maximum(kl, 0.0),
        "nll": -q_logp[rows, t],
        "nll_ref": -ref_logp[rows, t],
        "same_top": top_ref == top_q,
        "dp": np.exp(q_logp[rows, t]) - np.exp(ref_logp[rows, t]),
        "dp_top": np.exp(q_logp[rows, top_ref]) - np.exp(ref_logp[rows, top_ref]),
    }


def summarize(parts: list[dict]) -> dict:
    """One dict of :data:`STATS` from the per-chunk outputs of :func:`token_stats`."""
    import numpy as np

    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return {
        "ppl": float(np.exp(cat["nll"].mean())),
        "ppl_ref": float(np.exp(cat["nll_ref"].mean())),
        "kl_mean": float(cat["kl"].mean()),
        "kl_p99": float(np.percentile(cat["kl"], 99)),
        "kl_max": float(cat["kl"].max()),
        "top1": float(cat["same_top"].mean()),
        "dp_top_abs_mean": float(np.abs(cat["dp_top"]).mean()),
        "dp_mean": float(cat["dp"].mean()),
        "dp_rms": float(np.sqrt((cat["dp"] ** 2).mean())),
        "n_tokens": int(len(cat["kl"])),
    }


@dataclass
class ReferenceLogProbs:
    """The reference's scored log-probs on disk: ``path`` (float32, ``[n_chunks * n_scored, vocab]``,
    read memory-mapped), the ``chunks`` it was computed on and ``n_vocab``."""

    path: Path
    chunks: list
    n_ctx: int
    n_vocab: int

    def chunk(self, i: int):
        """Log-probs of chunk ``i``'s scored positions, ``[n_scored, vocab]`` float32 (memory-mapped)."""
        import numpy as np

        n = self.n_ctx - 1 - self.n_ctx // 2
        mm = np.memmap(self.path, dtype=np.float32, mode="r", shape=(len(self.chunks) * n, self.n_vocab))
        return mm[i * n : (i + 1) * n]


def reference_logprobs(engine, chunks, cache_dir, key: str) -> ReferenceLogProbs:
    """The reference ``engine``'s log-probs on the scored positions of ``chunks``, computed chunk by
    chunk and cached in ``cache_dir`` under ``key`` (e.g. the reference file's hash): a second call
    reads the file. ``engine``: any lab engine with ``logits(ids)``."""
    import numpy as np

    n_ctx = len(chunks[0])
    h = hashlib.sha256(json.dumps([key, chunks]).encode()).hexdigest()[:16]
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"reflogp-{h}.f32"
    sl = scored_positions(n_ctx)
    n_scored = sl.stop - sl.start
    if not path.is_file():
        with staged(path) as tmp, open(tmp, "wb") as f:  # a Ctrl-C or a failure: no half file left behind
            for c in chunks:
                lp = log_softmax(engine.logits(c)[sl]).astype(np.float32)  # a vocabulary per scored position
                f.write(lp.tobytes())
    n_vocab = path.stat().st_size // (4 * n_scored * len(chunks))
    return ReferenceLogProbs(path=path, chunks=[list(c) for c in chunks], n_ctx=n_ctx, n_vocab=int(n_vocab))


def compare_to_reference(engine, ref: ReferenceLogProbs) -> dict:
    """:data:`STATS` of ``engine`` (any lab engine with ``logits(ids)``) against ``ref``, evaluated
    chunk by chunk on the reference's own chunks. Raises LabError when the vocabularies differ."""
    sl = scored_positions(ref.n_ctx)
    parts = []
    for i, c in enumerate(ref.chunks):
        logits = engine.logits(c)
        if logits.shape[1] != ref.n_vocab:
            raise LabError(
                f"{engine.name} returns {logits.shape[1]} logits per token, the reference "
                f"{ref.n_vocab}: expected the same vocabulary (the same model in another format)"
            )
        targets = c[sl.start + 1 : sl.stop + 1]
        parts.append(token_stats(ref.chunk(i), log_softmax(logits[sl]), targets))
    return summarize(parts)


def text_chunks(engine, n_ctx: int, n_chunks: int | None, text: str | None = None) -> list[list[int]]:
    """The lab's prose (``data/text/prose.txt``) or ``text`` tokenized by a llama.cpp engine as
    llama-perplexity tokenizes it (BOS added where the vocabulary asks), cut into chunks."""
    from lablib.measure.workload import corpus_text

    add_bos = engine.adds_bos
    ids = engine.tokenize(text if text is not None else corpus_text("prose"), add_special=add_bos)
    return perplexity_chunks(ids, n_ctx, n_chunks, bos=engine.bos_id if add_bos else None)


# --- cross-check with llama.cpp's own tool ---------------------------------------------------
_KLD_PATTERNS = {
    "ppl": r"Mean PPL\(Q\)\s*:\s*([0-9.eE+-]+)",
    "ppl_ref": r"Mean PPL\(base\)\s*:\s*([0-9.eE+-]+)",
    "kl_mean": r"Mean\s+KLD:\s*([0-9.eE+-]+)",
    "kl_p99": r"99\.0%\s+KLD:\s*([0-9.eE+-]+)",
    "kl_max": r"Maximum KLD:\s*([0-9.eE+-]+)",
    "top1_pct": r"Same top p:\s*([0-9.eE+-]+)",
    "dp_mean_pct": r"Mean\s+Δp:\s*([0-9.eE+-]+)",
    "dp_rms_pct": r"RMS Δp\s*:\s*([0-9.eE+-]+)",
}


def parse_kld_output(text: str) -> dict:
    """The statistics llama-perplexity --kl-divergence prints, as the keys of :data:`STATS`
    (percentages turned into fractions); missing ones are absent."""
    out = {}
    for k, pat in _KLD_PATTERNS.items():
        m = re.search(pat, text)
        if m:
            v = float(m.group(1))
            if k.endswith("_pct"):
                k, v = k[:-4], v / 100
            out[k] = v
    return out


def llama_perplexity_kld(
    reference,
    candidate,
    text_file,
    n_ctx: int,
    n_chunks: int,
    workdir,
    threads: int = 2,
    tool=None,
    timeout: float = 900,
    flash_attn: str = "off",
) -> dict:
    """Run llama.cpp's ``llama-perplexity`` twice: ``--kl-divergence-base`` on ``reference``, then
    ``--kl-divergence`` on ``candidate``; returns :func:`parse_kld_output` of the second run.
    ``tool``: the binary (default: ``lablib.build.llama.llama_tool("llama-perplexity")``).

    ``flash_attn``: the tool's ``-fa`` (default ``off``, as the lab's llama.cpp engine runs: with
    the tool's own default, ``auto``, flash attention changes the candidate's figures by a few
    percent: on the default model, Q8_0, n_ctx 128, PPL 23.31 instead of 23.13). Note the tool
    stores the base log-probs compressed to 16 bits, so its KL differs from this module's in the
    third significant digit."""
    import subprocess

    if tool is None:
        from lablib.build.llama import llama_tool

        tool = llama_tool("llama-perplexity")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    base = workdir / f"{Path(reference).stem}-c{n_ctx}-n{n_chunks}-fa{flash_attn}.kld"
    common = [
        "-f",
        str(text_file),
        "-c",
        str(n_ctx),
        "--chunks",
        str(n_chunks),
        "-t",
        str(threads),
        "-b",
        str(n_ctx),
        "-fa",
        flash_attn,
    ]

    def perplexity(model, failed: str, *more: str):
        """One run of the tool on ``model`` with the common flags, the base file and ``more``; LabError
        "``failed`` (exit N): the last line of its stderr" when it fails."""
        r = subprocess.run(
            [str(tool), "-m", str(model), *common, "--kl-divergence-base", str(base), *more],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if r.returncode != 0:
            raise LabError(f"{failed} (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
        return r

    if not base.is_file():
        perplexity(reference, "llama-perplexity failed on the reference")
    r = perplexity(candidate, f"llama-perplexity --kl-divergence failed on {candidate}", "--kl-divergence")
    return parse_kld_output(r.stdout + r.stderr)
