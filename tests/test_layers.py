"""The package's layers, checked for every module of lablib (statically and in fresh interpreters; no engine).

- every module sits in one row of LAYERS, and a row imports only its own row and the rows below it
  (a row's exceptions are named in it, with their reason), module-level and function-level imports alike
- no import cycle between lablib's modules, function-level imports counted
- ``import lablib`` and every module stay light: no torch, transformers, llama_cpp, mlx, pandas, plotly,
  numpy, ipywidgets at import
- the figures are pure functions of tables: ``lablib.plots.*`` imports results.tables, results.schema,
  plots.* and errors only, and so does what they import
- ``lablib.build`` is install time: the standard library only, reached by run-time code lazily, and
  only through ``lablib.build.llama``
- no module outside lablib/engines/ branches on an engine's name
- the lazy face resolves, and the flat layout's module paths still import (``lablib._compat``)
- docs/DESIGN.md draws the same rows as LAYERS ("Layers, and where the next thing goes")
"""

import ast
import importlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import lablib
from lablib import _compat
from lablib.engines import ENGINES
from lablib.model.formats import FORMATS

PKG = Path(lablib.__file__).resolve().parent
ROOT = PKG.parent
DESIGN = ROOT / "docs" / "DESIGN.md"
HEAVY = ("torch", "transformers", "llama_cpp", "mlx", "pandas", "plotly", "numpy", "ipywidgets")
FACE = "lablib"  # lablib/__init__.py: the names a notebook reaches, loaded on first use


@dataclass(frozen=True)
class Row:
    name: str
    modules: tuple[str, ...]  # a module, or a package with every module in it; the longest name that covers wins
    teaches: str  # the row's line in docs/DESIGN.md
    also: tuple[tuple[str, str], ...] = ()  # (row, why): rows it may import besides its own and those below
    install_time: bool = False  # imports nothing of lablib outside its row; rows above reach it only by `also`


BUILD_LAZILY = "lazily, build.llama and build.vllm only"  # the llama.cpp tools it builds, vLLM's environment
BUILD_AT_RUN_TIME = ("lablib.build.llama", "lablib.build.vllm")

# top to bottom: a row imports its own row and the rows below it (not an install-time row), plus its `also`;
# docs/DESIGN.md's picture is drawn from this table (test_design_md_draws_these_layers)
LAYERS = (
    # labs/ and benchmarks/ sit above: they reach the package through the face
    Row(
        "face",
        (FACE, "lablib.cli"),
        "the lazy face and `lablib ...`: what a learner or a script touches",
        also=(("build", BUILD_LAZILY),),
    ),
    Row("ui", ("lablib.ui",), "what a person sees besides a figure: widgets, the HTML report"),
    Row("studies", ("lablib.studies",), "one lab's subject each", also=(("build", BUILD_LAZILY),)),
    Row("measure", ("lablib.measure",), "drivers: prompts in, traces out, rows written"),
    Row(
        "engines",
        ("lablib.engines",),
        "one interface, one module per library; real servers; http/",
        also=(("build", BUILD_LAZILY),),
    ),
    # the figures sit here, below everything that measures: they draw tables (test_figures_import_only_...)
    Row(
        "files",
        ("lablib.model", "lablib.results", "lablib.plots"),
        "a model file and what it states; rows on disk, tables; figures of tables",
        also=(("build", BUILD_LAZILY),),
    ),
    # the clock and the columns sit below the rest of results/: engines stamp traces, and a trace names its
    # metrics through the schema; the results store records the machine
    Row(
        "machine",
        ("lablib.machine", "lablib.results.trace", "lablib.results.schema"),
        "this machine and what this process may use of it; one clock; the columns",
    ),
    Row(
        "base",
        (
            "lablib.config",
            "lablib.checks",
            "lablib.errors",
            "lablib.children",
            "lablib.staging",
            "lablib._version",
            "lablib._compat",
        ),
        "folders, quick mode, BUDGETS; checks; errors; child processes; files written whole",
    ),
    # python -m lablib.build.llama runs before the lab's dependencies are installed (Makefile, binder/postBuild)
    Row(
        "build",
        ("lablib.build",),
        "install time: making the engines exist, on the standard library alone",
        install_time=True,
    ),
)
ROW = {row.name: i for i, row in enumerate(LAYERS)}
# what install-time code may import of the rest of lablib: modules that run on the standard library alone
# (the lab home and quick mode, the errors, the GPUs nvidia-smi lists); checked in a fresh interpreter
BUILD_MAY_IMPORT = ("lablib.config", "lablib.errors", "lablib.machine.devices")
# run-time code that may reach lablib.build (lazily, and only lablib.build.llama)
BUILD_USERS = ("lablib.cli", "lablib.studies", "lablib.engines", "lablib.model")
# what a figure may import: tables and their columns, the other figures and their style, errors
FIGURE_IMPORTS = ("lablib.results.tables", "lablib.results.schema", "lablib.errors")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def row_of(module: str) -> int | None:
    """The index of ``module``'s row: of the longest name in LAYERS that is the module or a package
    holding it. The face holds no module but itself: a new top-level module or package is in no row."""
    best = None
    for i, row in enumerate(LAYERS):
        for name in row.modules:
            covers = module == name or (name != FACE and inside(module, name))
            if covers and (best is None or len(name) > len(best[1])):
                best = (i, name)
    return None if best is None else best[0]


