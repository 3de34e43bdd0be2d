"""One self-contained HTML report: every figure the data supports and the run manifest.

Built from :mod:`lablib.plots` (the figures) and :mod:`lablib.results.tables` (the manifest table),
with each row against the machine's roofline bound where it can be computed (:func:`bounds_for_report`;
where it cannot, the report says why); plotly.js is embedded once.
"""

from __future__ import annotations

import html
from pathlib import Path

from lablib import plots
from lablib.checks import keywords_checked
from lablib.errors import LabError
from lablib.plots.roofline import roofline as roofline_figure
from lablib.results.store import writable_file
from lablib.results.tables import bound_table, facet_rows, manifest_table, ok_rows, sweep_rows
from lablib.staging import staged
from lablib.studies.roofline import add_bound_columns


def bounds_for_report(df):
    """(rows, table, why): ``df`` with :data:`lablib.results.schema.BOUND_COLUMNS` and the
    :func:`~lablib.results.tables.bound_table` of its context rows, when the bound can be computed
    without measuring anything: every row of the default model (its sha256), and the machine's figures
    in the rows (``measured_*`` columns) or in this machine's cache. Else (``df``, None, why): a
    sentence saying why the report has no bound. Only a LabError (a model, engine or file the bound
    cannot read) leaves the bound out; any other error is a fault and is raised."""
    from lablib.machine.ceilings import cached_measurement
    from lablib.model.resolve import prepare
    from lablib.results.schema import MEASURED_BANDWIDTH

    if "model_sha256" not in df.columns:
        return df, None, "the rows do not name their model (no model_sha256 column)"
    try:
        rm = prepare(log=lambda *_: None)
        if set(df["model_sha256"].dropna()) != {rm.sha256}:
            return df, None, f"not every row is of the default model ({rm.name}), the one whose weights it counts"
        own = MEASURED_BANDWIDTH in df.columns and df[MEASURED_BANDWIDTH].notna().all()
        if not own and cached_measurement() is None:
            return (
                df,
                None,
                "the rows carry no measured ceilings and this machine was never measured: run `lablib roofline`",
            )
        rows = add_bound_columns(df, rm)
    except LabError as e:
        return df, None, f"it could not be computed ({e})"
    ctx = rows[rows["sweep"] == "context"] if "sweep" in rows.columns else rows
    if not len(ctx):
        return rows, None, "no context-sweep rows to tabulate"
    return rows, bound_table(ctx), None


def _machines(rows):
    """The machine of each row, as ``facet_by="machine"`` draws it (:func:`lablib.results.tables.facet_rows`)."""
    return facet_rows(rows, "machine", "report")["machine"]


def report_figures(df) -> list:  # of plotly Figures
    """The figures ``df`` supports: context_bars and context_lines when there are context rows (where they come
    from several machines, context_bars for each and context_lines with a row of panels per machine),
    concurrency_lines (one row of panels per machine when there are several: by hostname, and where machines share
    one, by :func:`lablib.results.tables.machine_names`) and timeline when there are
    concurrency rows; the roofline when the rows carry their bounds (:func:`lablib.studies.roofline.add_bound_columns`)."""
    figs = []
    ctx = sweep_rows(df, "context")
    if len(ctx):
        names = _machines(ctx)
        if names.nunique() > 1:  # a room's context rows: each machine's split, then one row of lines per machine
            for name in names.unique():
                fig = plots.context_bars(ctx[names == name])
                figs.append(fig.update_layout(title_text=f"{name}: {fig.layout.title.text}"))
            figs.append(plots.context_lines(df, facet_by="machine"))
        else:
            figs += [plots.context_bars(df), plots.context_lines(df)]
    conc = sweep_rows(df, "concurrency")
    if len(conc):
        # one row of panels per machine where there are several (concurrency_lines names them as _machines does)
        facet = "machine" if _machines(conc).nunique() > 1 else None
        figs.append(plots.concurrency_lines(df, facet_by=facet))
        figs.append(plots.timeline(df))
    if "decode_intensity" in df.columns and len(sweep_rows(df, "context")):  # lablib.studies.roofline.add_bound_columns
        figs.append(roofline_figure(sweep_rows(df, "context")))
    return figs


