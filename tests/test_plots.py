"""plots.py on synthetic DataFrames with exact expected values (no engine needed)."""

import math
import re

import numpy as np
import pandas as pd
import pytest

from lablib import plots
from lablib.errors import LabError
from lablib.results import tables
from lablib.ui import report

MANIFEST = dict(
    model="SmolLM2-135M-Instruct",
    engine_version="1.0",
    backend="cpu",
    dtype="float32",
    threads=2,
    n_ctx=2048,
    quantization="Q4_1",
    model_sha256="ab" * 32,
    cpu_model="Test CPU",
    cores=2,
    ram_bytes=24 * 2**30,
    accelerator=None,
    hostname="labhost",
    lablib_version="0.1.0",
    time="2026-01-01T00:00:00+00:00",
)
ENGINES = ("transformers", "llama.cpp", "mlx")


def context_df(engines=ENGINES, lengths=(64, 256), reps=3, output_tokens=8):
    """Context rows: prefill_s = n / speed * (1 + rep/10), decode_s = (out - 1) * tpot * (1 + rep/10)."""
    rows, t = [], 100.0
    for k, engine in enumerate(engines):
        speed, tpot = 1000.0 * (k + 1), 0.01 * (k + 1)
        for n in lengths:
            for rep in range(reps):
                f = 1 + rep / 10
                prefill, tp = n / speed * f, tpot * f * (1 + n / 1024)
                decode = (output_tokens - 1) * tp
                row = dict(
                    MANIFEST,
                    engine=engine,
                    sweep="context",
                    mode="single",
                    concurrency=1,
                    repetition=rep,
                    request_index=rep,
                    prompt_tokens=n,
                    output_tokens=output_tokens,
                    cached_tokens=0,
                    queue_s=0.0,
                    ttft_s=prefill,
                    prefill_s=prefill,
                    prefill_tps=n / prefill,
                    tpot_s=tp,
                    decode_tps=1 / tp,
                    decode_s=decode,
                    e2e_s=prefill + decode,
                    itl_s=[tp] * (output_tokens - 1),
                    t_submit=t,
                    t_start=t,
                    t_first_token=t + prefill,
                    t_last_token=t + prefill + decode,
                )
                rows.append(row)
                t += prefill + decode + 0.1
    return pd.DataFrame(rows)


def concurrency_df(
    engines=("llama.cpp", "mlx"),
    levels=(1, 2, 4),
    requests=4,
    hostname="labhost",
    cpu_model="Test CPU",
    prefill=0.5,
    decode=1.0,
    output_tokens=11,
    prompt_tokens=64,
):
    """Closed-loop concurrency rows with exact timestamps.

    serial: one request at a time; request i starts when i-1 ends; clients submit their next
    request when their previous one finished. batched: every request runs at once, at the same
    speed as a single stream (an idealized engine), each client sending its next when done.
    """
    rows = []
    for engine in engines:
        for mode in ("serial", "batched"):
            for c in levels:
                run_id = f"{hostname}-{engine}-{mode}-{c}"
                t0 = 1000.0 + 37.0 * c  # an arbitrary clock origin per run
                client_free = [t0] * c
                engine_free = t0
                for i in range(requests):
                    client = min(range(c), key=lambda j: client_free[j])
                    t_submit = client_free[client]
                    t_start = max(t_submit, engine_free) if mode == "serial" else t_submit
                    t_first = t_start + prefill
                    t_last = t_first + decode
                    if mode == "serial":
                        engine_free = t_last
                    client_free[client] = t_last
                    tpot = decode / (output_tokens - 1)
                    rows.append(
                        dict(
                            MANIFEST,
                            hostname=hostname,
                            cpu_model=cpu_model,
                            engine=engine,
                            sweep="concurrency",
                            mode=mode,
                            concurrency=c,
                            run_id=run_id,
                            repetition=0,
                            request_index=i,
                            prompt_tokens=prompt_tokens,
                            output_tokens=output_tokens,
                            cached_tokens=0,
                            queue_s=t_start - t_submit,
                            ttft_s=t_first - t_submit,
                            prefill_s=prefill,
                            prefill_tps=prompt_tokens / prefill,
                            tpot_s=tpot,
                            decode_tps=1 / tpot,
                            decode_s=decode,
                            e2e_s=t_last - t_submit,
                            itl_s=[tpot] * (output_tokens - 1),
                            t_submit=t_submit,
                            t_start=t_start,
                            t_first_token=t_first,
                            t_last_token=t_last,
                        )
                    )
    return pd.DataFrame(rows)


