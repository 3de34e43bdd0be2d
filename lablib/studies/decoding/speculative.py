"""Lab 10, speculative decoding: a cheap draft proposes ``k`` tokens, the target verifies them in one pass.

Every engine speculates with its OWN implementation, loaded or started so (never the lab's):

- llama.cpp in-process: llama-cpp-python's prompt lookup (``load_engine("llama.cpp", model, speculative=k)``:
  ``Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k))``);
- transformers: assisted generation (``draft="bfloat16"``: the model's own folder in another dtype as the
  draft, ``speculative=k``) and prompt-lookup decoding (``prompt_lookup=k``);
- mlx-lm: its speculative decoding with a draft model (``load_engine("mlx", model, draft="q8", speculative=k)``:
  ``speculative_generate_step``, the float32 folder's decoder layers quantized to 8 bits by mlx-lm's own
  ``quantize_model`` as the draft);
  its tokens' ``from_draft`` flags give the rounds (:func:`lablib.engines.mlx.draft_rounds`);
- llama-server: a draft GGUF (``--model-draft``, ``--spec-draft-n-max k``), a low-bit rung of lab 06's ladder
  (Q4_0, Q2_K) for an F16 target; its responses' ``timings`` carry ``draft_n`` and ``draft_n_accepted``;
- vLLM (its CPU build): n-gram speculation (``--speculative-config``), counted by its /metrics
  (``spec_decode_*``, per request as the delta around it).

Which engine takes which keywords is the engine's fact (``Engine.speculation_kwargs``,
``lablib.engines.servers.speculation_options``). One row per request (:data:`lablib.results.schema.SPECULATIVE`):
the engine's own counters (tokens drafted, accepted; acceptance ``alpha`` = accepted / drafted), tokens per
target pass (output tokens / (output tokens - accepted): every pass yields exactly one token of the target's
own; mlx counts its rounds, whose last can end at the budget without one: output tokens / rounds), whether the
greedy output equals the same engine's without speculation, and how the tokens arrived (a verified run comes out at
once: stamps less than :data:`BURST_GAP_S` apart count as one arrival).

The prediction beside the measurement (Leviathan et al. 2023) and the tables are
:mod:`lablib.studies.decoding.acceptance`'s (its names are re-exported here). ``c`` is measured, the draft's plain
TPOT over the target's (:func:`draft_facts`); a lookup costs 0. The model assumes verifying k + 1 tokens costs one
pass; on this CPU a small model's pass grows with its tokens, and llama-cpp-python's loop keeps every position's
logits in Python (``logits_all`` is forced with a draft model), so measured / predicted < 1 there.

Greedy equality (tests/test_speculative.py): transformers (both methods), llama-server (a Q4_0 draft), mlx-lm (its
q8 draft, k 3, prose and repetitive: its k + 1-token verification picks what its one-token decode picks) and vLLM
(n-gram, against the same vLLM without speculation: tests/test_serving_study.py) give the plain output token
for token. llama.cpp in-process can leave it
at a near tie: its multi-token batch (every verification) computes logits a few hundredths of a logit apart from
its one-token decode, so where the top two are that close (prose, position 3: 0.03 apart) the pick flips; rows
say so (``same_as_plain``, ``diverged_at``).

mlx on Linux's CPU backend has no cheaper draft: its float32 products are OpenBLAS's, its quantized and 16-bit ones
MLX's own loops, so the q8 draft's decode step costs about 1.6 to 2.3 target steps (c > 1,
:data:`lablib.engines.mlx.DRAFTS`), the predicted speedup (k + 1) / (k c + 1) stays below 1 even at alpha = 1, and
the draft's prefill (the prompt through MLX's quantized products) takes seconds where the target's takes 0.7 s, so
TTFT grows tenfold. Its alpha is high (the draft is the target, rounded). mlx is in no budget's engine list (lab 10's
runs stay as fast): run it by name, ``run(engines="mlx")`` or ``benchmarks/speculative.py --engines mlx``.
"""

