"""Figures a learner can read when one engine is 100x slower than another (MLX on Linux against llama.cpp),
and widgets and tables that fit JupyterLab's page: each figure rendered from rows built by hand, and what
it draws checked (trace names, axis types, the values shown). No engine, no timing."""

import math

import pandas as pd
import pytest

from lablib import plots
from lablib.plots import quant as quant_plots
from lablib.plots.serving import rate_sweep

# prefill tokens/s and TPOT (s) per engine: mlx takes 100x llama.cpp's time in both phases
SPEEDS = {"transformers": (300.0, 0.06), "llama.cpp": (900.0, 0.02), "mlx": (9.0, 2.0)}
ENGINES = tuple(SPEEDS)


def context_rows(lengths=(64, 256), reps=3, output_tokens=16):
    """Context-sweep rows as the lab writes them (the columns the figures need), repetitions 5% apart."""
    rows, t = [], 0.0
    for engine, (tps, tpot) in SPEEDS.items():
        for n in lengths:
            for rep in range(reps):
                f = 1 + 0.05 * rep
                prefill, tp = n / tps * f * (1 + n / 2048), tpot * f * (1 + n / 4096)
                decode = (output_tokens - 1) * tp
                rows.append(
                    dict(
                        engine=engine,
                        sweep="context",
                        mode="single",
                        concurrency=1,
                        repetition=rep,
                        request_index=rep,
                        prompt_tokens=n,
                        output_tokens=output_tokens,
                        prefill_s=prefill,
                        prefill_tps=n / prefill,
                        tpot_s=tp,
                        decode_tps=1 / tp,
                        decode_s=decode,
                        queue_s=0.0,
                        ttft_s=prefill,
                        e2e_s=prefill + decode,
                        t_submit=t,
                        t_start=t,
                        t_first_token=t + prefill,
                        t_last_token=t + prefill + decode,
                        dtype="float32",
                    )
                )
                t += prefill + decode
    return pd.DataFrame(rows)


def concurrency_rows(levels=(1, 2, 4), requests=4):
    """Closed-loop rows: serial runs one request at a time, batched all at once; mlx 100x slower."""
    rows = []
    for engine, (tps, tpot) in SPEEDS.items():
        prefill, decode = 64 / tps, 15 * tpot
        for mode in ("serial", "batched"):
            for c in levels:
                free, busy = [0.0] * c, 0.0
                for i in range(requests):
                    k = min(range(c), key=free.__getitem__)
                    submit = free[k]
                    start = max(submit, busy) if mode == "serial" else submit
                    first, last = start + prefill, start + prefill + decode
                    busy = last if mode == "serial" else busy
                    free[k] = last
                    rows.append(
                        dict(
                            engine=engine,
                            sweep="concurrency",
                            mode=mode,
                            concurrency=c,
                            run_id=f"{engine}-{mode}-{c}",
                            request_index=i,
                            prompt_tokens=64,
                            output_tokens=16,
                            queue_s=start - submit,
                            ttft_s=first - submit,
                            prefill_s=prefill,
                            decode_s=decode,
                            tpot_s=tpot,
                            e2e_s=last - submit,
                            t_submit=submit,
                            t_start=start,
                            t_first_token=first,
                            t_last_token=last,
                        )
                    )
    return pd.DataFrame(rows)


def by_name(fig, name):
    found = [t for t in fig.data if t.name == name]
    assert len(found) == 1, f"{name!r}: {[t.name for t in fig.data]}"
    return found[0]


