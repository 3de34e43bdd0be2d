"""Shared pytest set-up: quick mode for everything, including notebook kernels (nbval), and one
check of every engine in a child process before any test loads one."""

import os

import pytest

os.environ.setdefault("LABLIB_QUICK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# fixtures of tests/conftest.py that load a real engine in the test process
ENGINE_FIXTURES = {"llama", "hf", "mlx", "engine"}


def _loads_engines(item) -> bool:
    return (
        bool(ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())))
        or item.get_closest_marker("engine") is not None
        or str(getattr(item, "fspath", "")).endswith(".ipynb")
    )


def pytest_collection_finish(session):
    """A native crash (SIGILL, SIGSEGV) inside an engine would end the test process with a core
    dump and no summary. So before tests that load engines, each engine runs doctor's smoke step
    once in a child process; one that is not usable stops the session with doctor's message."""
    if session.config.option.collectonly or not any(_loads_engines(i) for i in session.items):
        return
    from lablib.engines.doctor import check_engines

    bad = [r for r in check_engines() if not r["usable"]]
    if bad:
        lines = "\n".join(f"  {r['engine']}: {r['detail']}" for r in bad)
        pytest.exit(
            f"engine check failed before the tests (lablib doctor's smoke step, in a child process):\n"
            f"{lines}\nFix the set-up first (`make setup`, `.venv/bin/lablib doctor`).",
            returncode=3,
        )