from __future__ import annotations

import statistics

from lablib.checks import csv_list, whole
from lablib.config import budgets
from lablib.errors import LabError
from lablib.studies.decoding.acceptance import (  # noqa: F401 - the lab's names, one module to import
    BURST_GAP_S,
    GROUP,
    NONE,
    _metric_delta,
    _runs_from_positions,
    arrivals,
    check_k,
    expected_tokens_per_pass,
    first_divergence,
    format_table,
    parse_ks,
    position_table,
    predicted_speedup,
    spec_fields,
    speedup_table,
)
from lablib.studies.decoding.drafts import _gguf_model, _model, check_draft, draft_facts, gguf_file  # noqa: F401
from lablib.studies.decoding.texts import TEXTS  # noqa: F401 - the lab's names, one module to import

N_CTX = 512  # context of every engine and server slot here, tokens (prompts of ~70 tokens, outputs of <= 64)


def _timing_counters(trace) -> dict:
    """A server's per-response counters (llama-server's ``timings.draft_n``, ``draft_n_accepted``)."""
    t = getattr(trace, "server_timings", None) or {}
    return {k: int(t[k]) for k in ("draft_n", "draft_n_accepted") if isinstance(t.get(k), (int, float))}


def _row(trace, manifest, plain: dict | None, counters: dict, **labels) -> dict:
    from lablib.results.store import trace_row

    row = trace_row(trace, manifest, mode="single", concurrency=labels.pop("concurrency", 1), **labels)
    row["token_ids"] = list(trace.token_ids)
    row["token_arrivals"], row["max_tokens_per_arrival"] = arrivals(trace.t_tokens)
    if labels.get("spec_method", NONE) != NONE:
        row.update(spec_fields(counters, trace.output_tokens))
        if counters.get("accepted_by_position") and counters.get("drafts"):
            row.update(_runs_from_positions(counters, labels.get("k")))
    if plain is not None:
        ref = plain.get((labels.get("text_kind"), row.get("request_index")))
        if ref is not None:
            row["diverged_at"] = first_divergence(ref, row["token_ids"])
            row["same_as_plain"] = row["diverged_at"] is None
    return row


def _settings(quick=None, **override) -> dict:
    s = budgets("speculative", quick)
    s.update({k: v for k, v in override.items() if v is not None})
    s["ks"] = parse_ks(s["ks"])
    texts = csv_list(s["texts"], "texts")
    bad = [t for t in texts if t not in TEXTS]
    if bad or not texts:
        raise LabError(f"text kinds {bad or texts}: expected some of {', '.join(TEXTS)}")
    s["texts"] = texts
    s["max_new_tokens"] = whole(s["max_new_tokens"], "max_new_tokens", "a whole number of tokens, at least 1")
    return s


def _measure(engine, prompts: dict, cfg, reps: int, manifest, labels: dict, plain, root_url=None) -> list[dict]:
    """Greedy requests of every text kind (one warm-up each, then ``reps``), one row each."""
    from lablib.engines.http.metrics import speculation_counters

    rows = []
    for kind, ids in prompts.items():
        engine.generate(ids, cfg)  # warm-up (and llama-server's first-request costs)
        for rep in range(reps):
            before = speculation_counters(root_url) if root_url else {}
            tr = engine.generate(ids, cfg)
            counters = {**engine.engine_counters(), **_timing_counters(tr)}
            if root_url:
                counters.update(_metric_delta(before, speculation_counters(root_url)))
            rows.append(
                _row(tr, manifest, plain, counters, text_kind=kind, request_index=rep, repetition=rep, **labels)
            )
    return rows


def _plain_ids(rows) -> dict:
    return {(r["text_kind"], r["request_index"]): r["token_ids"] for r in rows}


