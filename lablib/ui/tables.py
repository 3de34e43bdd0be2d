"""Tables a person reads in a notebook: few columns, named in words with their units, numbers to the digits
that matter, so that a table fits JupyterLab's page at its default width.

A wide DataFrame is not wrong in JupyterLab (its output area scrolls sideways), but the columns past the
page's edge are the ones nobody sees, and ``summary_table(df).round(4)`` showed 13 columns of names like
``e2e_min_s``. These functions keep the DataFrames of :mod:`lablib.results.tables` as they are (code reads
them) and return a pandas ``Styler`` to look at.
"""

from __future__ import annotations

# lablib.results.tables.summary_table's columns a reader looks at: (column, header, scale, format)
SUMMARY_VIEW = (
    ("prefill_s", "prefill (ms)", 1000.0, "{:.1f}"),
    ("ttft_s", "TTFT (ms)", 1000.0, "{:.1f}"),
    ("prefill_tps", "prefill (tokens/s)", 1.0, "{:.0f}"),
    ("tpot_s", "TPOT (ms)", 1000.0, "{:.1f}"),
    ("decode_tps", "decode (tokens/s)", 1.0, "{:.1f}"),
    ("e2e_s", "e2e (s)", 1.0, "{:.2f}"),
)
SPREAD = "e2e min–max (s)"
# a table wider than its output area scrolls inside it, not past the page (a guard for a narrow window)
SCROLLS = [{"selector": "", "props": [("display", "block"), ("overflow-x", "auto"), ("max-width", "100%")]}]


def _scaled(view, table, columns) -> dict:
    """Each (column, header, scale, format) of ``columns``: ``table``'s column times its scale as ``view``'s
    column ``header``; the formats by header, for the Styler."""
    for col, header, scale, _ in columns:
        view[header] = table[col].astype(float) * scale
    return {header: fmt for _, header, _, fmt in columns}


def summary_view(df):
    """Lab 01's metrics, one row per engine (and prompt length): the medians of
    :func:`lablib.results.tables.summary_table` as seven columns with their units (prefill, TTFT and TPOT
    in ms, tokens/s, e2e in s with its min–max spread over the repetitions), the prompt and output tokens
    and the repetitions in the caption when every row shares them (else as columns). Returns a pandas
    Styler; the numbers themselves stay in ``summary_table(df)``."""
    import pandas as pd

    from lablib.results.tables import summary_table

    t = summary_table(df).reset_index()
    view = pd.DataFrame({"engine": t["engine"]})
    shared = {}
    for col, label in (("prompt_tokens", "prompt tokens"), ("output_tokens", "output tokens"), ("reps", "repetitions")):
        if t[col].nunique() == 1:
            shared[label] = int(t[col].iloc[0])
        else:
            view[label] = t[col].astype(int)
    formats = _scaled(view, t, SUMMARY_VIEW)
    view[SPREAD] = [f"{lo:.2f}–{hi:.2f}" for lo, hi in zip(t["e2e_min_s"], t["e2e_max_s"])]
    reps = shared.pop("repetitions", None)
    caption = (f"medians of {reps} repetitions" if reps else "medians") + "".join(
        f"; {n} {label}" for label, n in shared.items()
    )
    return (
        view.style.hide(axis="index")
        .format(formats, na_rep="–")
        .set_caption(caption)
        .set_table_styles(SCROLLS, overwrite=False)
    )


# lablib.studies.first_requests.first_request_table's columns a reader looks at: (column, header, scale, format)
FIRST_REQUEST_VIEW = (
    ("load_s", "load (s)", 1.0, "{:.2f}"),
    ("first_ttft_s", "first TTFT (ms)", 1000.0, "{:.0f}"),
    ("steady_ttft_s", "later TTFT (ms)", 1000.0, "{:.0f}"),
    ("first_over_steady_ttft", "first / later TTFT", 1.0, "{:.2f}×"),
    ("first_over_steady_tpot", "first / later TPOT", 1.0, "{:.2f}×"),
)


def first_request_view(rows):
    """Lab 01's first requests after a load, one row per engine and load: the load's seconds, the first request's
    TTFT beside the median of the later requests' (ms) and the first over the later for TTFT and TPOT, from
    :func:`lablib.studies.first_requests.first_request_table` of ``rows``. Returns a pandas Styler; the numbers
    themselves stay in that table."""
    import pandas as pd

    from lablib.studies.first_requests import first_request_table

    t = first_request_table(rows)
    view = pd.DataFrame({"engine": t["engine"], "load": t["load_number"].astype(int)})
    formats = _scaled(view, t, FIRST_REQUEST_VIEW)
    df = pd.DataFrame(rows)
    counts = sorted(set(df[df["request_number"].astype(int) > 1].groupby(["engine", "load_number"]).size()))
    later = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    return (
        view.style.hide(axis="index")
        .format(formats, na_rep="–")
        .set_caption(f"later: the median of the {later} requests after the first; load 1 in a fresh process")
        .set_table_styles(SCROLLS, overwrite=False)
    )
