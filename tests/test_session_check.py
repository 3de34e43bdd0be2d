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


CRASHING_RUN = {
    "test_a.py": "def test_a1(): pass\ndef test_a2(): pass\ndef test_a3(): pass\n",
    "test_b.py": "import os\ndef test_b_dies(): os._exit(1)\ndef test_b_after(): pass\n",
    "test_c.py": "def test_c1(): pass\ndef test_c2(): pass\n",
}


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_worker_that_dies_fails_its_test_and_the_run_still_ends(tmp_path, workers):
    """``make test``'s ``-n 2 --dist loadgroup``: a worker killed mid-test (OpenVINO's SIGFPE did it) fails that
    test and every other test still runs once, and the run ends. xdist 3.8.0's own scheduler hung here until
    the timeout (pytest-xdist#1323, #1378): conftest.py's ``pytest_xdist_make_scheduler`` is the hook under test."""
    for name, text in CRASHING_RUN.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('lab_root_conftest', {str(ROOT / 'conftest.py')!r})\n"
        "root = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(root)\n"
        "pytest_xdist_make_scheduler = root.pytest_xdist_make_scheduler\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", workers, "--dist", "loadgroup", "-rA"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert "1 failed, 6 passed" in out, out[-3000:]
    assert "crashed while running 'test_b.py::test_b_dies'" in out
    assert "PASSED test_b.py::test_b_after" in out