def in_process_rows(
    engine: str,
    model=None,
    methods=None,
    ks=None,
    texts=None,
    max_new_tokens=None,
    reps=None,
    quick=None,
    on_row=None,
    log=print,
) -> list[dict]:
    """One in-process engine (``engine``: a load_engine name) without speculation and with each of its own
    ``methods`` (default: all its ``speculation_methods``) at each draft length of ``ks``, over the text kinds
    ``texts``; greedy, ``max_new_tokens`` tokens (EOS ignored), ``reps`` requests each after a warm-up. Rows of
    :data:`lablib.results.schema.SPECULATIVE` (a draft model's cost c measured as its plain TPOT over the target's)."""
    from lablib.engines import engine_class, load_engine
    from lablib.engines.base import GenerationConfig
    from lablib.measure.workload import text_ids
    from lablib.results.store import engine_manifest

    s = _settings(quick, ks=ks, texts=texts, max_new_tokens=max_new_tokens, reps=reps)
    rm, cls = _model(model), engine_class(engine)
    methods = list(methods or cls.speculation_methods)
    for m in methods:
        if m not in cls.speculation_methods:
            cls.speculation_kwargs(m, 1)  # its LabError names what it runs
    prompts = {t: text_ids(rm, TEXTS[t]) for t in s["texts"]}
    cfg = GenerationConfig(max_new_tokens=s["max_new_tokens"])
    emit = on_row or (lambda r: None)
    eng = load_engine(engine, rm, n_ctx=N_CTX)
    base = {"target": eng.info().dtype, "spec_method": NONE}  # the weights it computes with: Q4_1, float32
    try:
        log(f"{cls.name}: plain")
        rows = _measure(eng, prompts, cfg, s["reps"], engine_manifest(eng), base, None)
    finally:
        eng.close()
    plain_tpot = statistics.median(r["tpot_s"] for r in rows)
    for r in rows:
        emit(r)
    plain, costs = _plain_ids(rows), {}
    for method in methods:
        for k in s["ks"]:
            eng = load_engine(engine, rm, **{"n_ctx": N_CTX, **cls.speculation_kwargs(method, k)})
            try:
                log(f"{cls.name}: {method}, k={k}")
                info = eng.info().flags.get("speculative", {})
                draft = info.get("draft", "lookup")
                labels = {**base, "spec_method": method, "draft": draft, "k": k}
                new = _measure(eng, prompts, cfg, s["reps"], engine_manifest(eng), labels, plain)
            finally:
                eng.close()
            if method == "draft model":
                if method not in costs:  # once per draft: its plain TPOT does not depend on k
                    costs[method] = _draft_cost(engine, rm, info, cfg, prompts, plain_tpot)
                cost = costs[method]
                for r in new:
                    r["draft_cost"] = cost
            else:
                for r in new:
                    r["draft_cost"] = 0.0
            for r in new:
                emit(r)
            rows += new
    return rows


def _draft_cost(engine, rm, info: dict, cfg, prompts: dict, plain_tpot: float) -> float:
    """c for an in-process draft model: the draft loaded alone (the engine's ``draft_alone_kwargs`` where it has
    them, mlx's ``as_draft=``; else its dtype as the engine's weights option), its plain TPOT over the target's."""
    from lablib.engines import engine_class, load_engine

    cls = engine_class(engine)
    if hasattr(cls, "draft_alone_kwargs"):
        kw = cls.draft_alone_kwargs(info)
    else:
        kw = {cls.weights_option: info["draft_dtype"]} if cls.weights_option and info.get("draft_dtype") else {}
    eng = load_engine(engine, rm, n_ctx=N_CTX, **kw)
    try:
        ids = next(iter(prompts.values()))
        eng.generate(ids, cfg)
        return statistics.median(eng.generate(ids, cfg).tpot_s for _ in range(2)) / plain_tpot
    finally:
        eng.close()