# --- lab 01: one prompt, three engines ------------------------------------------------------------
def test_prefill_decode_bars_shares_and_log_seconds_with_a_100x_slower_engine():
    df = context_rows(lengths=(37,), reps=2)
    fig = plots.prefill_decode_bars(df)
    med = df.groupby("engine", sort=False)[["prefill_s", "decode_s"]].median()
    share = {p: next(t for t in fig.data if t.name == p and t.showlegend is False) for p in ("prefill", "decode")}
    seconds = {p: by_name(fig, f"{p} (s)") for p in ("prefill", "decode")}
    assert list(share["prefill"].x) == list(ENGINES) == list(seconds["decode"].x)
    for i, engine in enumerate(ENGINES):
        total = med.loc[engine, "prefill_s"] + med.loc[engine, "decode_s"]
        # top: each engine's split of its own time, summing to 1, decode stacked on prefill
        assert share["prefill"].y[i] + share["decode"].y[i] == pytest.approx(1.0)
        assert share["prefill"].y[i] == pytest.approx(med.loc[engine, "prefill_s"] / total)
        assert share["decode"].base[i] == share["prefill"].y[i]
        # bottom: the medians themselves, in seconds
        assert seconds["prefill"].y[i] == med.loc[engine, "prefill_s"]
        assert seconds["decode"].y[i] == med.loc[engine, "decode_s"]
    assert fig.layout.yaxis2.range == (0, 1) and fig.layout.yaxis2.tickformat == ".0%"  # the shares, on top
    assert fig.layout.yaxis.type == "log" and "log" in fig.layout.yaxis.title.text  # the seconds, below
    # the log axis starts below the shortest bar (llama.cpp's prefill), so it keeps a visible height
    lo, hi = fig.layout.yaxis.range
    assert lo < math.log10(med["prefill_s"].min()) and hi > math.log10(med["decode_s"].max())
    assert "mlx takes 100x as long as llama.cpp" in fig.layout.title.text
    assert "read its split on top, its seconds below" in fig.layout.title.text
    assert [t.texttemplate for t in seconds.values()] == ["%{y:.3g} s"] * 2  # the seconds, written on the bars


# --- lab 02: the context sweep --------------------------------------------------------------------
def test_context_bars_every_engine_split_readable_beside_a_100x_slower_one():
    df = context_rows(lengths=(256, 64, 1024))
    fig = plots.context_bars(df)
    assert {t.name for t in fig.data} == {
        f"{e} · {p}{s}" for e in ENGINES for p in ("prefill", "decode") for s in ("", " (s)")
    }
    assert [t.name for t in fig.data if t.showlegend is not False] == [
        f"{e} · {p}" for e in ENGINES for p in ("prefill", "decode")
    ]
    for engine in ENGINES:
        pre, dec = by_name(fig, f"{engine} · prefill"), by_name(fig, f"{engine} · decode")
        pre_s, dec_s = by_name(fig, f"{engine} · prefill (s)"), by_name(fig, f"{engine} · decode (s)")
        assert list(pre.x) == ["64", "256", "1024"]
        for i, n in enumerate((64, 256, 1024)):
            rows = df[(df.engine == engine) & (df.prompt_tokens == n)]
            assert pre.y[i] + dec.y[i] == pytest.approx(1.0)
            assert pre_s.y[i] == rows.prefill_s.median() and dec_s.y[i] == rows.decode_s.median()
        # prefill's share grows with the prompt, in the slow engine as in the fast ones
        assert list(pre.y) == sorted(pre.y)
        # one column per engine on top, its two phases side by side below, within that column
        assert pre.offset == dec.offset and pre.width == dec.width
        assert pre.offset <= pre_s.offset < dec_s.offset and dec_s.offset + dec_s.width <= pre.offset + pre.width
        assert {pre.legendgroup, pre_s.legendgroup} == {engine}  # one click hides the engine in both panels
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis2.range == (0, 1)
    # one axis of prompt lengths, labelled below: plotly's first x axis (tests/test_browser.py reads its ticks)
    assert fig.layout.xaxis2.matches == "x" and fig.layout.xaxis2.showticklabels is False
    assert fig.layout.xaxis.title.text == "prompt length (tokens)" and fig.layout.xaxis.showticklabels is not False
    assert "at 1024 prompt tokens mlx takes 100x as long as llama.cpp" in fig.layout.title.text


def test_context_lines_on_log_axes_keep_every_engine_readable():
    df = context_rows(lengths=(64, 256, 1024))
    fig = plots.context_lines(df)
    assert fig.layout.yaxis.type == fig.layout.yaxis2.type == "log"
    assert "log" in fig.layout.yaxis.title.text and "log" in fig.layout.yaxis2.title.text
    for engine in ENGINES:
        left, right = [t for t in fig.data if t.name == engine]
        rows = df[(df.engine == engine) & (df.prompt_tokens == 1024)]
        assert left.y[-1] == pytest.approx(rows.prefill_tps.median())
        assert right.y[-1] == pytest.approx(1000 * rows.tpot_s.median())
    assert "slope" in fig.layout.title.text


