"""`python -m lablib.build.bytecode`: the lab's environment byte-compiled at install time, on every core, also
where PYTHONDONTWRITEBYTECODE keeps Python from writing its cache on import (as on this project's CI machines)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_it_writes_the_caches_under_pythondontwritebytecode_and_skips_what_does_not_compile(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "good.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "newer.py").write_text("def f[T](a): return a\n")  # Python 3.12 syntax
    p = subprocess.run(
        [sys.executable, "-S", "-m", "lablib.build.bytecode", str(tmp_path), "--workers", "2"],
        cwd=ROOT,  # -S: the standard library alone, as right after the installs
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    assert f"byte-compiled {tmp_path} in" in p.stdout
    cached = {c.name.split(".")[0] for c in (tmp_path / "pkg" / "__pycache__").glob("*.pyc")}
    if sys.version_info < (3, 12):
        assert cached == {"good"}
    else:
        assert cached == {"good", "newer"}


def test_the_environment_make_setup_made_is_compiled():
    """What the lab imports in every process (torch, transformers, llama_cpp) has its bytecode on disk: the
    Makefile's compile step ran (without it, each process compiles ~2,000 files again: ~5 s on two cores)."""
    tag = sys.implementation.cache_tag
    for name in ("torch", "transformers", "llama_cpp"):
        init = Path(importlib.util.find_spec(name).origin)
        pyc = init.parent / "__pycache__" / f"{init.stem}.{tag}.pyc"
        assert pyc.exists(), f"{pyc}: not compiled; make setup runs python -m lablib.build.bytecode"
