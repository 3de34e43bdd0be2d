"""The package's layering, checked statically and in a fresh interpreter (no engine needed).

- ``import lablib`` and every module stay light: no torch, llama_cpp, mlx, pandas, plotly at import
- the figures sit below the measuring code: plots imports tables, schema and errors only
- no module outside lablib/engines/ branches on an engine's name
"""

import ast
import subprocess
import sys
from pathlib import Path

import lablib
from lablib.engines import NAMES
from lablib.model.formats import FORMATS

PKG = Path(lablib.__file__).resolve().parent
HEAVY = ("torch", "transformers", "llama_cpp", "mlx", "pandas", "plotly", "numpy", "ipywidgets")
# "mlx" names a format too (models.py and formats.py compare formats): engine names that are not formats
ENGINE_NAMES = tuple(n for n in NAMES if n not in FORMATS)


def lablib_imports(path: Path) -> set[str]:
    """The lablib modules ``path`` imports at module level (relative imports resolved)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(path.relative_to(PKG.parent).with_suffix("").parts[: -node.level])
            mod = f"{base}.{node.module}" if node.module else base
            out |= {mod} if node.module else {f"{mod}.{a.name}" for a in node.names}
    return out


def test_every_module_imports_light():
    modules = sorted(".".join(p.relative_to(PKG.parent).with_suffix("").parts) for p in PKG.rglob("*.py"))
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print([h for h in {HEAVY!r} if h in sys.modules])"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", p.stdout


def test_plots_imports_no_module_that_measures():
    assert lablib_imports(PKG / "plots.py") == {"lablib.errors", "lablib.results.schema", "lablib.results.tables"}
    assert lablib_imports(PKG / "prefix_plots.py") == {"lablib.errors", "lablib.plots.sweeps", "lablib.results.tables"}
    assert lablib_imports(PKG / "tables.py") == {"lablib.errors", "lablib.results.schema"}
    assert lablib_imports(PKG / "schema.py") == set()


def test_no_branching_on_an_engine_name_outside_the_engines():
    found = []
    for path in PKG.rglob("*.py"):
        if "engines" in path.relative_to(PKG).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = [n.value for n in [node.left, *node.comparators] if isinstance(n, ast.Constant)]
                if any(n in ENGINE_NAMES for n in names):
                    found.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert found == []


def test_the_notebook_face_is_lazy_and_complete():
    for name in lablib.__all__:
        assert getattr(lablib, name) is not None
    assert lablib.run_table is lablib.results.tables.run_table and lablib.sweep_panel.__module__ == "lablib.ui.widgets"