# --- lab 03: concurrency --------------------------------------------------------------------------
def test_concurrency_lines_log_axes_with_a_100x_slower_engine():
    df = concurrency_rows()
    fig = plots.concurrency_lines(df)
    assert [fig.layout[f"yaxis{s}"].type for s in ("", "2", "3")] == ["log"] * 3
    assert {t.name for t in fig.data} == {f"{e} · {m}" for e in ENGINES for m in ("serial", "batched")}
    for engine in ENGINES:
        tps, p50, p95 = [t for t in fig.data if t.name == f"{engine} · serial"]
        run = df[(df.engine == engine) & (df["mode"] == "serial") & (df.concurrency == 4)]
        assert tps.y[-1] == pytest.approx(run.output_tokens.sum() / (run.t_last_token.max() - run.t_submit.min()))
        assert p95.y[-1] == pytest.approx(1000 * run.ttft_s.quantile(0.95))
    assert fig.layout.title.text.startswith("Concurrency: does batching raise throughput")


def test_timeline_gives_each_engine_its_own_time_axis():
    df = concurrency_rows(levels=(2,))
    fig = plots.timeline(df)
    axes = [k for k in fig.layout if k.startswith("xaxis")]
    assert len(axes) == 2 * len(ENGINES) and all(fig.layout[k].matches is None for k in axes)
    spans = [a.text for a in fig.layout.annotations]
    assert any(t.startswith("mlx · serial: 4 requests in") for t in spans)
    assert "own time axis" in fig.layout.title.text


# --- lab 05: servers under a rate sweep -----------------------------------------------------------
def sweep_table():
    """rate_sweep_table rows: a one-slot server queues past ~2 requests/s; a four-slot one keeps up; a slow
    one 100x slower in TTFT."""
    rows = []
    for server, ttft, tpot in (("llama-cpp-python", 0.05, 0.02), ("llama-server", 0.06, 0.04), ("slow", 5.0, 2.0)):
        for rate in (0.5, 1.0, 4.0):
            queued = server == "llama-cpp-python" and rate > 2
            rows.append(
                dict(
                    server=server,
                    rate=rate,
                    output_tps=rate * 8,
                    ttft_p50_s=ttft,
                    ttft_p95_s=ttft * (40 if queued else 1),
                    tpot_p50_s=tpot * (1 + rate / 8),
                    goodput_rps=0.0 if server == "slow" else (1.0 if queued else rate),
                    goodput_fraction=0.0 if server == "slow" else (0.25 if queued else 1.0),
                    errors=0,
                )
            )
    return pd.DataFrame(rows)


def test_rate_sweep_draws_one_line_per_server_in_each_panel():
    table = sweep_table()
    assert plots.rate_sweep is rate_sweep  # lab 05 calls it as plots.rate_sweep
    fig = rate_sweep(table, ttft_s=1.0, tpot_s=0.1)
    assert fig.layout.title.text.startswith("Goodput and TTFT p95")  # tests/test_browser.py finds it by this
    servers = ["llama-cpp-python", "llama-server", "slow"]
    names = [t.name for t in fig.data]
    assert names[0].startswith("arrival rate") and [n for n in names[1:]] == [s for s in servers for _ in range(3)]
    assert all(len(t.x) == 3 for t in fig.data)  # one point per rate, each trace (the browser test's rule)
    assert [t.name for t in fig.data if t.showlegend is not False] == [names[0], *servers]
    for server in servers:
        good, ttft, tpot = [t for t in fig.data if t.name == server]
        rows = table[table.server == server]
        assert list(good.x) == [0.5, 1.0, 4.0]
        assert list(good.y) == list(rows.goodput_rps)
        assert list(ttft.y) == list(rows.ttft_p95_s)
        assert list(tpot.y) == pytest.approx(list(rows.tpot_p50_s * 1000))
        assert list(good.customdata[:, 0]) == list(rows.goodput_fraction)  # the share within targets, in hover
        assert (good.xaxis, ttft.xaxis, tpot.xaxis) == ("x", "x2", "x3")
    assert list(fig.data[0].y) == [0.5, 1.0, 4.0]  # goodput = the arrival rate: every request within targets
    assert fig.layout.xaxis.type == fig.layout.xaxis2.type == "log"
    assert fig.layout.yaxis.type != "log" and fig.layout.yaxis2.type == fig.layout.yaxis3.type == "log"
    assert fig.layout.yaxis.title.text == "goodput (requests/s)" and "(s)" in fig.layout.yaxis2.title.text
    assert fig.layout.xaxis.title.text == "arrival rate (requests/s)"
    titles = [a.text for a in fig.layout.annotations]
    assert "Goodput: requests/s within every target" in titles and not any("variable=" in t for t in titles)
    # the targets: dashed lines at their values, labels at their log10 (annotations on a log axis)
    assert sorted(s.y0 for s in fig.layout.shapes) == [1.0, 100.0]
    labels = {a.text: a.y for a in fig.layout.annotations if " target " in a.text}
    assert labels == {"TTFT target 1 s": 0.0, "TPOT target 100 ms": 2.0}
    # both targets inside their panels' ranges, as are the slow server's points
    assert fig.layout.yaxis2.range[0] < 0 < fig.layout.yaxis2.range[1]
    assert fig.layout.yaxis2.range[1] > math.log10(5.0)


