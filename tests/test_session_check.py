"""A native crash in an engine stops the test session with doctor's message, not a core dump."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_an_engine_that_dies_by_a_signal_stops_the_session_with_doctors_message(tmp_path, workers):
    """One process: the check runs once collection found a test that loads an engine. Under xdist (`make test`)
    the controller runs it before any worker starts a test."""
    # a llama_cpp that dies on import with SIGILL, as a library built for the wrong CPU does
    stub = tmp_path / "stub" / "llama_cpp"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n")
    test = tmp_path / "test_uses_llama.py"
    test.write_text("def test_needs_llama(llama):\n    assert False, 'must not run'\n")
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text())  # the hook under test
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'stub'}{os.pathsep}{ROOT}")
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *workers, str(test)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 3, out[-3000:]
    assert "engine check failed before the tests" in out
    assert "llama.cpp: crashed with SIGILL (illegal instruction" in out
    assert "must not run" not in out
