"""The same prompt, another answer under load: is greedy decoding batch-invariant? (lab 04, worked example 5)

A server answers the same prompt at temperature 0 with one text when it is idle and another when it is busy.
The model did not change: the *batch* did. An engine that serves several sequences in one step multiplies
matrices of other shapes, splits a prompt's prefill in other pieces and may take another kernel for them. Each
sums in another order; floating-point sums in another order round differently; where the model's top two tokens
were nearly tied, the argmax flips and the rest of the text follows the other branch. He et al. (Thinking
Machines, "Defeating Nondeterminism in LLM Inference", 2025) found 80 distinct completions in 1,000 greedy runs
of one prompt on vLLM for this reason; vLLM's ``VLLM_BATCH_INVARIANT=1`` (GPUs, beta) exists for it.

:func:`batch_invariance` measures it on one engine:

1. each prompt alone (``engine.generate``), twice: is the engine deterministic at all? (A difference here
   is a fault of its own, or a cache reused behind the lab's back, not batching.)
2. the same prompts as ``C`` clients of a closed loop for each ``C`` in ``concurrency``, batched by the engine
   (in process, its continuous batching: :mod:`lablib.measure.closed_loop`, mode ``batched``; a server, its
   own scheduler over HTTP: :func:`lablib.measure.load.run_load`). C = 1 goes through the batched path with no
   neighbour; C > 1 shares steps with up to C - 1 other prompts;
3. for each prompt and ``C``: the first generated position where the ids differ from the prompt's
   run alone, and the top-2 margin there (nats, from the logits of the prompt plus the tokens before that
   position, run alone, of the engine or of ``margins``): below :data:`lablib.studies.compare.NEAR_TIE_NATS`
   the flip is a near-tie, arithmetic deciding between two almost equally likely tokens.

Measured on the lab's 2-core Xeon (32 tokens, the eight :data:`QUESTIONS`): llama.cpp in process with
llama-cpp-python's default attention (``flash_attn=False``) parted on 3 of 24 runs beside others, all at
near-ties; with ``flash_attn=True`` (llama-server's choice on the CPU) on none, and then its ids alone equal
llama-server's, where with it off 7 of 8 differed (``benchmarks/batch_logits.py`` reads the logits behind it).
Flash attention is no cure in general: Gemma 3 270M's Q4_K_M file changed 6 of 8 texts at 4 sequences with it on
(16 tokens; 2 with it off).

**Which sum changed, in llama.cpp with flash attention off.** With one KV stream per sequence (the lab's
llama.cpp and llama-server's default), ``llama_decode`` cuts a batch into micro-batches with ``split_equal``
(llama.cpp src/llama-batch.cpp): each takes one token from every sequence that has tokens left, as long as all
of them have one, so the prompts admitted in one step are prefilled in pieces as long as the shortest one's
remaining tokens (:func:`prefill_pieces`). Attention's two products (K times Q, then V times the softmax) go
through llamafile's tiled kernel (tinyBLAS, F16) for a piece of two or more tokens and a dot product per row
for a piece of one (sgemm.cpp: ``if (n < 2) return false``, "only enable sgemm for prompt processing"); the two
sum in another order. The shipped Q4_1 file's weight products take the row-by-row kernel at any size, and flash
attention computes each query row alone for pieces under 64 tokens, so with it on these short questions depend on
nothing. Not in general: flash attention takes a tiled kernel for pieces of 64 query tokens or more
(``GGML_FA_TILE_Q``, ggml-cpu ops.cpp), and a 100-token prompt prefilled whole parted from the same prompt in
pieces of 1 to 63 tokens by 0.60 in its last logits (in pieces of 64 by 0.56), where with flash attention off
only pieces of one token moved it (0.89). Replayed alone, one sequence prefilled in the pieces the batch cut
it into gives the first-token logits of the batched run to the last bit: for all 32 (question, C = 1, 2, 4, 8)
of the shipped file, the logits ``benchmarks/batch_logits.py`` reads from the batched run equal those of
``benchmarks/prefill_pieces.py``'s replay (``np.array_equal``, this Xeon). A one-token piece does not always move a logit (its last-bit
difference may stay under the next layer's 8-bit rounding step): 4 of the 7 prompts cut so at C = 8 did not.

The prompts are token ids, tokenized once (default: :data:`QUESTIONS`, each rendered by the model's chat
template), so every run gets the same ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lablib.checks import keywords_checked, positive_ints, whole
from lablib.engines import engine_class, load_engine
from lablib.engines.base import Engine, GenerationConfig, token_ids
from lablib.errors import LabError, shown
from lablib.measure.closed_loop import run_closed_loop
from lablib.measure.workload import messages_ids
from lablib.model.resolve import resolve
from lablib.studies.compare import NEAR_TIE_NATS, first_difference, topk_next

# eight short chat questions of different lengths and topics (the default prompts)
QUESTIONS = (
    "Tell me a story about a dragon who learns to cook.",
    "What is the capital of France?",
    "Explain why the sky is blue.",
    "Write a poem about the sea.",
    "List three uses of copper.",
    "How do airplanes fly?",
    "Describe a cat.",
    "What is 17 times 23?",
)
CONCURRENCY = (1, 2, 4, 8)  # clients of the closed loop: 1 (the batched path alone) to 8
ENGINE = "llama.cpp"  # the default engine: its text changes with the batch at near-ties here (flash attention off)


def prefill_pieces(lengths) -> list[list[int]]:
    """The pieces llama.cpp prefills prompts in when they are admitted in one step, one KV stream per sequence:
    ``split_equal`` (src/llama-batch.cpp) fills each micro-batch with one token of every sequence that has tokens
    left, as long as all of them have one more, so each piece is as long as the shortest remaining prompt.
    ``lengths``: each prompt's tokens (in the batch's order); returns each prompt's piece lengths, in order, e.g.
    ``prefill_pieces([36, 35, 34, 40])`` = ``[[34, 1, 1], [34, 1], [34], [34, 1, 1, 4]]``. Assumes the micro-batch
    limit (``n_ubatch``, the lab's ``n_batch``, 512) is not reached: over it, split_equal stops a micro-batch
    early as well."""
    left = [whole(n, f"lengths[{i}]", "a prompt's tokens, a whole number >= 1") for i, n in enumerate(lengths)]
    out: list[list[int]] = [[] for _ in left]
    while any(left):
        live = [i for i, n in enumerate(left) if n]
        k = min(left[i] for i in live)
        for i in live:
            out[i].append(k)
            left[i] -= k
    return out


@dataclass
class BatchInvariance:
    """What :func:`batch_invariance` measured on one engine.

    ``table``: one row per (``concurrency``, ``prompt``): ``question`` (its text, or None for ids given),
    ``first_divergence`` (first generated position whose id differs from the prompt's run alone; <NA> when
    all ``max_new_tokens`` agree), ``same_tokens`` (ids equal before it), ``alone_token`` /
    ``batched_token`` (the two tokens there, as text), ``margin`` (the engine's top-2 log-probability
    margin there, alone, nats) and ``near_tie`` (margin below :data:`NEAR_TIE_NATS`). ``repeat_parted``:
    prompts whose two runs alone differed (empty: the engine repeats itself). ``alone``: each prompt's
    ids alone; ``batched``: {concurrency: ids per prompt}.
    """

    engine: str
    max_new_tokens: int
    table: object  # pandas DataFrame
    repeat_parted: list = field(default_factory=list)
    alone: list = field(default_factory=list)
    batched: dict = field(default_factory=dict)
    verdict: str = ""

    def summary(self):
        """Per concurrency: ``prompts``, ``parted`` (prompts whose text changed), ``earliest`` (the
        first position any changed, <NA> if none), ``near_ties`` (of the parted, how many at a near-tie; <NA> when
        a margin is unknown)
        and ``same_share`` (generated ids equal before the first difference, over all prompts)."""
        import pandas as pd

        rows = []
        for c, g in self.table.groupby("concurrency", sort=True):
            parted = g[g["first_divergence"].notna()]
            rows.append(
                {
                    "concurrency": int(c),
                    "prompts": len(g),
                    "parted": len(parted),
                    "earliest": parted["first_divergence"].min() if len(parted) else pd.NA,
                    # <NA> where a parted row's margin is unknown (a server gives no logits): not "no near-tie"
                    "near_ties": pd.NA if parted["margin"].isna().any() else int(parted["near_tie"].astype(bool).sum()),
                    "same_share": float(g["same_tokens"].sum() / (len(g) * self.max_new_tokens)),
                }
            )
        out = pd.DataFrame(rows)
        out["earliest"] = out["earliest"].astype("Int64")
        out["near_ties"] = out["near_ties"].astype("Int64")
        return out


def prompt_ids(model, prompts) -> tuple[list[list[int]], list]:
    """(token ids per prompt, question text per prompt or None): ``prompts`` as texts (chat questions,
    rendered once by the model's template) or token-id lists; None: :data:`QUESTIONS`."""
    if prompts is None:
        prompts = QUESTIONS
    if isinstance(prompts, (str, dict)) or not hasattr(prompts, "__iter__"):
        raise LabError(f"prompts={shown(prompts)}: expected a list of questions (texts) or of token-id lists")
    prompts = list(prompts)
    if not prompts:
        raise LabError("prompts is empty: expected at least one question or token-id list")
    ids, texts = [], []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p.strip():
                raise LabError(f"prompts[{i}] is empty text: expected a question")
            ids.append(messages_ids(model, [{"role": "user", "content": p}])[0])
            texts.append(p)
        elif isinstance(p, (str, bytes, dict)) or not hasattr(p, "__iter__"):
            hint = " (one prompt of ids: wrap it, prompts=[[...]])" if hasattr(p, "__index__") else ""
            raise LabError(
                f"prompts[{i}]={shown(p)}: expected a question (text) or a list of token ids{hint}; chat messages: "
                "pass the question's text"
            )
        else:
            try:
                ids.append(token_ids(p))
            except LabError as e:
                raise LabError(f"prompts[{i}]: {e}") from None
            texts.append(None)
    return ids, texts


def parted_row(engine, prompt: list[int], alone: list[int], batched: list[int], margins=None) -> dict:
    """Where ``batched`` (the prompt's ids in a batch) parts from ``alone``: ``first_divergence`` (None:
    the same ids), ``same_tokens``, the two tokens there as text (``engine``'s tokenizer), and the top-2 ``margin``
    (nats) after the prompt and the ids before that position, from the logits of ``margins`` (default: ``engine``)
    computed alone (None for an engine without logits)."""
    pos = first_difference(alone, batched)
    row = {
        "first_divergence": pos,
        "same_tokens": len(alone) if pos is None else pos,
        "alone_token": None,
        "batched_token": None,
        "margin": None,
        "near_tie": None,
    }
    if pos is None:
        return row
    row["alone_token"] = engine.detokenize(alone[pos : pos + 1]) if pos < len(alone) else "(ended)"
    row["batched_token"] = engine.detokenize(batched[pos : pos + 1]) if pos < len(batched) else "(ended)"
    top = topk_next(margins or engine, list(prompt) + list(alone[:pos]), 2)
    if top is not None:
        row["margin"] = float(top["logp"][0] - top["logp"][1])
        row["near_tie"] = row["margin"] < NEAR_TIE_NATS
    return row


def _verdict(name: str, table, summary, repeat_parted: list, n: int, max_new_tokens: int) -> str:
    if repeat_parted:
        return (
            f"{name} is not deterministic even alone: prompt(s) {repeat_parted} gave other ids on a second run "
            "with nothing beside them; that is the engine (or a cache reused between runs), not batching"
        )
    parted = summary[summary["parted"] > 0]
    if parted.empty:
        return (
            f"{name} gave every prompt the same {max_new_tokens} ids alone and in batches of "
            f"{', '.join(str(c) for c in summary['concurrency'])}: no text changed on these prompts (ids compared; "
            "a change of rounding shows only where the model was nearly tied)"
        )
    first = parted.iloc[0]
    total = int(parted["parted"].sum())
    unknown = int(table.loc[table["first_divergence"].notna(), "margin"].isna().sum())
    ties = (
        f"{int(parted['near_ties'].sum())} of them at a near-tie (top-2 margin below {NEAR_TIE_NATS} nats)"
        if not unknown
        else f"margins unknown for {unknown} ({name} gives no logits: pass margins= an in-process engine of the model)"
    )
    return (
        f"{name} repeats itself alone, but its text changes with what shares the batch: first at "
        f"{int(first['concurrency'])} concurrent sequences ({int(first['parted'])} of {n} prompts), "
        f"{total} changed text{'s' if total != 1 else ''} in all, {ties}"
    )


def engine_label(engine) -> str:
    """What a verdict calls ``engine``: its name, or for a server the kind the http engine found ("llama-server")."""
    kind = getattr(engine, "kind", None)
    return kind if not engine.in_process and kind else engine.name


def batched_ids(engine, ids: list[list[int]], concurrency: int, cfg: GenerationConfig) -> list[list[int]]:
    """Each prompt's generated ids when ``ids`` are served as ``concurrency`` clients of a closed loop, in prompt
    order: in process through the engine's continuous batching (:func:`run_closed_loop`, ``batched``), a server
    through its own (:func:`lablib.measure.load.run_load`, ``closed``; as many at once as it has slots).
    LabError naming the first error when a server failed a request."""
    if engine.in_process:
        run = run_closed_loop(engine, ids, concurrency, "batched", cfg)
        return [t.token_ids for t in sorted(run.traces, key=lambda t: t.request_index)]
    from lablib.measure.load import run_load

    rows = run_load(engine, ids, "closed", concurrency=concurrency, cfg=cfg)
    failed = [r for r in rows if r.get("error")]
    if failed or len(rows) != len(ids):
        why = failed[0]["error"] if failed else f"{len(ids) - len(rows)} requests never finished"
        raise LabError(
            f"{engine_label(engine)} at {concurrency} clients: {len(failed) or len(ids) - len(rows)} of {len(ids)} "
            f"requests failed ({why}); the ids cannot be compared"
        )
    out = [None] * len(ids)
    for r in rows:
        out[r["request_index"]] = list(r["token_ids"])
    return out


def _check_levels(levels: list[int], prompts: int, slots: int | None, name: str) -> None:
    """LabError for a level no run can reach: more clients than prompts (they never share a step), or than the
    server's slots when the lab knows them (it batches at most that many; the rest wait in its queue)."""
    if levels[-1] > prompts:
        raise LabError(
            f"concurrency {levels[-1]} with {prompts} prompt{'s' if prompts != 1 else ''}: at most {prompts} can "
            "share a step; give more prompts or a concurrency of at most the prompts' number"
        )
    if isinstance(slots, int) and levels[-1] > slots:
        raise LabError(
            f"concurrency {levels[-1]} on {name} with {slots} slot{'s' if slots != 1 else ''} (parallel={slots}): it "
            f"batches at most {slots} at once; use a concurrency of at most {slots}, or start it with "
            f"parallel={levels[-1]}"
        )


@keywords_checked
def batch_invariance(
    model=None,
    engine=ENGINE,
    concurrency=CONCURRENCY,
    max_new_tokens: int = 32,
    prompts=None,
    load: dict | None = None,
    margins=None,
) -> BatchInvariance:
    """Each prompt greedy alone (twice), then batched beside 0..C-1 others; where its ids part, and the engine's
    top-2 margin there. Returns a :class:`BatchInvariance`.

    ``engine``: a name (loaded here, with one KV sequence per client: ``Engine.default_load_kwargs``; ``load``:
    more keywords for :func:`lablib.load_engine`, such as ``{"threads": 1}``), an engine already loaded (llama.cpp
    loaded with ``n_seq_max`` of at least max(``concurrency``)), or an http engine on a server (``start_server(...)
    .engine(model)``: its requests as clients of a closed loop, batched by the server's own scheduler, as many at
    once as it has slots). ``concurrency``: clients of each closed loop (a list, or "1,4,8"). ``prompts``:
    questions (texts, rendered by the model's chat template) or token-id lists; default :data:`QUESTIONS`. Greedy,
    ``ignore_eos``: every run makes exactly ``max_new_tokens``. ``margins``: the engine whose logits give the top-2
    margin where ids part (default: ``engine``; a server gives none: pass an in-process engine of the same model,
    such as llama.cpp for a llama-server). LabError for an in-process engine without batched mode, before any
    prompt runs.
    """
    levels = sorted(set(positive_ints(concurrency, "concurrency")))
    max_new_tokens = whole(max_new_tokens, "max_new_tokens", "a whole number of tokens, at least 1")
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    if load is not None and not isinstance(load, dict):
        raise LabError(f"load={shown(load)}: expected a dict of load keywords, such as {{'threads': 1}}")
    if margins is not None and not isinstance(margins, Engine):
        raise LabError(f"margins={shown(margins)}: expected an engine already loaded (lablib.load_engine(...))")
    own = not isinstance(engine, Engine)
    if own:
        rm = resolve(model)
        cls = engine_class(engine)
        if cls.in_process and cls.batch_session is Engine.batch_session:
            raise LabError(
                f"{cls.name} has no continuous batching in the lab (batch_session): batch invariance is measured "
                "on an engine that serves several sequences in one step, such as llama.cpp, transformers or mlx"
            )
    else:
        if load:
            raise LabError(f"load={shown(load)} with an engine already loaded: load the engine with them instead")
        engine.check_open()
        rm = engine.model
        if model is not None and resolve(model).name != rm.name:
            raise LabError(
                f"model={shown(model)} with a {engine_label(engine)} engine loaded on {rm.name}: the prompts are "
                "tokenized by the engine's model; pass that model, or none"
            )
    if margins is not None:
        margins.check_open()
        if margins.model.name != rm.name:
            raise LabError(
                f"margins= a {margins.name} engine on {margins.model.name}, but the ids are {rm.name}'s: the margins "
                "come from an engine of the same model"
            )
    eng = load_engine(cls.name, rm, **{**cls.default_load_kwargs(rm, max(levels)), **(load or {})}) if own else engine
    try:
        ids, texts = prompt_ids(rm, prompts)
        slots = None if eng.in_process else (getattr(eng, "server_settings", None) or {}).get("parallel")
        _check_levels(levels, len(ids), slots, engine_label(eng))
        for p in ids:
            eng.check_context(len(p), max_new_tokens)
        if eng.in_process:  # an engine without batched mode, or loaded with too few KV sequences, is refused
            # before the prompts run alone
            eng.batch_session(cfg, max(levels), max(len(p) for p in ids) + max_new_tokens).close()
        alone = [eng.generate(p, cfg).token_ids for p in ids]
        again = [eng.generate(p, cfg).token_ids for p in ids]
        repeat_parted = [i for i, (a, b) in enumerate(zip(alone, again)) if a != b]
        batched, rows = {}, []
        for c in levels:
            batched[c] = got = batched_ids(eng, ids, c, cfg)
            for i, (p, a, b) in enumerate(zip(ids, alone, got)):
                row = parted_row(eng, p, a, b, margins)
                rows.append({"concurrency": c, "prompt": i, "question": texts[i], **row})
    finally:
        if own:
            eng.close()
    import pandas as pd

    table = pd.DataFrame(rows)
    table["first_divergence"] = table["first_divergence"].astype("Int64")
    name = engine_label(eng)
    result = BatchInvariance(name, max_new_tokens, table, repeat_parted, alone, batched)
    result.verdict = _verdict(name, table, result.summary(), repeat_parted, len(ids), max_new_tokens)
    return result
