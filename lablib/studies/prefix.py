"""Prefix caching as the subject of an experiment (lab 08): TTFT with and without reuse of a kept KV cache.

Every other measurement in the lab starts each request from an empty KV cache (DESIGN.md, "no
hidden cache reuse"). Here reuse is switched on explicitly, one request at a time, through the
engines' opt-in prefix cache (:class:`lablib.engines.base.PrefixCache`), and every row says so:
``reuse`` (True/False), ``cached_tokens`` (prompt tokens taken from the cache) and
``evaluated_tokens`` (prompt tokens the engine's own counter says it computed).

- :func:`shared_prefix`: a shared system prompt of S tokens (instructions, a document) and a question
  of its own per request; TTFT with and without reuse as S grows.
- :func:`chat`: a conversation whose every turn appends the previous answer and a new user message;
  TTFT per turn when the previous turns' KV is kept (as a chat server keeps a conversation's cache)
  and when it is not.
- :func:`memory_table`: what the kept caches cost, measured (the engines' own byte counts) beside the
  count from the model's shape (:func:`lablib.engines.memory.kv_cache_bytes`).

Defaults come from ``lablib.config.BUDGETS["prefix"]`` and ``["prefix_chat"]`` (quick and full).
"""

from __future__ import annotations

from lablib.config import budget
from lablib.engines import engine_class
from lablib.engines.base import GenerationConfig
from lablib.engines.memory import kv_cache_bytes
from lablib.errors import LabError
from lablib.measure.plan import budgeted_int, check_plan, check_warmup, engine_names, positive_ints
from lablib.measure.sweep import Step, run_plan
from lablib.measure.workload import lab_tokenizer, messages_ids, prompt_of_length
from lablib.model.resolve import resolve, takes_model
from lablib.results.store import engine_manifest, trace_row
from lablib.results.tables import need

# the unique part of each request: a question in the chat template (lab 08's default questions)
QUESTIONS = (
    "What is the main idea of the text above?",
    "Summarize the text above in one sentence.",
    "Which words in the text above are the hardest?",
    "Who would enjoy reading the text above?",
)
# the user's side of lab 08's chat, one message per turn
CHAT_MESSAGES = (
    "What is the capital of France?",
    "What is it famous for?",
    "How many people live there?",
    "Name a river that flows through it.",
    "What is a good time of year to visit?",
    "Thank you. Can you summarize our conversation?",
)
SHARED_OFFSET = 3000  # where in the prose corpus the shared prefix starts (tokens)


def _row(engine, trace, manifest, **labels) -> dict:
    row = trace_row(trace, manifest, mode="single", concurrency=1, **labels)
    row["evaluated_tokens"] = engine.engine_counters().get("n_p_eval")
    return row


@takes_model
def shared_prompts(model, doc_tokens: int, questions: int) -> tuple[list[int], list[list[int]]]:
    """A shared system prompt and the prompts that start with it: (shared ids, [prompt ids per
    question]). The system message is ``doc_tokens`` tokens of prose (a document, long
    instructions); each prompt is that system turn and one of :data:`QUESTIONS` as the user turn,
    rendered by the chat template (a base model's: as raw text, :func:`lablib.measure.workload.messages_ids`),
    so the shared ids (the system turn: ``doc_tokens`` plus the template's few tokens) are the prompts' common
    prefix."""
    doc = lab_tokenizer(model).decode(prompt_of_length(model, doc_tokens, offset=SHARED_OFFSET))
    system = [{"role": "system", "content": doc}]
    shared = messages_ids(model, system, add_generation_prompt=False)[0]
    return shared, [messages_ids(model, system + [{"role": "user", "content": q}])[0] for q in QUESTIONS[:questions]]


