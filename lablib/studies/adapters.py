"""Lab 11, adapters: what a LoRA adapter costs each engine, merged and unmerged, and many adapters at once.

A LoRA adapter adds ``scale * B @ A`` to some weights (:mod:`lablib.model.adapters` makes the lab's own, of rank 8
and 64, on every attention and MLP projection). An engine either merges it into the weights (a new copy of the
model: nothing extra per step, one adapter per copy) or applies it on the fly (two thin matrix products more per
target weight and step, and many adapters can share one base model, even one batch).

Two measurements, rows of :data:`lablib.results.schema.ADAPTERS`:

- :func:`in_process_rows`: one engine (transformers, llama.cpp, mlx) without an adapter, then per rank with the
  adapter unmerged and merged; the same greedy requests in each arm (a warm-up, then ``reps``): TTFT, TPOT, the
  seconds to load the model and to attach the adapter, the bytes the adapter adds, and whether the output moved
  (``adapter_diverged_at``: the first output position that differs from the same engine without an adapter;
  None would mean the adapter was not applied) and whether merged equals unmerged (``merged_diverged_at``).
- :func:`multi_lora_rows`: a server the lab starts (llama-server, vLLM) with several adapters loaded; a closed
  loop of C clients where every request uses the base model (``adapter_mix`` "none"), all use the same adapter
  ("same"), or every request in flight uses a different one ("distinct": request i uses adapter i mod C); and
  the first request of each adapter ("first use": what loading or swapping one costs the server).

:func:`cost_table` and :func:`multi_table` make the tables lab 11 shows; :mod:`lablib.plots.adapters` draws them.
"""

from __future__ import annotations

import statistics

from lablib.checks import csv_list, positive_ints, whole
from lablib.config import budgets
from lablib.errors import LabError
from lablib.studies.compare import NEAR_TIE_NATS, first_difference  # noqa: F401 - lab 04's names, the lab's too

N_CTX = 512  # context of every engine and server slot here, tokens
ARMS = ("none", "unmerged", "merged")  # adapter_arm: no adapter, applied on the fly, merged into the weights
MIXES = ("none", "same", "distinct", "first use")  # adapter_mix of the multi-LoRA loop


def _settings(quick=None, **override) -> dict:
    s = budgets("adapters", quick)
    s.update({k: v for k, v in override.items() if v is not None})
    s["ranks"] = positive_ints(s["ranks"], "ranks")
    s["concurrency"] = positive_ints(s["concurrency"], "concurrency")
    for key, what in (
        ("max_new_tokens", "at least 1 token"),
        ("prompt_tokens", "at least 1 token"),
        ("reps", "at least 1 request"),
        ("requests_per_client", "at least 1 request"),
    ):
        s[key] = whole(s[key], key, what, strings=True)
    return s