def test_lab_05s_reference_sweep_is_shipped_and_drawn_beside_the_quick_one():
    """Lab 05's quick run is too small to rank its servers, so it draws the full sweep measured on the lab's
    machine (data/reference/serving-rates-*.jsonl, benchmarks/serving_reference.py) beside it: the three
    servers at the full sweep's five rates, 12 requests each, every goodput drawn as the file gives it."""
    from lablib.errors import LabError
    from lablib.studies import serving

    ref = serving.reference_rate_sweep()
    full = serving.quick_defaults(quick=False)
    assert set(ref["server"]) == {"llama-cpp-python", "llama-server", "vllm"}
    assert sorted(set(ref["rate"])) == sorted(float(r) for r in full["rates"])
    assert (ref["requests"] == full["requests"]).all() and (ref["errors"] == 0).all()
    assert ref["hostname"].notna().all() and ref["cpu_model"].notna().all()  # the machine it was measured on
    fig = rate_sweep(ref, ttft_s=ref["ttft_s"].iloc[0], tpot_s=ref["tpot_s"].iloc[0])
    for server, rows in ref.groupby("server"):
        good = next(t for t in fig.data if t.name == server)
        rows = rows.sort_values("rate")
        assert list(good.x) == list(rows["rate"]) and list(good.y) == list(rows["goodput_rps"])
    with pytest.raises(
        LabError,
        match=r"no serving-rates reference of 'nowhere' .*serving-rates-nowhere.jsonl, written by benchmarks/serving_reference",
    ):
        serving.reference_rate_sweep("nowhere")


def test_rate_sweep_without_targets_and_refusals():
    fig = rate_sweep(sweep_table().to_dict("records"))
    assert not fig.layout.shapes
    with pytest.raises(Exception, match="goodput_rps"):
        rate_sweep(sweep_table().drop(columns=["goodput_rps"]))
    with pytest.raises(Exception, match="no rows"):
        rate_sweep(sweep_table().iloc[0:0])


# --- lab 06: the quantization ladder --------------------------------------------------------------
def ladder_rows():
    rows = [
        dict(engine="llama.cpp", type=t, bytes=b, kl_mean=kl, decode_tps=v, bytes_per_token=b)
        for t, b, kl, v in (("Q8_0", 145e6, 0.004, 120.0), ("Q4_0", 85e6, 0.05, 150.0), ("Q2_K", 70e6, 0.4, 110.0))
    ]
    rows += [
        dict(
            engine="transformers", type="float32", bytes=540e6, kl_mean=0.0005, decode_tps=14.0, bytes_per_token=540e6
        ),
        dict(engine="mlx", type="4bit", bytes=80e6, kl_mean=0.08, decode_tps=1.4, bytes_per_token=80e6),
    ]
    return pd.DataFrame(rows).assign(reference="dequantized Q4_1 reference")