def traces(fig, name_start=""):
    return [t for t in fig.data if (t.name or "").startswith(name_start)]


# --- context figures --------------------------------------------------------------------------
def test_context_bars_heights_are_the_medians_and_decode_stacks_on_prefill():
    df = context_df()
    fig = plots.context_bars(df)
    assert len(fig.data) == 4 * len(ENGINES)  # per engine: prefill and decode, as shares (top) and seconds (below)
    for engine in ENGINES:
        d = df[df.engine == engine]
        pre, dec = (next(t for t in fig.data if t.name == f"{engine} · {p}") for p in ("prefill", "decode"))
        pre_s, dec_s = (next(t for t in fig.data if t.name == f"{engine} · {p} (s)") for p in ("prefill", "decode"))
        assert list(pre.x) == ["64", "256"] == list(dec.x) == list(pre_s.x)
        for i, n in enumerate((64, 256)):
            sel = d[d.prompt_tokens == n]
            assert pre_s.y[i] == sel.prefill_s.median()
            assert dec_s.y[i] == sel.decode_s.median()
            total = sel.prefill_s.median() + sel.decode_s.median()
            assert pre.y[i] == pytest.approx(sel.prefill_s.median() / total)
            assert pre.y[i] + dec.y[i] == pytest.approx(1.0)
            assert dec.base[i] == pre.y[i]  # stacked: decode starts where prefill ends
        assert pre.offset == dec.offset and pre.width == dec.width  # one column per engine, side by side
        assert pre.marker.color == dec.marker.color == pre_s.marker.color == plots.ENGINE_COLORS[engine]
        assert (pre.yaxis, pre_s.yaxis) == ("y2", "y")  # shares on top, seconds below (the labelled x axis)
    assert fig.layout.barmode == "overlay"
    assert "(s, log)" in fig.layout.yaxis.title.text and "(tokens)" in fig.layout.xaxis.title.text
    assert fig.layout.yaxis.type == "log" and list(fig.layout.yaxis2.range) == [0, 1]
    assert list(fig.layout.xaxis.categoryarray) == ["64", "256"]
    assert all("%{y:.3f} s" in t.hovertemplate for t in fig.data if t.name.endswith("(s)"))


def test_context_bars_orders_lengths_numerically_and_accepts_side_by_side_rows():
    df = context_df(lengths=(1024, 64, 256), reps=1).drop(columns=["sweep"])
    fig = plots.context_bars(df)
    assert list(fig.layout.xaxis.categoryarray) == ["64", "256", "1024"]
    assert list(fig.data[0].x) == ["64", "256", "1024"]


def test_context_lines_prefill_tps_and_tpot_ms():
    df = context_df()
    fig = plots.context_lines(df)
    assert len(fig.data) == 2 * len(ENGINES)
    for engine in ENGINES:
        d = df[df.engine == engine]
        left, right = [t for t in fig.data if t.name == engine]
        assert left.xaxis == "x" and right.xaxis == "x2"
        assert list(left.x) == [64, 256]
        for i, n in enumerate((64, 256)):
            sel = d[d.prompt_tokens == n]
            assert left.y[i] == pytest.approx(sel.prefill_tps.median())
            assert right.y[i] == pytest.approx(sel.tpot_s.median() * 1000)
            assert left.error_y.array[i] == pytest.approx(sel.prefill_tps.max() - sel.prefill_tps.median())
        assert left.line.color == right.line.color == plots.ENGINE_COLORS[engine]
        assert left.showlegend and not right.showlegend
    assert fig.layout.xaxis.type == fig.layout.xaxis2.type == "log"
    assert "tokens/s" in fig.layout.yaxis.title.text and "ms" in fig.layout.yaxis2.title.text
    assert "(tokens)" in fig.layout.xaxis.title.text


