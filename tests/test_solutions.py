"""The labs' worked solutions (labs/solutions/NN_*.py) still fit the package they call, without running
them (each runs engines for minutes; their output is pasted in their header): every ``lablib`` name a
solution imports or reaches by attribute resolves, every keyword argument it passes to a lablib function
is one that function takes, and its lab's notebook points to it. A rename in lablib that a solution was
not rewritten for fails here, naming the file, the line and the name.
"""

import ast
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "labs" / "solutions").glob("[0-9][0-9]_*.py"))


def _lablib_names(tree: ast.Module) -> dict[str, object]:
    """The names a solution binds to lablib objects by its imports: {name: object}."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "lablib":
                    mod = importlib.import_module(a.name)
                    if a.asname:
                        bound[a.asname] = mod
                    else:
                        bound["lablib"] = importlib.import_module("lablib")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lablib":
            mod = importlib.import_module(node.module)
            for a in node.names:
                if not hasattr(mod, a.name):  # a submodule, as `from package import module` finds it
                    importlib.import_module(f"{node.module}.{a.name}")
                assert hasattr(mod, a.name), f"line {node.lineno}: {node.module} has no {a.name!r}"
                bound[a.asname or a.name] = getattr(mod, a.name)
    return bound


def _resolve(node, bound):
    """The lablib object an expression ``a.b.c`` names (None: not rooted at a lablib name); fails on a
    missing attribute of a lablib module or class."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, bound)
        if base is None or not (inspect.ismodule(base) or inspect.isclass(base)):
            return None
        assert hasattr(base, node.attr), f"line {node.lineno}: {getattr(base, '__name__', base)} has no {node.attr!r}"
        return getattr(base, node.attr)
    return None


def _takes(fn, keyword: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C function: nothing to check
        return True
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_every_lablib_name_a_solution_uses_resolves(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    bound = _lablib_names(tree)
    assert bound, f"{path.name} uses nothing of lablib"
    reached = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            reached += _resolve(node, bound) is not None
        elif isinstance(node, ast.Call):
            fn = _resolve(node.func, bound)
            if callable(fn):
                bad = [k.arg for k in node.keywords if k.arg and not _takes(fn, k.arg)]
                assert not bad, f"{path.name} line {node.lineno}: {fn.__qualname__} takes no {bad}"
    assert reached, f"{path.name}: no lablib attribute reached"


def test_a_solutions_header_names_its_lab_and_the_lab_points_to_it():
    assert len(SOLUTIONS) >= 11
    for path in SOLUTIONS:
        lab = path.name[:2]
        head = path.read_text().splitlines()[0]
        assert re.match(rf"# Solution · lab {lab} · \S", head), f"{path.name}: first line {head!r}"
        (notebook,) = (ROOT / "labs").glob(f"{lab}_*.ipynb")
        text = "".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"])
        assert f"solutions/{path.name}" in text, f"{notebook.name} does not point to solutions/{path.name}"