def test_speed_vs_size_on_log_axes_with_a_100x_slower_engine():
    df = ladder_rows()
    fig = quant_plots.speed_vs_size(df)
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"
    points = {t.name: t for t in fig.data if t.mode == "markers+text"}
    assert list(points) == ["llama.cpp", "transformers", "mlx"]
    assert list(points["mlx"].y) == [1.4] and list(points["llama.cpp"].y) == [120.0, 150.0, 110.0]
    assert points["mlx"].marker.color == plots.ENGINE_COLORS["mlx"]  # the lab's one colour per engine
    assert "decode_tps" not in fig.layout.title.text and fig.layout.yaxis.title.text == "decode (tokens/s, log)"


def test_prefill_by_kernel_sorts_by_prefill_and_colours_by_path():
    kernels = {
        "Q8_0": "Q8_0 tinyBLAS",
        "Q4_0": "Q4_0 repacked q4_0_8x8",
        "Q2_K": "Q4_0 repacked q4_0_8x8, Q3_K row by row",
        "Q4_1": "Q4_1 row by row",
    }
    prefill = {"Q8_0": 442.0, "Q4_0": 587.0, "Q2_K": 580.0, "Q4_1": 237.0}
    decode = {"Q8_0": 61.0, "Q4_0": 96.0, "Q2_K": 98.0, "Q4_1": 79.0}
    rows = [
        dict(engine="llama.cpp", type=t, matmul_kernels=k, prefill_tps=prefill[t] + d, decode_tps=decode[t])
        for t, k in kernels.items()
        for d in (-10.0, 0.0, 30.0)  # three repetitions: the bar is their median
    ]
    rows.append(dict(engine="transformers", type="float32", matmul_kernels=None, prefill_tps=900.0, decode_tps=30.0))
    fig = quant_plots.prefill_kernels(pd.DataFrame(rows))
    assert fig.layout.xaxis.categoryarray == ("Q4_0", "Q2_K", "Q8_0", "Q4_1")  # by prefill; transformers left out
    bars = {(b.name, b.xaxis): dict(zip(b.x, b.y)) for b in fig.data}
    assert bars[("repacked", "x")] == {"Q4_0": 587.0, "Q2_K": 580.0}
    assert bars[("tinyBLAS", "x")] == {"Q8_0": 442.0} and bars[("row by row", "x2")] == {"Q4_1": 79.0}
    colours = {b.name: b.marker.color for b in fig.data}
    assert len(set(colours.values())) == 3 and [b.name for b in fig.data if b.showlegend] == [
        "repacked",
        "tinyBLAS",
        "row by row",
    ]
    assert list(next(b for b in fig.data if b.name == "repacked").customdata)[1] == kernels["Q2_K"]  # hover: all
    with pytest.raises(Exception, match="matmul_kernels"):
        quant_plots.prefill_kernels(pd.DataFrame(rows).drop(columns=["matmul_kernels"]))


def test_quality_figures_name_their_axes_in_words():
    df = ladder_rows()
    fig = quant_plots.quality_vs_size(df)
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.title.text == "mean KL divergence (nats, log)"
    assert "kl_mean" not in fig.layout.title.text and "lower-left is better" in fig.layout.title.text
    fig = quant_plots.decode_vs_bytes_per_token(df)
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"
    assert fig.layout.title.text.startswith("Does decode speed follow the bytes read per token?")


# --- tables and widgets that fit the page ---------------------------------------------------------
def test_summary_view_fewer_named_columns_with_units():
    from lablib.results.tables import summary_table
    from lablib.ui.tables import summary_view

    df = context_rows(lengths=(37,), reps=2)
    view = summary_view(df)
    data = view.data
    assert list(data.columns) == [
        "engine",
        "prefill (ms)",
        "TTFT (ms)",
        "prefill (tokens/s)",
        "TPOT (ms)",
        "decode (tokens/s)",
        "e2e (s)",
        "e2e min–max (s)",
    ]
    full = summary_table(df).reset_index().set_index("engine")
    for _, r in data.iterrows():
        assert r["prefill (ms)"] == pytest.approx(1000 * full.loc[r.engine, "prefill_s"])
        assert r["TPOT (ms)"] == pytest.approx(1000 * full.loc[r.engine, "tpot_s"])
        assert r["e2e min–max (s)"] == f"{full.loc[r.engine, 'e2e_min_s']:.2f}–{full.loc[r.engine, 'e2e_max_s']:.2f}"
    html = view.to_html()
    assert "medians of 2 repetitions; 37 prompt tokens; 16 output tokens" in html
    assert "overflow-x: auto" in html  # a narrow window scrolls the table inside its output, not the page
    # several prompt lengths: the prompt length becomes a column
    assert "prompt tokens" in summary_view(context_rows(lengths=(64, 256), reps=2)).data.columns