def shared_prefix(
    model=None,
    *,
    engines=None,
    shared_tokens=None,
    questions: int | None = None,
    max_new_tokens: int | None = None,
    reps: int | None = None,
    warmup: int = 1,
    out=None,
    progress: bool = True,
):
    """TTFT with and without reuse of a shared system prompt, per engine and prompt length.

    Each request is a system prompt of S tokens of prose (S in ``shared_tokens``; the same for every
    request) and one of ``questions`` user questions (:func:`shared_prompts`). For each engine
    (loaded once), each S and each repetition: every question once without reuse (an empty KV
    cache, as everywhere in the lab) and once with the system turn's KV cache copied in (kept once
    per S by ``engine.cache_prefix``, not timed), in alternating order. ``max_new_tokens`` output
    each (TTFT is what matters). Defaults: ``BUDGETS["prefix"]`` (quick: S 16 and 64, 2 questions,
    1 repetition, 4 tokens).

    Returns a DataFrame, one row per measured request: sweep "prefix_shared", ``reuse``,
    ``shared_tokens`` (the system turn's length: S plus the template's tokens), ``question``,
    ``repetition``, the metrics (``ttft_s`` ...), ``cached_tokens``, ``evaluated_tokens`` (the
    engine's counter) and ``kept_cache_bytes`` (reuse rows). Rows are appended to ``out`` (.jsonl or
    .parquet) as they finish. Raises LabError or ContextOverflowError for a bad plan before any work.
    """
    sizes = positive_ints(
        budget("prefix", "shared_tokens") if shared_tokens is None else shared_tokens, "shared_tokens"
    )
    nq = budgeted_int(questions, "prefix", "questions")
    if nq > len(QUESTIONS):
        raise LabError(f"questions={nq}: the lab has {len(QUESTIONS)} questions")
    n_out = budgeted_int(max_new_tokens, "prefix", "max_new_tokens")
    reps = budgeted_int(reps, "prefix", "reps")
    check_warmup(warmup)
    rm = resolve(model)
    names = engine_names(engines, rm)
    plans = {s: shared_prompts(rm, s, nq) for s in sizes}
    longest = max(len(p) for _, prompts in plans.values() for p in prompts)
    check_plan(rm, names, [longest], n_out)
    cfg = GenerationConfig(max_new_tokens=n_out)

    def run(engine, emit):
        # the warm-up is its own (not iter_measure's): both paths once, on a short prefix of their own
        warm_shared, warm_prompts = shared_prompts(rm, 8, 1)
        for _ in range(warmup):
            engine.generate(warm_prompts[0], cfg)
            engine.generate(warm_prompts[0], cfg, prefix_cache=engine.cache_prefix(warm_shared))
        for s in sizes:
            shared, prompts = plans[s]
            kept = engine.cache_prefix(shared)
            manifest = engine_manifest(
                engine,
                {
                    "sweep": "prefix_shared",
                    "shared_tokens": len(shared),
                    "questions": nq,
                    "max_new_tokens": n_out,
                    "reps": reps,
                },
            )
            for rep in range(reps):
                for qi, ids in enumerate(prompts):
                    for reuse in (False, True) if (rep + qi) % 2 == 0 else (True, False):
                        tr = engine.generate(ids, cfg, prefix_cache=kept if reuse else None)
                        row = _row(
                            engine, tr, manifest, sweep="prefix_shared", reuse=reuse,
                            shared_tokens=len(shared), question=qi, repetition=rep,
                        )  # fmt: skip
                        if reuse:
                            row["kept_cache_bytes"] = kept.nbytes
                        emit(row)

    # one step per engine: its warm-up, then every S (the kept cache of S is made on the loaded engine)
    plan = [Step(name, {"n_ctx": longest + n_out + 16}, run) for name in names]
    total = len(names) * len(sizes) * reps * nq * 2
    return run_plan(rm, plan, out=out, progress=progress, total=total, desc="shared prefix")


def chat(
    model=None,
    *,
    engines=None,
    turns: int | None = None,
    max_new_tokens: int | None = None,
    out=None,
    progress: bool = True,
):
    """A multi-turn chat, TTFT per turn, without and with the previous turns' KV cache kept.

    Turn k's prompt is the whole conversation so far rendered by the chat template (the model's
    own answers included, cut at EOS, and the k-th message of :data:`CHAT_MESSAGES`), as a chat
    client sends it. Per engine: first the conversation without reuse (every turn prefilled in
    full; its greedy answers make the conversation), then the same prompts again with one kept
    cache (``engine.generate(..., prefix_cache=kept, keep=True)``: after each turn the cache holds
    that turn's prompt and answer, as a chat server keeps a conversation's KV). The cache covers
    the longest common prefix of the new prompt and what it holds; where the re-rendered history
    tokenizes differently from the generated ids, reuse stops there (``cached_tokens`` shows it).
    Defaults: ``BUDGETS["prefix_chat"]`` (quick: 3 turns, answers of at most 8 tokens).

    Returns a DataFrame, one row per turn and arm: sweep "prefix_chat", ``reuse``, ``turn``
    (1, 2, ...), the metrics, ``cached_tokens``, ``evaluated_tokens``, ``kept_cache_bytes``
    (reuse rows: what the cache held when the turn started) and ``text`` (the answer).
    """
    n_turns = budgeted_int(turns, "prefix_chat", "turns")
    if n_turns > len(CHAT_MESSAGES):
        raise LabError(f"turns={n_turns}: the lab's chat has {len(CHAT_MESSAGES)} user messages")
    n_out = budgeted_int(max_new_tokens, "prefix_chat", "max_new_tokens")
    rm = resolve(model)
    names = engine_names(engines, rm)
    tok = lab_tokenizer(rm)
    # the longest the conversation can grow: every message, every answer at its budget
    longest = len(messages_ids(rm, [{"role": "user", "content": m} for m in CHAT_MESSAGES[:n_turns]])[0]) + 8 * n_turns
    longest += n_turns * n_out
    check_plan(rm, names, [longest], n_out)
    cfg = GenerationConfig(max_new_tokens=n_out, ignore_eos=False)  # answers end where the model ends them

    def run(engine, emit):
        # the warm-up is its own (not iter_measure's): both paths once, on a short chat of its own
        warm = messages_ids(rm, [{"role": "user", "content": "Hello!"}])[0]
        engine.generate(warm, cfg)
        engine.generate(warm, cfg, prefix_cache=engine.cache_prefix(warm[:-4]))
        manifest = engine_manifest(engine, {"sweep": "prefix_chat", "turns": n_turns, "max_new_tokens": n_out})
        messages, prompts = [], []
        for k in range(n_turns):  # without reuse: the conversation as the model answers it
            messages.append({"role": "user", "content": CHAT_MESSAGES[k]})
            ids = messages_ids(rm, messages)[0]
            tr = engine.generate(ids, cfg)
            answer = [t for t in tr.token_ids if t not in engine.eos_ids]
            text = tok.decode(answer, skip_special_tokens=True).strip()
            messages.append({"role": "assistant", "content": text})
            prompts.append(ids)
            emit({**_row(engine, tr, manifest, sweep="prefix_chat", reuse=False, turn=k + 1), "text": text})
        kept = engine.cache_prefix([])
        for k, ids in enumerate(prompts):  # with reuse: the same prompts, the cache kept
            held = kept.nbytes
            tr = engine.generate(ids, cfg, prefix_cache=kept, keep=True)
            text = tok.decode([t for t in tr.token_ids if t not in engine.eos_ids], skip_special_tokens=True)
            row = _row(engine, tr, manifest, sweep="prefix_chat", reuse=True, turn=k + 1)
            emit({**row, "kept_cache_bytes": held, "text": text.strip()})

    # one step per engine: the reuse arm replays the prompts the answers of the first arm made
    plan = [Step(name, {"n_ctx": longest + n_out + 16}, run) for name in names]
    return run_plan(rm, plan, out=out, progress=progress, total=len(names) * n_turns * 2, desc="chat", unit="turn")