def server_rows(
    server: str,
    model=None,
    method: str | None = None,
    drafts=None,
    ks=None,
    texts=None,
    max_new_tokens=None,
    reps=None,
    target: str | None = None,
    parallel: int = 1,
    slots: int | None = None,
    quick=None,
    on_row=None,
    log=print,
) -> list[dict]:
    """A server the lab starts (``server``: llama-server, vllm) on ``target`` (a GGUF kind of lab 06 for a GGUF
    server, default the budget's F16; the model's HF folder otherwise), without speculation and with its own
    ``method`` (default: its first, :func:`lablib.engines.servers.speculation_methods`) for each draft of
    ``drafts`` (GGUF kinds, e.g. Q4_0, Q2_K: lab 06's rungs, their KL and cost c measured by :func:`draft_facts`;
    a lookup takes none) and each k of ``ks``. ``parallel`` > 1: that many requests in flight at once (closed
    loop): where speculation fades under batching. ``slots``: the server's (default ``parallel``; vLLM's compile
    cache here is warm for 2). One server start per arm."""
    from lablib.engines.base import GenerationConfig
    from lablib.engines.servers import canonical_server, speculation_methods, speculation_options, start_server
    from lablib.measure.workload import text_ids

    s = _settings(quick, ks=ks, texts=texts, max_new_tokens=max_new_tokens, reps=reps)
    name = canonical_server(server)
    methods = speculation_methods(name)
    method = method or (methods[0] if methods else None)
    if method is None:
        raise LabError(
            f"{name} runs no speculative decoding in the lab; expected one of the servers llama-server, vllm"
        )
    rm = _model(model)
    gguf = _reads_gguf(name)
    target = (target or s["target"]) if gguf else None
    tm = _gguf_model(rm, target) if gguf else rm
    uses_draft = method == "draft model"
    drafts_given = drafts
    drafts = (
        [str(d).strip() for d in csv_list(drafts if isinstance(drafts, str) else drafts or s["drafts"], "drafts")]
        if uses_draft
        else [None]
    )
    if not drafts:  # "" reads as no items: a draft-model run with no draft would measure nothing drafted
        raise LabError(f"drafts={drafts_given!r}: expected at least one draft GGUF kind or path, e.g. Q4_0,Q2_K")
    draft_paths = {d: gguf_file(rm, d) for d in drafts if d is not None}  # checked before any server starts
    prompts = {t: text_ids(rm, TEXTS[t]) for t in s["texts"]}
    cfg = GenerationConfig(max_new_tokens=s["max_new_tokens"])
    emit = on_row or (lambda r: None)
    base = {"target": target or "source", "spec_method": NONE, "concurrency": parallel}

    def arm(options, labels, plain):
        srv = start_server(name, tm, parallel=max(slots or parallel, parallel), n_ctx=N_CTX, options=options)
        try:
            eng = srv.engine(rm)
            try:
                if parallel == 1:
                    return _measure(
                        eng, prompts, cfg, s["reps"], _server_manifest(eng, srv), labels, plain, srv.base_url
                    )
                return _parallel(eng, prompts, cfg, s["reps"], parallel, labels, plain)
            finally:
                eng.close()
        finally:
            srv.stop()

    log(f"{name}: plain, target {base['target']}, parallel {parallel}")
    rows = arm(None, base, None)
    for r in rows:
        emit(r)
    plain = _plain_ids(rows) if parallel == 1 else None
    for d in drafts:
        facts = draft_facts(rm, d, target) if d is not None else {"draft_kl": None, "draft_cost": 0.0}
        for k in s["ks"]:
            log(f"{name}: {method}, draft {d or 'lookup'}, k={k}")
            labels = {**base, "spec_method": method, "draft": d or "lookup", "k": k}
            new = arm(speculation_options(name, method, k, draft_paths.get(d)), labels, plain)
            for r in new:
                r["draft_kl"], r["draft_cost"] = facts["draft_kl"], facts["draft_cost"]
                emit(r)
            rows += new
    return rows


def _reads_gguf(name: str) -> bool:
    """Whether server ``name`` serves a GGUF (its in-process twin reads GGUF)."""
    from lablib.engines import engine_class
    from lablib.engines.servers import SERVERS

    return engine_class(SERVERS[name].twin).format == "gguf"