def rate_sweep_summaries(df):
    """(requests, summaries): ``df``'s rows apart from lab 05's rate-sweep summaries among them (a row per server
    and rate, naming a ``server`` and no ``engine``: :func:`lablib.studies.serving.rate_sweep_table`'s lines, as
    ``data/reference/serving-rates-*.jsonl`` ships them), which are no request's."""
    if "server" not in df.columns or "rate" not in df.columns:
        return df, df.iloc[0:0]
    named = df["engine"].map(lambda v: isinstance(v, str)) if "engine" in df.columns else False
    summary = df["server"].map(lambda v: isinstance(v, str)) & ~named & df["rate"].notna()
    return df[~summary], df[summary]


def _one(df, column):
    """The one value ``column`` holds in ``df`` (a target the rows share), else None."""
    values = df[column].dropna().unique() if column in df.columns else []
    return float(values[0]) if len(values) == 1 else None


@keywords_checked
def report_html(df, path, title: str = "Inference Engine Lab results") -> Path:
    """Write every figure the data supports (see :func:`report_figures`; lab 05's rate sweep from its summary
    rows, :func:`rate_sweep_summaries`) and a table of the manifest basics into ONE self-contained HTML file
    (plotly.js embedded once); returns the path.

    Needs: the columns of the figures it draws; the manifest fields when present. ``path``: a file name ending in
    .html, in a folder that can be written (checked before any figure is made); written whole or not at all. Was:
    any name, so a results file given as ``path`` was overwritten by the page."""
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise LabError(
            f"report_html: path {str(path)!r} does not end in .html; expected the name of the page to write (a "
            "file of another kind there would be replaced by it)"
        )
    writable_file(path, "report_html's path")
    d, summaries = rate_sweep_summaries(ok_rows(df))
    if len(d) == 0 and len(summaries) == 0:
        raise LabError("report_html: no rows to report; run a sweep or load a results file first")
    bounds, no_bound, figs = None, None, []
    if len(d):
        d, bounds, no_bound = bounds_for_report(d)  # "% of the machine's bound" columns and table, or why not
        figs = report_figures(d)
    if len(summaries):
        targets = {"ttft_s": _one(summaries, "ttft_s"), "tpot_s": _one(summaries, "tpot_s")}
        figs.append(plots.rate_sweep(summaries, **targets, title="Servers under a rate sweep (lab 05)"))
    if not figs:
        raise LabError("report_html: no context or concurrency rows in the data (column 'sweep')")
    models = ", ".join(map(str, d["model"].dropna().unique())) if "model" in d.columns else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    manifest = manifest_table(d) if len(d) else manifest_table(summaries).drop(columns="requests", errors="ignore")
    table = manifest.to_html(index=False, border=0, classes="manifest", na_rep="–")
    counted = f"{len(d)} measured requests" + (
        f" and {len(summaries)} rate-sweep summaries (a server at one arrival rate each)" if len(summaries) else ""
    )
    parts = [
        "<!DOCTYPE html>",
        "<html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em;color:#222}"
        "table.manifest{border-collapse:collapse;font-size:13px}"
        "table.manifest td,table.manifest th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left}"
        "</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{counted}; models: {html.escape(models or 'not named in the rows')}.</p><h2>Run manifest</h2>",
        table,
    ]
    if bounds is not None:
        parts += [
            "<h2>Measured against the machine's bound (roofline)</h2>",
            bounds.to_html(index=False, border=0, classes="manifest", float_format=lambda v: f"{v:,.1f}"),
            *(
                f"<p class='note'>{html.escape(line)}</p>"
                for line in d.attrs.get("above_bound", []) + d.attrs.get("unbounded", [])
            ),
        ]
    elif no_bound:
        parts.append(f"<p class='note'>No roofline bound in this report: {html.escape(no_bound)}.</p>")
    for i, fig in enumerate(figs):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    parts.append("</body></html>")
    with staged(path) as tmp:
        tmp.write_text("\n".join(parts), encoding="utf-8")
    return path