def target_shapes(dims: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of each target weight of one decoder layer of a model of shape ``dims``
    (:func:`lablib.model.shape.model_dims`), by PEFT's module name: q and o are hidden x heads*head_dim, k and v
    hidden x kv_heads*head_dim, gate and up hidden x intermediate, down intermediate x hidden."""
    d, q, kv, i = (
        dims["hidden"],
        dims["heads"] * dims["head_dim"],
        dims["kv_heads"] * dims["head_dim"],
        dims["intermediate"],
    )
    return {
        "q_proj": (d, q),
        "k_proj": (d, kv),
        "v_proj": (d, kv),
        "o_proj": (q, d),
        "gate_proj": (d, i),
        "up_proj": (d, i),
        "down_proj": (i, d),
    }


def size_table(model=None, ranks=(8, 16, 64), targets=None) -> list[dict]:
    """What a LoRA adapter of each rank is, against the model, from the model's shape alone (nothing is made):
    its parameters (rank x (in + out) per target weight and layer), their share of the model's parameters, its
    bytes in float32 and float16, and the FLOPs it adds to one decoded token (2 per parameter: x @ A, then @ B)
    over the model's matrix FLOPs per token (2 per weight in a matrix product, the LM head included): the share
    an unmerged adapter adds to a decode step if only arithmetic counted."""
    from lablib.model.adapters import TARGETS
    from lablib.model.resolve import resolve
    from lablib.model.shape import matmul_weights, model_dims, parameters

    dims = model_dims(resolve(model) if not isinstance(model, (dict, str)) or model is None else model)
    shapes = {k: v for k, v in target_shapes(dims).items() if k in (targets or TARGETS)}
    weights = matmul_weights(dims)["total"]
    out = []
    for r in positive_ints(ranks, "ranks"):
        n = dims["layers"] * sum(r * (i + o) for i, o in shapes.values())
        out.append(
            {
                "adapter_rank": r,
                "adapter_parameters": n,
                "model_parameters": parameters(dims),
                "parameter_share": n / parameters(dims),
                "bytes_f32": 4 * n,
                "bytes_f16": 2 * n,
                "flops_share": n / weights,
            }
        )
    return out


def in_process_rows(
    engine: str,
    model=None,
    ranks=None,
    prompt_tokens=None,
    max_new_tokens=None,
    reps=None,
    quick=None,
    on_row=None,
    log=print,
) -> list[dict]:
    """One in-process engine without an adapter, then for each of ``ranks`` with the lab's adapter of that rank
    unmerged and merged (:mod:`lablib.model.adapters`); greedy requests of a ``prompt_tokens`` prompt and
    ``max_new_tokens`` output tokens (EOS ignored). Every arm is loaded at once and warmed up, then measured in
    turn, ``reps`` rounds of one request per arm (a machine whose speed drifts moves every arm alike; the memory
    is the arms' together: five copies of a 135M model in float32 are about 2.7 GB). One row per request: the
    request's metrics, the arm (``adapter``, ``adapter_rank``, ``adapter_arm``), the engine's ``load_s`` and
    ``adapter_load_s`` and ``adapter_bytes``, and where its output departs from the no-adapter arm's
    (``adapter_diverged_at``) and, merged, from the unmerged arm's (``merged_diverged_at``)."""
    from lablib.engines import adapter_engines, canonical, engine_class, load_engine
    from lablib.engines.base import GenerationConfig
    from lablib.measure.workload import prompt_of_length
    from lablib.model.adapters import make_adapter
    from lablib.model.resolve import resolve
    from lablib.results.store import engine_manifest, trace_row
    from lablib.results.trace import now

    s = _settings(quick, ranks=ranks, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, reps=reps)
    name = canonical(engine)
    cls = engine_class(name)
    if not getattr(cls, "adapter_form", None):
        raise LabError(
            f"engine {name} loads no LoRA adapter in the lab; expected one of {', '.join(adapter_engines()) or 'none'}"
        )
    rm = resolve(model)
    ids = prompt_of_length(rm, s["prompt_tokens"])
    cfg = GenerationConfig(max_new_tokens=s["max_new_tokens"])
    emit = on_row or (lambda r: None)
    adapters = {r: make_adapter(rm, rank=r, forms=(cls.adapter_form,), log=log) for r in s["ranks"]}
    rows: list[dict] = []
    arms = [(None, "none")] + [(r, arm) for r in s["ranks"] for arm in ("unmerged", "merged")]
    loaded: list[tuple] = []  # (engine, manifest, labels): every arm held at once, measured in turn
    try:
        for rank, arm in arms:
            ad = adapters.get(rank)
            kw = {"adapter": ad, "merge_adapter": arm == "merged"} if ad is not None else {}
            log(f"{name}: loading " + ("no adapter" if ad is None else f"adapter {ad.name} {arm}"))
            t0 = now()
            eng = load_engine(name, rm, n_ctx=N_CTX, **kw)
            load_s = now() - t0
            eng.generate(ids, cfg)  # warm-up
            labels = {
                "adapter": ad.name if ad else None,
                "adapter_rank": rank,
                "adapter_arm": arm,
                "load_s": load_s,
                "adapter_load_s": getattr(eng, "adapter_load_s", None),
                "adapter_bytes": getattr(eng, "adapter_bytes", None) or 0,
                "adapter_parameters": ad.parameters if ad else 0,
            }
            loaded.append((eng, engine_manifest(eng), labels))
        # repetition by repetition, every arm in turn: a machine that slows down or speeds up during the run moves
        # every arm alike, not the arms measured last
        log(f"{name}: measuring {len(loaded)} arms x {s['reps']} requests, in turn")
        for rep in range(s["reps"]):
            for eng, manifest, labels in loaded:
                tr = eng.generate(ids, cfg)
                row = trace_row(tr, manifest, mode="single", concurrency=1, repetition=rep, request_index=rep, **labels)
                row["token_ids"] = list(tr.token_ids)
                rows.append(row)
        base_ids = next(r["token_ids"] for r in rows if r["adapter_arm"] == "none")
        unmerged_ids = {r["adapter_rank"]: r["token_ids"] for r in rows if r["adapter_arm"] == "unmerged"}
        engines = {(lab["adapter_rank"], lab["adapter_arm"]): eng for eng, _, lab in loaded}
        for row in rows:
            arm, rank, out = row["adapter_arm"], row["adapter_rank"], row["token_ids"]
            if arm != "none":
                row["adapter_diverged_at"] = first_difference(base_ids, out)
            if arm == "merged":
                ref = unmerged_ids[rank]
                at = row["merged_diverged_at"] = first_difference(ref, out)
                if at is not None and at < len(ref):
                    row["merged_margin_nats"] = _margin(engines[rank, arm], ids + ref[:at])
            emit(row)
    finally:
        for eng, *_ in loaded:
            eng.close()
    return rows


def _margin(eng, ids) -> float | None:
    """The top-2 log-probability margin (nats) of ``eng``'s next token after ``ids``: below
    :data:`lablib.studies.compare.NEAR_TIE_NATS` a flip there is a near tie (numerics), as lab 04 calls it."""
    import numpy as np

    from lablib.studies.logits import last_logits, log_softmax

    try:
        top = np.sort(log_softmax(last_logits(eng, list(ids))))[-2:]
    except NotImplementedError:
        return None
    return float(top[1] - top[0])


def multi_lora_rows(
    server: str,
    model=None,
    concurrency=None,
    rank=None,
    prompt_tokens=None,
    max_new_tokens=None,
    requests_per_client=None,
    quick=None,
    on_row=None,
    log=print,
) -> list[dict]:
    """A server the lab starts (llama-server, vllm) with as many adapters of ``rank`` (default: the budget's
    first) as the largest of ``concurrency`` (seeds 0, 1, ...), and as many slots; first one request of each
    adapter in turn (``adapter_mix`` "first use", then one more of the same: "first use" rows carry
    ``repetition`` 0 and 1), then at each C of ``concurrency`` a closed loop of C clients, ``requests_per_client``
    x C requests of distinct prompts, three times: every request on the base model ("none"), every request on
    adapter 0 ("same"), request i on adapter i mod C ("distinct": the requests in flight use C different
    adapters). One row per request (:func:`lablib.measure.load.run_load`'s, with the adapter's name)."""
    from lablib.engines.base import GenerationConfig
    from lablib.engines.servers import canonical_server, start_server
    from lablib.measure.load import run_load
    from lablib.measure.workload import distinct_prompts
    from lablib.model.adapters import make_adapter
    from lablib.model.resolve import resolve
    from lablib.results.store import engine_manifest

    s = _settings(
        quick,
        concurrency=concurrency,
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new_tokens,
        requests_per_client=requests_per_client,
    )
    name = canonical_server(server)
    rank = whole(rank if rank is not None else s["ranks"][0], "rank", "a whole number, at least 1")
    rm = resolve(model)
    form = "gguf" if name == "llama-server" else "peft"
    n = max(s["concurrency"])
    adapters = [make_adapter(rm, rank=rank, seed=i, forms=(form,), log=log) for i in range(n)]
    cfg = GenerationConfig(max_new_tokens=s["max_new_tokens"])
    emit = on_row or (lambda r: None)
    rows: list[dict] = []
    log(f"{name}: starting with {n} adapters of rank {rank}")
    srv = start_server(name, rm, parallel=n, n_ctx=N_CTX, options={"adapters": adapters}, log=log)
    try:
        eng = srv.engine(rm)
        try:
            manifest = engine_manifest(eng, {"server_settings": srv.settings})
            labels = {"adapter_rank": rank, "adapters_loaded": n}
            start = 0

            def prompts(count):
                nonlocal start
                out = distinct_prompts(rm, s["prompt_tokens"], count, start=start * (s["prompt_tokens"] + 17))
                start += count
                return out

            run_load(eng, prompts(1), concurrency=1, cfg=cfg)  # warm-up of the server (base model)
            for ad in adapters:  # first use of each adapter, then its second request
                for rep in range(2):
                    for r in run_load(eng, prompts(1), concurrency=1, cfg=cfg, adapters=[ad.name], manifest=manifest):
                        r.update(labels, adapter_mix="first use", repetition=rep, adapter=ad.name)
                        rows.append(r)
                        emit(r)
            for c in s["concurrency"]:
                count = c * s["requests_per_client"]
                for mix in ("none", "same", "distinct"):
                    names = {
                        "none": [None] * count,
                        "same": [adapters[0].name] * count,
                        "distinct": [adapters[i % c].name for i in range(count)],
                    }[mix]
                    log(f"{name}: {c} clients, adapters {mix}")
                    ps = prompts(count)
                    run_load(eng, ps[:c], concurrency=c, cfg=cfg, adapters=names[:c])  # warm-up at this shape
                    for r in run_load(eng, ps, concurrency=c, cfg=cfg, adapters=names, manifest=manifest):
                        r.update(labels, adapter_mix=mix)
                        r.setdefault("adapter", names[r["request_index"]])
                        rows.append(r)
                        emit(r)
        finally:
            eng.close()
    finally:
        srv.stop()
    return rows


def run(
    engines=None,
    servers=None,
    ranks=None,
    concurrency=None,
    prompt_tokens=None,
    max_new_tokens=None,
    reps=None,
    model=None,
    quick=None,
    out=None,
    log=print,
) -> list[dict]:
    """Lab 11's measurements: :func:`in_process_rows` for each of ``engines`` and :func:`multi_lora_rows` for
    each of ``servers`` (defaults: the budget's; "" or [] for none). Rows appended to ``out`` (.jsonl /
    .parquet) as they come; returns them all."""
    from lablib.engines import canonical
    from lablib.engines.servers import canonical_server
    from lablib.model.resolve import resolve

    s = _settings(quick)
    engines = [canonical(e) for e in csv_list(s["engines"] if engines is None else engines, "engines")]
    servers = [canonical_server(x) for x in csv_list(s["servers"] if servers is None else servers, "servers")]
    writer = None
    if out:
        from lablib.results.store import ResultsWriter

        writer = ResultsWriter(out)
    emit = writer.append if writer else None
    rm = resolve(model)
    rows: list[dict] = []
    kw = {"prompt_tokens": prompt_tokens, "max_new_tokens": max_new_tokens, "quick": quick, "log": log}
    for e in engines:
        rows += in_process_rows(e, rm, ranks=ranks, reps=reps, on_row=emit, **kw)
    for x in servers:
        rows += multi_lora_rows(x, rm, concurrency=concurrency, on_row=emit, **kw)
    return rows


# --- tables ---------------------------------------------------------------------------------------------------


def _median(values):
    v = [x for x in values if x is not None and x == x]
    return statistics.median(v) if v else None


def cost_table(rows) -> list[dict]:
    """One row per engine x rank x arm of :func:`in_process_rows`' rows: the medians of TTFT and TPOT (s), TPOT
    over the same engine's no-adapter TPOT (``tpot_vs_none``), the seconds to load the engine (``load_s``) and to
    attach the adapter (``adapter_load_s``), the adapter's bytes in the engine (``adapter_bytes``) and parameters,
    whether its output moved from the no-adapter output (``changed``) and whether merged equals unmerged
    (``same_as_unmerged``: "yes", "near tie" where they first differ at a top-2 margin below lab 04's
    NEAR_TIE_NATS, or "no"; None for the other arms), and the requests."""
    import pandas as pd

    df = pd.DataFrame([r for r in rows if r.get("adapter_arm")])
    if df.empty:
        return []
    out = []
    order = {a: i for i, a in enumerate(ARMS)}
    for (engine, rank, arm), g in df.groupby(["engine", df["adapter_rank"].fillna(0), "adapter_arm"], sort=False):
        none_tpot = _median(df[(df.engine == engine) & (df.adapter_arm == "none")]["tpot_s"])
        tpot = _median(g["tpot_s"])
        diverged = g["adapter_diverged_at"] if "adapter_diverged_at" in g else pd.Series([None] * len(g))
        merged = g["merged_diverged_at"] if "merged_diverged_at" in g else pd.Series([None] * len(g))
        out.append(
            {
                "engine": engine,
                "adapter_rank": int(rank) if rank else None,
                "adapter_arm": arm,
                "ttft_s": _median(g["ttft_s"]),
                "tpot_s": tpot,
                "tpot_vs_none": tpot / none_tpot if tpot and none_tpot else None,
                "load_s": _median(g["load_s"]),
                "adapter_load_s": _median(g["adapter_load_s"]) if arm == "unmerged" else None,
                "adapter_bytes": int(g["adapter_bytes"].max() or 0),
                "adapter_parameters": int(g["adapter_parameters"].max() or 0),
                "changed": None if arm == "none" else bool(diverged.notna().all()),
                "same_as_unmerged": _same(g, merged) if arm == "merged" else None,
                "requests": len(g),
            }
        )
    return sorted(out, key=lambda r: (r["engine"], r["adapter_rank"] or 0, order.get(r["adapter_arm"], 9)))


def _same(g, merged) -> str:
    """ "yes" (merged ids equal unmerged ids in every request), "near tie" (they differ first where the top two
    next tokens were closer than lab 04's NEAR_TIE_NATS), or "no"."""
    if merged.isna().all():
        return "yes"
    margins = g["merged_margin_nats"] if "merged_margin_nats" in g else []
    near = [m for m, d in zip(margins, merged) if d == d and d is not None]
    return "near tie" if near and all(m is not None and m == m and m < NEAR_TIE_NATS for m in near) else "no"


def multi_table(rows) -> list[dict]:
    """One row per server (``engine``: its kind, llama-server or vllm) x clients x adapter mix of
    :func:`multi_lora_rows`' closed loops: output tokens per
    second of the whole run (all output tokens over first send to last token), the medians of TTFT and TPOT,
    the run's throughput over the same server's at the same clients with no adapter (``tput_vs_none``), and
    the requests; "first use" rows give one row per server: the median TTFT of an adapter's first request and
    of its second (``ttft_first_s``, ``ttft_second_s``)."""
    import pandas as pd

    df = pd.DataFrame([r for r in rows if r.get("adapter_mix") and not r.get("error")])
    if df.empty:
        return []
    # rows of the http engine: the server it talked to names the series (llama-server, vllm)
    df["engine"] = df["server"].fillna(df["engine"]) if "server" in df else df["engine"]
    out = []
    loops = df[df.adapter_mix != "first use"]
    tput = {}
    for (engine, c, mix), g in loops.groupby(["engine", "concurrency", "adapter_mix"], sort=False):
        span = g["t_last_token"].max() - g["t_submit"].min()
        tput[(engine, c, mix)] = g["output_tokens"].sum() / span if span > 0 else None
    for (engine, c, mix), g in loops.groupby(["engine", "concurrency", "adapter_mix"], sort=False):
        t, none = tput[(engine, c, mix)], tput.get((engine, c, "none"))
        out.append(
            {
                "engine": engine,
                "concurrency": int(c),
                "adapter_mix": mix,
                "output_tps": t,
                "tput_vs_none": t / none if t and none else None,
                "ttft_s": _median(g["ttft_s"]),
                "tpot_s": _median(g["tpot_s"]),
                "requests": len(g),
            }
        )
    first = df[df.adapter_mix == "first use"]
    for engine, g in first.groupby("engine", sort=False):
        out.append(
            {
                "engine": engine,
                "concurrency": 1,
                "adapter_mix": "first use",
                "ttft_first_s": _median(g[g.repetition == 0]["ttft_s"]),
                "ttft_second_s": _median(g[g.repetition == 1]["ttft_s"]),
                "requests": len(g),
            }
        )
    order = {m: i for i, m in enumerate(MIXES)}
    return sorted(out, key=lambda r: (r["engine"], order.get(r["adapter_mix"], 9), r["concurrency"]))


def format_cost_table(table) -> str:
    """:func:`cost_table` as text: one line per engine x rank x arm."""
    lines = [
        f"{'engine':<13}{'rank':>5} {'arm':<9}{'TTFT ms':>9}{'TPOT ms':>9}{'x none':>8}{'load s':>8}"
        f"{'attach s':>9}{'adapter MB':>11}  changed  merged=unmerged"
    ]
    for r in table:

        def f(v, scale=1.0, fmt="{:.1f}"):
            return fmt.format(v * scale) if v is not None else "-"

        lines.append(
            f"{r['engine']:<13}{r['adapter_rank'] or '-':>5} {r['adapter_arm']:<9}{f(r['ttft_s'], 1e3):>9}"
            f"{f(r['tpot_s'], 1e3):>9}{f(r['tpot_vs_none'], fmt='{:.2f}'):>8}{f(r['load_s'], fmt='{:.2f}'):>8}"
            f"{f(r['adapter_load_s'], fmt='{:.2f}'):>9}{f(r['adapter_bytes'], 1e-6):>11}  "
            f"{'-' if r['changed'] is None else ('yes' if r['changed'] else 'NO'):<8} "
            f"{r['same_as_unmerged'] or '-'}"
        )
    return "\n".join(lines)


def format_multi_table(table) -> str:
    """:func:`multi_table` as text."""
    lines = [f"{'server':<14}{'clients':>8} {'adapters':<10}{'tok/s':>8}{'x none':>8}{'TTFT ms':>9}{'TPOT ms':>9}"]
    for r in table:
        if r["adapter_mix"] == "first use":
            a, b = r.get("ttft_first_s"), r.get("ttft_second_s")
            lines.append(
                f"{r['engine']:<14}{'1':>8} {'first use':<10} TTFT of an adapter's first request "
                f"{a * 1e3 if a else float('nan'):.1f} ms, its second {b * 1e3 if b else float('nan'):.1f} ms"
            )
            continue

        def f(v, scale=1.0, fmt="{:.1f}"):
            return fmt.format(v * scale) if v is not None else "-"

        lines.append(
            f"{r['engine']:<14}{r['concurrency']:>8} {r['adapter_mix']:<10}{f(r['output_tps']):>8}"
            f"{f(r['tput_vs_none'], fmt='{:.2f}'):>8}{f(r['ttft_s'], 1e3):>9}{f(r['tpot_s'], 1e3):>9}"
        )
    return "\n".join(lines)