def may_import(i: int) -> set[int]:
    row = LAYERS[i]
    below = set() if row.install_time else {j for j in range(i + 1, len(LAYERS)) if not LAYERS[j].install_time}
    return {i} | below | {ROW[name] for name, _ in row.also}


def where_in(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str  # the module itself, not the packages above it (``import a.b.c`` is an edge to a.b.c only)
    line: int
    lazy: bool  # inside a function: runs when it is called, not when the importer is imported

    @property
    def where(self) -> str:
        return where_in(self.importer, self.line)

    @property
    def of_lablib(self) -> bool:
        return inside(self.imported, "lablib")


def _face_tables() -> tuple[dict[str, tuple[str, int]], dict[str, str]]:
    """The face's lazy names (``_LAZY`` and ``_PACKAGES``: name -> (module, line)) and the names it
    imports itself at module level (``__version__``, the errors, ``RequestTrace``: name -> module)."""
    lazy, eager = {}, {}
    for node in ast.parse(MODULES[FACE].read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
            if target == "_LAZY" and isinstance(value, ast.Dict):
                for key, val in zip(value.keys, value.values):
                    lazy[key.value] = (val.elts[0].value, val.lineno)
            elif target == "_PACKAGES" and isinstance(value, ast.Tuple):
                lazy |= {e.value: (f"lablib.{e.value}", e.lineno) for e in value.elts}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module != FACE:
            eager |= {a.asname or a.name: node.module for a in node.names}
    return lazy, eager


FACE_LAZY, FACE_EAGER = _face_tables()


def _from_target(base: str, name: str) -> str:
    """The module ``from base import name`` depends on: the submodule ``base.name`` where there is one
    (or an old flat path: reported as no module); on the face, the module a lazy or re-exported name
    comes from (``import lablib`` has run the face already); otherwise ``base`` itself."""
    sub = f"{base}.{name}"
    if sub in MODULES or sub in _compat.OLD:
        return sub
    if base == FACE and name in FACE_LAZY:
        return FACE_LAZY[name][0]
    if base == FACE and name in FACE_EAGER:
        return FACE_EAGER[name]
    return base


def _targets(node: ast.AST, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        return [base if a.name == "*" else _from_target(base, a.name) for a in node.names]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        arg = node.args[0].value
        if called in ("import_module", "__import__") and isinstance(arg, str) and not arg.startswith("."):
            return [arg]
    return []


def imports_of(module: str) -> list[Import]:
    """Every import of ``module`` (module level and in functions; ``import``, ``from ... import``, relative
    ones resolved, ``importlib.import_module("...")`` of a literal); for the face, its lazy names too."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    in_function = set()
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function |= {id(n) for stmt in f.body for n in ast.walk(stmt)}
        elif isinstance(f, ast.Lambda):
            in_function |= {id(n) for n in ast.walk(f.body)}
    found = [
        Import(module, target, node.lineno, id(node) in in_function)
        for node in ast.walk(tree)
        for target in _targets(node, package)
    ]
    if module == FACE:
        found += [Import(FACE, target, line, True) for target, line in FACE_LAZY.values()]
    return sorted(set(found), key=lambda imp: (imp.line, imp.imported))


IMPORTS = {m: imports_of(m) for m in MODULES}
GRAPH = {m: [imp for imp in found if imp.of_lablib] for m, found in IMPORTS.items()}


def _row_label(i: int) -> str:
    return f"row {i + 1} '{LAYERS[i].name}'"


def test_every_module_sits_in_one_row():
    unplaced = [
        f"{m} ({MODULES[m].relative_to(ROOT)}) is in no row: declare it in LAYERS in tests/test_layers.py "
        "and in docs/DESIGN.md's layer picture"
        for m in MODULES
        if row_of(m) is None
    ]
    assert not unplaced, "\n".join(unplaced)
    declared = [name for row in LAYERS for name in row.modules]
    assert len(declared) == len(set(declared)), f"a module is declared twice in LAYERS: {sorted(declared)}"
    stale = [name for name in declared if name not in MODULES]
    assert not stale, f"LAYERS names {stale}, no module of lablib: update LAYERS and docs/DESIGN.md's picture"


def test_no_module_imports_a_higher_row():
    bad = []
    for m, found in GRAPH.items():
        for imp in found:
            if imp.imported not in MODULES:
                new = _compat.OLD.get(imp.imported)
                hint = f" (an old path: import {new})" if new else ""
                bad.append(f"{imp.where}: {m} imports {imp.imported}, no module of lablib{hint}")
                continue
            i, j = row_of(m), row_of(imp.imported)
            if i is None or j is None or j in may_import(i):
                continue
            if LAYERS[i].install_time and imp.imported in BUILD_MAY_IMPORT:
                continue  # stdlib-only modules (test_build_is_install_time)  # in no row: test_every_module_sits_in_one_row says so
            rule = (
                "an install-time row imports nothing of lablib outside it"
                if LAYERS[i].install_time
                else "a row imports only its own row and the rows below it"
            )
            bad.append(
                f"{imp.where}: {m} ({_row_label(i)}) imports {imp.imported} ({_row_label(j)})"
                f"{' inside a function' if imp.lazy else ''}: {rule} (LAYERS in tests/test_layers.py)"
            )
    assert not bad, "\n".join(bad)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` with more than one module, or a module
    importing itself."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    # an edge to a module is an edge to it alone: a package's __init__ re-exporting its submodules is
    # no cycle unless a submodule imports the package back
    graph = {m: {imp.imported for imp in found if imp.imported in MODULES} for m, found in GRAPH.items()}
    cycles = []
    for component in strongly_connected(graph):
        edges = [
            f"  {imp.where}: {imp.importer} -> {imp.imported}{' (in a function)' if imp.lazy else ''}"
            for m in component
            for imp in GRAPH[m]
            if imp.imported in component
        ]
        cycles.append(f"import cycle between {', '.join(component)}:\n" + "\n".join(edges))
    assert not cycles, "\n".join(cycles)


def test_every_module_imports_light():
    modules = sorted(m for m in MODULES if not m.endswith(".__main__"))  # a __main__ runs its command
    code = (
        "import importlib, json, sys\n"
        "import lablib\n"
        "out = {'build': sorted(m for m in sys.modules if m.startswith('lablib.build')), 'heavy': None}\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        f"    heavy = [h for h in {HEAVY!r} if h in sys.modules]\n"
        "    if heavy:\n"
        "        out['heavy'] = [m, heavy]\n"
        "        break\n"
        "print(json.dumps(out))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["build"] == [], f"import lablib imports {out['build']}: build/ is install time"
    assert out["heavy"] is None, "importing {} imports {}: import it inside the function that needs it".format(
        *out["heavy"]
    )


def test_figures_import_only_tables_schema_and_errors():
    def allowed(m):
        return m in FIGURE_IMPORTS or inside(m, "lablib.plots")

    figures = [m for m in MODULES if inside(m, "lablib.plots")]
    bad = [
        f"{imp.where}: {m} imports {imp.imported}: a figure draws a table, it never measures"
        for m in figures
        for imp in GRAPH[m]
        if not allowed(imp.imported)
    ]
    # and what a figure may import imports no more: plots -> tables -> schema, errors
    for start in figures:
        came_from, todo = {start: None}, [start]
        while todo:
            m = todo.pop()
            for imp in GRAPH.get(m, []):
                if imp.imported in came_from:
                    continue
                came_from[imp.imported] = imp
                if allowed(imp.imported):
                    todo.append(imp.imported)
                elif m != start:
                    chain, step = [], imp
                    while step:
                        chain.append(f"{step.where}: {step.importer} -> {step.imported}")
                        step = came_from[step.importer]
                    bad.append(f"{start} imports {imp.imported} through:\n  " + "\n  ".join(reversed(chain)))
    assert not bad, "\n".join(bad)


def test_build_is_install_time():
    """lablib.build runs before the lab's dependencies are installed (Makefile, binder/postBuild): the
    standard library only, nothing of lablib outside build/ but BUILD_MAY_IMPORT (stdlib-only modules);
    run-time code reaches it lazily."""
    bad = []
    for m, found in IMPORTS.items():
        for imp in found:
            top = imp.imported.partition(".")[0]
            if inside(m, "lablib.build"):
                if inside(imp.imported, "lablib.build") or imp.imported in BUILD_MAY_IMPORT:
                    continue
                if top == "lablib":
                    bad.append(f"{imp.where}: {m} imports {imp.imported}: build/ imports nothing of lablib outside it")
                elif top not in sys.stdlib_module_names:
                    bad.append(f"{imp.where}: {m} imports {imp.imported}: build/ runs on the standard library alone")
            elif inside(imp.imported, "lablib.build"):
                if not any(inside(m, user) for user in BUILD_USERS):
                    bad.append(f"{imp.where}: {m} imports {imp.imported}: only {', '.join(BUILD_USERS)} reach build/")
                elif not any(inside(imp.imported, b) for b in BUILD_AT_RUN_TIME):
                    bad.append(
                        f"{imp.where}: {m} imports {imp.imported}: run-time code reaches {' and '.join(BUILD_AT_RUN_TIME)} only"
                    )
                elif not imp.lazy:
                    bad.append(
                        f"{imp.where}: {m} imports {imp.imported} at module level: import it inside the function"
                    )
    assert not bad, "\n".join(bad)

    # and in fact: a fresh interpreter that refuses every module outside the standard library
    build = sorted(m for m in MODULES if inside(m, "lablib.build") and not m.endswith(".__main__"))
    build += list(BUILD_MAY_IMPORT)  # (a __main__ module runs its command when imported)
    code = (
        "import importlib, importlib.abc, sys\n"
        "class Refuse(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] not in sys.stdlib_module_names | {'lablib'}:\n"
        "            raise ImportError(f'{name}: not the standard library')\n"
        "sys.meta_path.insert(0, Refuse())\n"
        f"for m in {build!r}: importlib.import_module(m)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr


# canonical engine names that no format shares ("mlx" and "hf" name formats too: model/ compares formats)
ENGINE_NAMES = tuple(name for name in ENGINES if name not in FORMATS)
# where a table keyed by engine name belongs outside engines/: the figures' colour and marker of each engine
# (docs/DESIGN.md, "A new engine": a colour in lablib.plots.style.ENGINE_COLORS)
ENGINE_TABLES = ("lablib/plots/style.py",)
# known offenders, to be fixed (architecture review §3.3): "file::top-level name" -> what should replace it
KNOWN_ENGINE_BRANCHES: dict[str, str] = {}


def _engine_names_in(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Compare):
        values = [node.left, *node.comparators]
    elif isinstance(node, ast.Dict):
        values = [k for k in node.keys if k is not None]
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        values = node.elts
    elif isinstance(node, ast.MatchValue):
        values = [node.value]
    else:
        return []
    return [v.value for v in values if isinstance(v, ast.Constant) and v.value in ENGINE_NAMES]


def test_no_branching_on_an_engine_name_outside_the_engines():
    """Comparisons, dict keys, tuple/list/set literals and match cases of engine names: an engine's
    facts live on its Engine class (lablib/engines/), so a new engine is one module and one entry."""
    found = {}
    for m, path in MODULES.items():
        rel = str(path.relative_to(ROOT))
        if inside(m, "lablib.engines") or rel in ENGINE_TABLES:
            continue
        for stmt in ast.parse(path.read_text()).body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = stmt.name
            elif isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                name = stmt.targets[0].id
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                name = stmt.target.id
            else:
                name = f"line {stmt.lineno}"
            for node in ast.walk(stmt):
                names = _engine_names_in(node)
                if names:
                    found.setdefault(f"{rel}::{name}", []).append(f"{rel}:{node.lineno} {sorted(set(names))}")
    new = {k: v for k, v in found.items() if k not in KNOWN_ENGINE_BRANCHES}
    assert not new, "branches on an engine's name outside lablib/engines/:\n" + "\n".join(
        line for lines in new.values() for line in lines
    )
    fixed = sorted(set(KNOWN_ENGINE_BRANCHES) - set(found))
    assert not fixed, f"no longer branch on an engine's name: remove {fixed} from KNOWN_ENGINE_BRANCHES"


def test_the_notebook_face_is_lazy_and_complete():
    for name in lablib.__all__:
        assert getattr(lablib, name) is not None
    assert lablib.run_table is lablib.results.tables.run_table and lablib.sweep_panel.__module__ == "lablib.ui.widgets"


def _found_before_the_aliases(name: str, parent) -> str | None:
    """Where a finder ahead of lablib._compat's on sys.meta_path finds ``name`` (None: nowhere), asked
    without importing it."""
    for finder in sys.meta_path:
        if isinstance(finder, _compat._AliasFinder):
            return None
        find = getattr(finder, "find_spec", None)
        spec = find(name, getattr(parent, "__path__", None)) if find else None
        if spec is not None:
            return spec.origin or repr(finder)
    return None


@pytest.mark.parametrize(("old", "new"), sorted(_compat.OLD.items()))
def test_an_old_module_path_is_the_new_module_with_a_warning(old, new):
    assert old not in MODULES, f"{old} is a module again: it hides the alias to {new} (lablib/_compat.py)"
    module = importlib.import_module(new)
    parent_name, _, child = old.rpartition(".")
    parent = sys.modules[parent_name]
    shadow = _found_before_the_aliases(old, parent)
    assert shadow is None, (
        f"{old} is found at {shadow} by a finder before lablib._compat's on sys.meta_path, so it is not "
        f"{new} (an editable install of an older checkout?)"
    )
    kept_module, kept_attr = sys.modules.pop(old, None), vars(parent).get(child)
    try:
        with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {new}")):
            alias = importlib.import_module(old)
        assert alias is module, f"{old} is {alias!r}, not {new}: an alias is the new module object itself"
        assert alias.__name__ == new and alias.__spec__.name == new
    finally:
        sys.modules.pop(old, None)
        vars(parent).pop(child, None)  # the import system set lablib.<old> on the package
        if kept_module is not None:
            sys.modules[old] = kept_module
        if kept_attr is not None:
            setattr(parent, child, kept_attr)


def picture() -> str:
    """docs/DESIGN.md's layer picture, drawn from LAYERS: one line per row, top to bottom, its names
    relative to lablib/ (``cli/`` a package and all in it, ``results/trace`` one module), then what the
    row may import besides its own row and the rows below."""

    def short(name: str) -> str:
        if name == FACE:
            return "__init__"
        path = name.removeprefix("lablib.").replace(".", "/")
        return path + "/" if MODULES.get(name, Path()).name == "__init__.py" else path

    names = [", ".join(short(n) for n in row.modules) for row in LAYERS]
    width = max(map(len, names)) + 3
    lines = []
    for row, shown in zip(LAYERS, names):
        lines.append(f"{shown:<{width}}{row.teaches}".rstrip())
        lines += [f"{'':<{width}}+ {', '.join(short(n) for n in LAYERS[ROW[r]].modules)}: {why}" for r, why in row.also]
    return "\n".join(lines) + "\n"


def test_design_md_draws_these_layers():
    assert picture() in DESIGN.read_text(), (
        "docs/DESIGN.md's layer picture ('Layers, and where the next thing goes') is not LAYERS in "
        "tests/test_layers.py; for LAYERS as they are, it reads:\n" + picture()
    )
