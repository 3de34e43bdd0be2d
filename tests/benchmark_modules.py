"""The benchmarks' own modules (benchmarks/*.py, not a package), for tests that drive their parts."""

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).parents[1] / "benchmarks"


def load(name: str):
    """benchmarks/<name>.py as module ``name`` (once per session; its siblings import it by that name)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
