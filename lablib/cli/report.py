"""`lablib report FILE... --html OUT`: the figures of results files on one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

from lablib.errors import LabError
from lablib.results.store import load_lab_rows, writable_file
from lablib.ui.report import report_html

HELP = "write the figures of results files to one self-contained HTML page"


def add_arguments(p) -> None:
    p.add_argument("files", nargs="+")
    p.add_argument("--html", required=True)


def run(ns) -> int:
    html = Path(ns.html)
    if html.suffix.lower() not in (".html", ".htm"):
        raise LabError(f"--html {ns.html}: expected a file name ending in .html")
    if any(html.resolve() == Path(f).resolve() for f in ns.files):
        raise LabError(f"--html {ns.html} is one of the results files: name a new .html file")
    df = load_lab_rows(ns.files)
    writable_file(html, "--html")  # before the figures are made
    path = report_html(df, ns.html)
    print(f"{len(df)} rows from {len(ns.files)} file(s) -> {path}")
    return 0