def test_context_lines_skips_one_token_tpot():
    df = context_df(reps=1)
    df.loc[df.engine == "mlx", "tpot_s"] = None
    fig = plots.context_lines(df)
    mlx_right = [t for t in fig.data if t.name == "mlx"][1]
    assert all(math.isnan(v) for v in mlx_right.y)


def test_context_figures_refuse_empty_data_with_a_clear_message():
    with pytest.raises(LabError, match="no rows"):
        plots.context_bars(concurrency_df())
    with pytest.raises(LabError, match="prefill_s"):
        plots.context_bars(context_df().drop(columns=["prefill_s"]))


# --- concurrency figures ----------------------------------------------------------------------
def test_run_table_output_tps_is_tokens_over_makespan():
    df = concurrency_df(levels=(1, 2), requests=4)
    runs = tables.run_table(df).set_index("run_id")
    # serial, C=2: four requests of 1.5 s back to back: makespan 6 s, 44 tokens
    r = runs.loc["labhost-llama.cpp-serial-2"]
    assert r.makespan_s == 6.0 and r.output_tokens == 44 and r.output_tps == 44 / 6.0
    # batched, C=2: two waves of 1.5 s: makespan 3 s
    r = runs.loc["labhost-llama.cpp-batched-2"]
    assert r.makespan_s == 3.0 and r.output_tps == 44 / 3.0
    # by hand, for every run
    for run_id, g in df.groupby("run_id"):
        expect = g.output_tokens.sum() / (g.t_last_token.max() - g.t_submit.min())
        assert runs.loc[run_id, "output_tps"] == expect
    assert runs.loc["labhost-mlx-serial-2", "ttft_p95_s"] == np.percentile(
        df[df.run_id == "labhost-mlx-serial-2"].ttft_s, 95
    )


def test_concurrency_lines_values_colors_and_dashes():
    df = concurrency_df(levels=(1, 2, 4), requests=4)
    fig = plots.concurrency_lines(df)
    runs = tables.run_table(df)
    # 2 engines x 2 modes x 3 panels
    assert len(fig.data) == 12
    for engine in ("llama.cpp", "mlx"):
        for mode in ("serial", "batched"):
            tps, p50, p95 = [t for t in fig.data if t.name == f"{engine} · {mode}"]
            assert list(tps.x) == [1, 2, 4]
            r = runs[(runs.engine == engine) & (runs["mode"] == mode)].sort_values("concurrency")
            assert list(tps.y) == list(r.output_tps)
            for i, c in enumerate((1, 2, 4)):
                ttft = df[(df.engine == engine) & (df["mode"] == mode) & (df.concurrency == c)].ttft_s
                assert p50.y[i] == pytest.approx(1000 * np.percentile(ttft, 50))
                assert p95.y[i] == pytest.approx(1000 * np.percentile(ttft, 95))
            for t in (tps, p50, p95):
                assert t.line.color == plots.ENGINE_COLORS[engine]
                assert t.line.dash == ("dash" if mode == "serial" else "solid")
            assert tps.showlegend and not p50.showlegend
    # batching keeps TTFT at one prefill (0.5 s) here, serial queues
    batched = [t for t in fig.data if t.name == "llama.cpp · batched"][1]
    assert list(batched.y) == [500.0, 500.0, 500.0]
    assert fig.layout.xaxis.type == "log"
    assert "tokens/s" in fig.layout.yaxis.title.text and "(ms, log)" in fig.layout.yaxis2.title.text
    assert fig.layout.yaxis.type == fig.layout.yaxis2.type == fig.layout.yaxis3.type == "log"
    assert "concurrency" in fig.layout.xaxis.title.text
    assert fig.layout.yaxis3.matches == "y2"  # p50 and p95 on one scale


