"""Shared pytest set-up: quick mode for everything, including notebook kernels (nbval), one check of
every engine in a child process before any test loads one, and each notebook run once per session."""

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


def pytest_collection_modifyitems(session, config, items):
    """Each notebook runs once per session: one that tests/test_browser.py runs in a real browser (its
    ``BROWSER_NOTEBOOKS``) is not also run under nbval when that test is in the same session. The browser
    test runs every cell in quick mode and fails on any cell's error output, as ``--nbval-lax`` does, and
    checks more (figures drawn, widgets on screen); running the notebook twice only cost CI minutes
    (lab 05, which starts four servers, about 150 s under nbval). ``pytest labs/05_serving.ipynb`` alone
    still runs it under nbval."""
    in_browser = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__.endswith("test_browser"):
            in_browser.update(getattr(module, "BROWSER_NOTEBOOKS", ()))
    if not in_browser:
        return
    twice = [i for i in items if str(getattr(i, "fspath", "")).endswith(".ipynb") and i.fspath.basename in in_browser]
    if twice:
        config.hook.pytest_deselected(items=twice)
        dropped = set(twice)
        items[:] = [i for i in items if i not in dropped]
        config._lablib_in_browser = sorted({i.fspath.basename for i in twice})


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    names = getattr(config, "_lablib_in_browser", None)
    if names:
        terminalreporter.write_line(
            f"notebooks run in the browser test (tests/test_browser.py) and not again under nbval: {', '.join(names)}"
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
