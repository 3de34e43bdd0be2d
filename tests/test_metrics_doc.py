"""docs/metrics.md's table names only columns the lab has, and names the lab's core metrics.

The table sets each of the lab's columns beside vLLM's benchmark, AIPerf, GuideLLM and llama-bench. Its
first column holds the lab's names in backticks; each must be a column a row or a table of the lab
carries (lablib.results.schema.KNOWN: what lablib.results.tables.need accepts), so a renamed or removed
column fails here instead of leaving the doc to describe a number the lab no longer makes. And every
per-request metric (schema.METRICS, schema.SERIES) and the run's throughput and goodput have a row, so a
new metric is not left out of the comparison unseen.
"""

import re
from pathlib import Path

from lablib.results import schema

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "metrics.md"


def table(text: str) -> list[list[str]]:
    """The cells of each line of the doc's one table, the header first."""
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in text.splitlines() if ln.startswith("|")]


def table_rows(text: str) -> list[list[str]]:
    """The cells of the table's body rows (the header and the --- line left out)."""
    return [r for r in table(text)[1:] if not all(set(c) <= set("-: ") for c in r)]


def lab_names(rows) -> list[str]:
    """The backticked names in each row's first cell (the lab's column)."""
    return [name for r in rows for name in re.findall(r"`([^`]+)`", r[0])]


def test_the_table_has_one_cell_per_tool_in_every_row():
    text = DOC.read_text()
    rows = table_rows(text)
    assert len(rows) >= 15, f"docs/metrics.md: expected the comparison table, found {len(rows)} rows"
    header = table(text)[0]
    assert len(header) == 6, header  # the lab's column, the lab's formula, vLLM, AIPerf, GuideLLM, llama-bench
    bad = [r[0] for r in rows if len(r) != len(header)]
    assert not bad, f"docs/metrics.md: rows with another number of cells than the header's {len(header)}: {bad}"
    assert all(re.search(r"`[^`]+`", r[0]) for r in rows), "every row names a lab column in backticks"


def test_every_lab_column_the_table_names_exists():
    names = lab_names(table_rows(DOC.read_text()))
    unknown = sorted({n for n in names if n not in schema.KNOWN})
    assert not unknown, (
        f"docs/metrics.md names {unknown} as the lab's columns, but lablib.results.schema declares no such "
        "column (renamed or removed?): update the table's first column"
    )


def test_the_core_metrics_have_a_row():
    names = set(lab_names(table_rows(DOC.read_text())))
    core = set(schema.METRICS) | set(schema.SERIES) | {"output_tps", "requests_per_s", "goodput_rps"}
    missing = sorted(core - names)
    assert not missing, f"docs/metrics.md has no row for {missing}: say what the other tools call it"


def test_linked_from_readme_and_servers_doc():
    assert "docs/metrics.md" in (ROOT / "README.md").read_text()
    assert "(metrics.md)" in (ROOT / "docs" / "servers.md").read_text()