def test_serving_panel_labels_are_not_cut():
    from lablib.ui.serving import ServingPanel

    p = ServingPanel(None, base_url="http://127.0.0.1:1/v1")
    for widget in (p.base_url, p.rate, p.concurrency, p.requests, p.ttft, p.tpot, p.out):
        assert widget.style.description_width == "150px", widget.description  # the default cuts at ~90 px
    assert p.ttft.description == "TTFT target (s)" and p.tpot.description == "TPOT target (s)"
    assert p.open_loop.style.description_width == "initial" and p.open_loop.indent is False
    assert "(" not in p.open_loop.description and "closed loop" in p._loop_hint.value  # the long part beside it


def test_sweep_panel_checkboxes_as_wide_as_their_names(monkeypatch):
    from lablib.ui import widgets

    monkeypatch.setenv("LABLIB_QUICK", "1")
    p = widgets.sweep_panel(out="")
    for box in [*p.engine_boxes.values(), *p.mode_boxes.values()]:
        assert box.layout.width == "auto" and box.style.description_width == "initial", box.description
    assert p._engine_row.layout.flex_flow == "row wrap"


def test_log_ticks_are_written_out_in_full():
    from lablib.plots.style import log_ticks

    def shown(values):
        t = log_ticks(values)
        return [text for v, text in zip(t["tickvals"], t["ticktext"]) if min(values) <= v <= max(values)]

    assert shown([20, 33]) == ["20", "30"]  # less than a decade: finer steps
    assert shown([2, 100]) == ["2", "5", "10", "20", "50", "100"]  # 50 reads "50", not a small "5"
    assert shown([60, 120_000]) == ["100", "1k", "10k", "100k"]  # many decades: powers of ten
    assert log_ticks([0, None, float("nan")]) == {"type": "log"}
    fig = plots.concurrency_lines(concurrency_rows())
    assert fig.layout.yaxis2.tickvals == fig.layout.yaxis3.tickvals  # p50 and p95 on one scale, one set of ticks


def test_speedup_vs_k_puts_the_series_of_one_draft_length_side_by_side():
    """Lab 10's quick run has one draft length (k = 4) for four series: drawn at the same x their markers hid each
    other. Each series sits a little to the side of its k, the ticks and the hover say the real k, and every
    measured and predicted value is drawn as the table gives it."""
    from lablib.plots.speculative import DODGE_K, speedup_vs_k

    rows = []
    for engine, method in (("llama.cpp", "prompt lookup"), ("llama-server", "draft model")):
        for text, measured, predicted in (("repetitive", 1.7, 5.0), ("prose", 0.46, 1.0)):
            rows.append(
                dict(engine=engine, spec_method=method, draft="Q4_0", text_kind=text, concurrency=1, k=4,
                     tpot_speedup=measured, predicted_speedup=predicted, acceptance=1.0)
            )  # fmt: skip
    fig = speedup_vs_k(pd.DataFrame(rows))
    measured = [t for t in fig.data if t.name.endswith(": measured")]
    predicted = [t for t in fig.data if t.name.endswith(": predicted")]
    assert len(measured) == len(predicted) == 4
    xs = [t.x[0] for t in measured]
    assert len(set(xs)) == 4 and max(xs) - min(xs) == pytest.approx(3 * DODGE_K) and sum(xs) / 4 == pytest.approx(4)
    assert [t.x[0] for t in predicted] == xs  # a series' predicted marker sits above or below its own measured one
    assert sorted(t.y[0] for t in measured) == [0.46, 0.46, 1.7, 1.7] and sorted(t.y[0] for t in predicted) == [
        1.0,
        1.0,
        5.0,
        5.0,
    ]
    assert list(fig.layout.xaxis.tickvals) == [4] and all("k=4" in t.hovertext[0] for t in measured)