def _server_manifest(eng, srv) -> dict:
    from lablib.results.store import engine_manifest

    return engine_manifest(eng, {"server_settings": srv.settings})


def _parallel(eng, prompts, cfg, reps: int, parallel: int, labels: dict, plain) -> list[dict]:
    """``parallel`` clients at once (lablib.measure.load.run_load, closed loop) over every prompt ``reps`` x
    ``parallel`` times: rows with the server's per-response counters."""
    import json

    from lablib.measure.load import run_load

    rows = []
    labels = dict(labels)
    concurrency = labels.pop("concurrency")
    for kind, ids in prompts.items():
        run_load(eng, [ids] * parallel, concurrency=parallel, cfg=cfg)  # warm-up
        for r in run_load(eng, [ids] * (reps * parallel), concurrency=parallel, cfg=cfg):
            t = json.loads(r["server_timings"]) if r.get("server_timings") else {}
            counters = {k: int(t[k]) for k in ("draft_n", "draft_n_accepted") if k in t}
            r.update(labels, text_kind=kind, concurrency=concurrency)
            if labels.get("spec_method", NONE) != NONE:
                r.update(spec_fields(counters, r["output_tokens"]))
            rows.append(r)
    return rows


def run(
    engines=None,
    drafts=None,
    ks=None,
    texts=None,
    max_new_tokens=None,
    reps=None,
    parallel=None,
    model=None,
    quick=None,
    out=None,
    log=print,
) -> list[dict]:
    """Lab 10's speculative measurements: each of ``engines`` (in-process engine names and servers the lab starts;
    default: the budget's ``engines``) plain and speculating with its own methods over ``ks`` and ``texts``; a
    GGUF server also with each draft of ``drafts``, and at each ``parallel`` (the budget's: 1, then 2 streams).
    Rows appended to ``out`` (.jsonl / .parquet) as they come; returns them all."""
    from lablib.engines import ENGINES, canonical
    from lablib.engines.servers import SERVERS, canonical_server, speculation_methods

    s = _settings(quick)
    engines = engines or s["engines"]
    engines = [str(e).strip() for e in csv_list(engines, "engines") if str(e).strip()]
    servers = [_server_name(e, SERVERS, canonical_server) for e in engines]
    if drafts is not None and not any(n and speculation_methods(n)[:1] == ("draft model",) for n in servers):
        # was: ignored, the run measured without them (a helper's `lablib speculate --engine llama.cpp --draft Q9_9`)
        raise LabError(
            f"drafts={drafts!r}: only a server that drafts with a model (llama-server) takes draft GGUFs, and "
            f"none of {', '.join(engines)} does; add llama-server to the engines, or give no drafts"
        )
    writer = None
    if out:
        from lablib.results.store import ResultsWriter

        writer = ResultsWriter(out)
    emit = writer.append if writer else None
    rm = _model(model)
    kw = {"ks": ks, "texts": texts, "max_new_tokens": max_new_tokens, "reps": reps, "quick": quick, "log": log}
    rows = []
    for e in engines:
        server = _server_name(e, SERVERS, canonical_server)
        if server is None:
            name = canonical(e)
            if not ENGINES[name].speculation_methods:
                raise LabError(f"engine {name} runs no speculative decoding of its own in the lab")
            rows += in_process_rows(name, rm, on_row=emit, **kw)
            continue
        for p in [int(x) for x in (parallel or s["parallel"])]:
            rows += server_rows(server, rm, drafts=drafts, parallel=p, on_row=emit, **kw)
    return rows


def _server_name(e: str, servers, canonical_server):
    """A server name the lab starts, when ``e`` is one and not an in-process engine's name."""
    from lablib.engines import ALIASES, ENGINES

    key = e.strip().lower()
    if key in ENGINES or key in ALIASES:
        return None
    try:
        return canonical_server(key)
    except LabError:
        return None