def test_concurrency_lines_facets_machines_on_rows():
    a = concurrency_df(hostname="laptop", cpu_model="CPU A", levels=(1, 2))
    b = concurrency_df(hostname="server", cpu_model="CPU B", levels=(1, 2), decode=0.5)
    df = pd.concat([a, b], ignore_index=True)
    fig = plots.concurrency_lines(df, facet_by="hostname")
    assert len(fig.data) == 2 * 2 * 2 * 3
    row_titles = [a.text for a in fig.layout.annotations]
    assert "laptop" in row_titles and "server" in row_titles
    laptop = [t for t in fig.data if t.name == "llama.cpp · batched" and t.yaxis == "y"][0]
    server = [t for t in fig.data if t.name == "llama.cpp · batched" and t.yaxis == "y4"][0]
    assert laptop.y[0] == 44 / 6.0 and server.y[0] == 44 / 4.0  # C=1: four requests of 1.5 s, of 1.0 s
    assert fig.layout.yaxis4.matches == "y"  # each metric on one scale across machines
    # legend entries once for the whole figure
    assert sum(1 for t in fig.data if t.showlegend) == 4
    fig = plots.concurrency_lines(df, facet_by="cpu_model")
    assert "CPU A" in [a.text for a in fig.layout.annotations]
    with pytest.raises(LabError, match="facet_by"):
        plots.concurrency_lines(df, facet_by="engine")


def test_concurrency_lines_refuses_context_rows():
    with pytest.raises(LabError, match="concurrency"):
        plots.concurrency_lines(context_df())


# --- timeline ---------------------------------------------------------------------------------
def test_timeline_segments_start_at_zero_and_follow_the_clock():
    df = concurrency_df(levels=(2,), requests=4)
    run = df[df.run_id == "labhost-llama.cpp-serial-2"]
    seg = tables.timeline_segments(run)
    assert seg.queue_start.iloc[0] == 0.0 and seg.queue_end.iloc[0] == 0.0
    assert seg.prefill_start.iloc[0] == 0.0 and seg.prefill_end.iloc[0] == 0.5
    assert seg.decode_end.iloc[0] == 1.5
    # request 1 was submitted at 0 and waited for request 0: queue 0 -> 1.5
    assert (seg.queue_start.iloc[1], seg.queue_end.iloc[1]) == (0.0, 1.5)
    assert list(seg.decode_end) == [1.5, 3.0, 4.5, 6.0]


def test_timeline_figure_one_run_per_engine_and_mode():
    df = concurrency_df(levels=(1, 2), requests=4)
    fig = plots.timeline(df)
    # 3 legend entries, then 2 modes x 2 engines x 3 phases, at the highest concurrency
    legend, bars = fig.data[:3], fig.data[3:]
    assert [t.name for t in legend] == ["queue (waiting)", "prefill (solid)", "decode (hatched)"]
    assert all(t.showlegend is not False for t in legend) and not any(t.showlegend for t in bars)
    assert len(bars) == 12
    assert "concurrency 2" in fig.layout.title.text
    queue = [t for t in bars if t.name.endswith("queue")]
    assert all(t.base[0] == 0.0 for t in queue)  # first request submitted at 0
    prefill = [t for t in bars if t.name.endswith("prefill")]
    assert [t.marker.color for t in prefill] == [plots.ENGINE_COLORS[e] for e in ("llama.cpp", "mlx")] * 2
    assert all(t.orientation == "h" for t in bars)
    # bars: x is the duration, base the start
    serial_decode = [t for t in bars if t.name == "llama.cpp · decode"][0]
    assert list(np.asarray(serial_decode.base) + np.asarray(serial_decode.x)) == [1.5, 3.0, 4.5, 6.0]
    assert fig.layout.barmode == "overlay"
    assert fig.layout.xaxis3.title.text == "time since first submit (s)"  # bottom row
    assert fig.layout.yaxis.title.text == "serial: arrival order" and fig.layout.yaxis3.title.text.startswith("batched")