def memory_table(df, model=None):
    """What the kept prefix caches cost, from rows with ``kept_cache_bytes`` (:func:`shared_prefix`'s
    reuse rows): per engine and shared prefix length, ``kept_bytes`` (measured: the engine's own
    count of the cache it kept; llama.cpp's saved sequence state includes a small header per layer),
    ``formula_bytes`` (2 x layers x KV heads x head size x bytes per value x tokens, the engine's
    KV element size: :func:`lablib.engines.memory.kv_cache_bytes`) and both per token. Raises LabError when
    no row carries ``kept_cache_bytes``."""
    import pandas as pd

    source = "lablib.studies.prefix.shared_prefix(...)"
    need(df, ["engine", "sweep", "shared_tokens", "kept_cache_bytes"], "memory_table", source)
    if df["kept_cache_bytes"].isna().all():
        raise LabError(f"memory_table needs rows with kept_cache_bytes: run {source} first")
    rm = resolve(model)
    d = df[df["kept_cache_bytes"].notna() & (df["sweep"] == "prefix_shared")]
    g = d.groupby(["engine", "shared_tokens"], sort=False)["kept_cache_bytes"].first().reset_index()
    out = []
    for r in g.itertuples():
        n = int(r.shared_tokens)
        formula = kv_cache_bytes(rm, engine_class(r.engine), n)
        out.append(
            {
                "engine": r.engine,
                "tokens": n,
                "kept_bytes": int(r.kept_cache_bytes),
                "formula_bytes": formula,
                "kept_bytes_per_token": r.kept_cache_bytes / n,
                "formula_bytes_per_token": formula / n,
            }
        )
    return pd.DataFrame(out)


def report(
    engines=None, shared_tokens=None, questions=None, reps=None, max_new_tokens=None, turns=0, model=None, out=None
) -> dict:
    """{"shared": [one dict per engine, shared_tokens and reuse: medians of ttft_s, prefill_s, prompt,
    cached and evaluated tokens, n, speedup], "memory": [per engine and length: kept_bytes,
    formula_bytes...], "chat": [per engine, turn and reuse, as "shared"] (with ``turns``)}."""
    from lablib.engines import engines_for
    from lablib.model.resolve import prepare
    from lablib.results import tables

    rm = prepare(model, log=lambda *_: None)
    names = engines or engines_for(rm)
    df = shared_prefix(
        rm,
        engines=names,
        shared_tokens=shared_tokens,
        questions=questions,
        reps=reps,
        max_new_tokens=max_new_tokens,
        out=out,
        progress=False,
    )
    report = {
        "shared": tables.prefix_medians(df).to_dict("records"),
        "memory": memory_table(df, rm).to_dict("records"),
    }
    if turns:
        ch = chat(rm, engines=names, turns=turns, out=out, progress=False)
        report["chat"] = tables.prefix_medians(ch, "prefix_chat").to_dict("records")
    return report