def test_timeline_picks_mode_and_concurrency():
    df = concurrency_df(levels=(1, 2), requests=4)
    fig = plots.timeline(df, mode="batched", concurrency=1)
    assert len(fig.data) == 3 + 6 and "concurrency 1" in fig.layout.title.text
    assert all(" · batched" in a.text for a in fig.layout.annotations)
    with pytest.raises(LabError, match="levels"):
        plots.timeline(df, concurrency=8)
    with pytest.raises(LabError, match="modes"):
        plots.timeline(df, mode="paged")


# --- report -----------------------------------------------------------------------------------
def _figures(text: str) -> int:
    """The figures drawn in a report's HTML: plotly's divs (a count of "Plotly.newPlot" also finds the words in
    the embedded plotly.js's own error messages below plotly 7)."""
    return text.count('class="plotly-graph-div"')


def test_report_html_is_one_self_contained_file(tmp_path):
    df = pd.concat([context_df(), concurrency_df()], ignore_index=True)
    path = report.report_html(df, tmp_path / "sub" / "report.html")
    text = path.read_text()
    assert path.name == "report.html"
    assert _figures(text) == 4  # context bars, context lines, concurrency lines, timeline
    assert text.count("plotly.js v") == 1  # the library, embedded once
    assert not re.search(r"<script[^>]*\bsrc=", text)  # nothing fetched from a network
    assert "Run manifest" in text and "Test CPU" in text and "labhost" in text


def test_report_html_draws_only_what_the_data_supports(tmp_path):
    text = report.report_html(context_df(), tmp_path / "r.html").read_text()
    assert _figures(text) == 2
    text = report.report_html(concurrency_df(), tmp_path / "c.html").read_text()
    assert _figures(text) == 2
    with pytest.raises(LabError):
        report.report_html(context_df().iloc[0:0], tmp_path / "e.html")


def test_report_html_refuses_to_write_over_a_results_file_or_to_read_a_path(tmp_path):
    """Called from Python (the CLI checked its --html already): a results file given as the page's path is
    refused and kept (was: replaced by the HTML page); a folder, and a path where the rows go, each one message."""
    from lablib.results.store import ResultsWriter, load_results

    results = tmp_path / "keep.jsonl"
    with ResultsWriter(results) as w:
        for row in context_df().to_dict("records"):
            w.append(row)
    before = results.read_bytes()
    with pytest.raises(LabError, match=r"report_html: path '.*keep\.jsonl' does not end in \.html"):
        report.report_html(context_df(), results)
    assert results.read_bytes() == before and len(load_results(results)) == len(context_df())
    (tmp_path / "page.html").mkdir()
    with pytest.raises(LabError, match=r"report_html's path .*page\.html is a folder"):
        report.report_html(context_df(), tmp_path / "page.html")
    with pytest.raises(
        LabError,
        match=r"takes rows as a pandas DataFrame; it was given a str, '.* \(a results file's path: read it first",
    ):
        report.report_html(str(results), tmp_path / "r.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.jsonl", "page.html"]


@pytest.mark.parametrize(
    "call, want",
    [
        (lambda: tables.summary_table(pd.DataFrame()), r"summary_table needs the columns engine, prompt_tokens"),
        (lambda: tables.run_table(context_df()), r"run_table needs the columns run_id; .*a concurrency sweep"),
        (lambda: tables.concurrency_summary(context_df()), r"run_table needs the columns run_id"),
        (lambda: tables.bound_table(context_df()), r"bound_table needs the columns prefill_bound_tps"),
        (lambda: tables.manifest_table(None), r"manifest_table takes rows as a pandas DataFrame; .* NoneType"),
        (lambda: plots.context_bars([1, 2]), r"takes rows as a pandas DataFrame; it was given a list, \[1, 2\]"),
    ],
)
def test_tables_given_no_rows_or_another_studys_say_what_they_need(call, want):
    """Was (a helper's audit): KeyError 'engine', KeyError 'run_id', pandas' KeyError of labels, AttributeError
    "'list' object has no attribute 'columns'"."""
    with pytest.raises(LabError, match=want):
        call()


def test_manifest_table_one_row_per_machine_and_engine():
    df = pd.concat([context_df(), concurrency_df(hostname="other")], ignore_index=True)
    t = tables.manifest_table(df)
    assert len(t) == 3 + 2
    assert set(t.columns) >= {"hostname", "engine", "engine_version", "dtype", "cpu_model", "ram_gib", "requests"}
    assert t.loc[t.hostname == "labhost", "ram_gib"].iloc[0] == 24.0


def test_error_rows_are_left_out():
    df = context_df(reps=1)
    df["error"] = None
    bad = df.iloc[[0]].copy()
    bad["error"], bad["prefill_s"] = "boom", 1e9
    fig = plots.context_bars(pd.concat([df, bad], ignore_index=True))
    assert max(next(t for t in fig.data if t.name.endswith("(s)")).y) < 1


def test_prefill_decode_bars_still_draws_one_prompt():
    df = context_df(lengths=(64,), reps=2)
    fig = plots.prefill_decode_bars(df)
    assert list(fig.data[0].x) == list(ENGINES)
    assert list(fig.data[0].marker.color) == [plots.ENGINE_COLORS[e] for e in ENGINES]


def test_prefill_decode_legend_names_phases_in_no_engine_colour():
    """The legend shows prefill and decode, each in a neutral swatch (not the first engine's colour)."""
    fig = plots.prefill_decode_bars(context_df(lengths=(64,), reps=2))
    legend = [t for t in fig.data if t.showlegend is not False]
    assert [t.name for t in legend] == ["prefill", "decode"]
    assert {t.marker.color for t in legend} == {plots.PHASE_LEGEND_COLOR}
    assert plots.PHASE_LEGEND_COLOR not in plots.ENGINE_COLORS.values()
    assert [t.marker.pattern.shape for t in legend] == ["", "/"]
    bars = [t for t in fig.data if t.showlegend is False]
    # clicking a phase hides its bars, in both panels (shares and seconds)
    assert sorted(t.legendgroup for t in bars) == ["decode", "decode", "prefill", "prefill"]


def test_shared_results_of_two_machines_facet_after_a_round_trip_on_disk(tmp_path):
    """Workshop flow: each machine writes its rows, the files are merged and loaded, one figure."""
    from lablib.results.store import ResultsWriter, load_results, merge_results

    for host, decode in (("laptop", 1.0), ("server", 0.5)):
        w = ResultsWriter(tmp_path / f"{host}.jsonl")
        for row in concurrency_df(hostname=host, cpu_model=f"CPU {host}", levels=(1, 2), decode=decode).to_dict(
            "records"
        ):
            w.append(row)
    merge_results([tmp_path / "laptop.jsonl", tmp_path / "server.jsonl"], tmp_path / "all.jsonl")
    df = load_results(tmp_path / "all.jsonl")
    fig = plots.concurrency_lines(df, facet_by="hostname")
    server = [t for t in fig.data if t.name == "mlx · batched" and t.yaxis == "y4"][0]
    assert server.y[0] == pytest.approx(44 / 4.0)
    assert {a.text for a in fig.layout.annotations} >= {"laptop", "server"}
    text = report.report_html(df, tmp_path / "all.html").read_text()
    assert _figures(text) == 2 and "CPU server" in text
