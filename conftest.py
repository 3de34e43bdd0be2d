"""Shared pytest set-up: quick mode for everything, including notebook kernels (nbval), one check of
every engine in a child process before any test loads one, each notebook run once per session, and the
groups that pytest-xdist keeps on one worker (``make test`` runs two: ``-n 2 --dist loadgroup``)."""

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


# the session fixture that starts a real vLLM (tests/conftest.py): every test file that uses it is one xdist
# group, so that one worker starts it once, as a serial run does
VLLM_SESSION_FIXTURE = "vllm_server"


def _group_files(items) -> None:
    """Mark each item ``xdist_group(<its file>)``, or ``xdist_group("vllm")`` for every file where a test uses
    the session's vLLM. With ``--dist loadgroup`` a group runs on one worker: a module's fixtures (a started
    llama-server, JupyterLab and Chromium in tests/test_browser.py) are made once, and the session's vLLM once,
    not once per worker. Without xdist the marks do nothing."""
    vllm_files = {str(i.path) for i in items if VLLM_SESSION_FIXTURE in getattr(i, "fixturenames", ())}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            path = str(item.path)
            group = "vllm" if path in vllm_files else os.path.relpath(path, str(item.config.rootpath))
            item.add_marker(pytest.mark.xdist_group(group))


# the longest groups, longest first (seconds under `make test` from an empty machine, a 2-core AMD EPYC,
# 2026-12-03): under xdist they are handed out first, so that no worker is left with a long group at the end
# while the other waits (``make test`` passes --no-loadscope-reorder, which keeps this order)
LONG_GROUPS = (
    "tests/test_browser.py",  # 1230 s: ten notebooks in JupyterLab and Chromium, two vLLM starts in lab 05
    "tests/test_wheelhouse.py",  # 310 s: a wheelhouse built and installed offline
    "vllm",  # 240 s: the session's vLLM and the files that use it
    "tests/test_scheduler_study.py",  # 150 s, a vLLM of five KV blocks among them
    "tests/test_architectures.py",  # about 150 s: three tiny models made, converted and run on three engines
    "tests/test_gemma.py",  # about 80 s: the second model's compare and KV caches
    # seconds here, where this environment's wheel has AVX-512 and dies at once on the emulated Haswell; on an
    # AVX2-only EPYC (the slowest kind) the wheel runs its whole smoke program under qemu (122 s in stop 31)
    "tests/test_emulated_cpu.py",
)


def _long_groups_first(items) -> None:
    """Reorder ``items`` (in place, stable): the items of :data:`LONG_GROUPS` first, in that order."""
    rank = {g: i for i, g in enumerate(LONG_GROUPS)}

    def key(item):
        mark = item.get_closest_marker("xdist_group")
        return rank.get(mark.args[0] if mark and mark.args else None, len(rank))

    items.sort(key=key)


def _is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
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
    _group_files(items)
    if _is_xdist_worker(config):
        _long_groups_first(items)
    if not in_browser:
        return
    twice = [i for i in items if str(getattr(i, "fspath", "")).endswith(".ipynb") and i.fspath.basename in in_browser]
    if twice:
        config.hook.pytest_deselected(items=twice)
        dropped = set(twice)
        items[:] = [i for i in items if i not in dropped]
        config._lablib_in_browser = sorted({i.fspath.basename for i in twice})


def pytest_sessionfinish(session, exitstatus):
    """An xdist worker hands the notebooks it left out of nbval to the controller, which prints them."""
    if _is_xdist_worker(session.config):
        session.config.workeroutput["lablib_in_browser"] = getattr(session.config, "_lablib_in_browser", None)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent without it
def pytest_testnodedown(node, error):
    names = getattr(node, "workeroutput", {}).get("lablib_in_browser")
    if names:
        node.config._lablib_in_browser = names


@pytest.hookimpl(optionalhook=True)  # xdist's hook
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` (``make test``) with a crashed worker's work requeued so the run goes on and ends.

    pytest-xdist 3.8.0 (the newest release) hangs for good once a worker dies under loadgroup: it requeues
    every unit the dead worker ever ran, finished ones included, and a replacement handed an empty unit or a
    single test waits forever for a next one (pytest-xdist#1323, #1327, #1378; fixes merged after 3.8.0, not
    released). Met here: OpenVINO killed a worker with SIGFPE on an Intel Xeon with AMX, every test after it
    finished, and both workers then sat idle until CI's time ran out. Returns None (xdist's own scheduler)
    for any other ``--dist``."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class CrashSafeLoadGroup(LoadGroupScheduling):
        def remove_node(self, node):
            """Requeue only the units with tests left, without the one the worker died on (already
            reported failed by xdist: rerun, it would take the replacement down too, pytest-xdist#1371)."""
            workload = self.assigned_work.pop(node)
            left = [(scope, i) for scope, unit in workload.items() for i, done in unit.items() if not done]
            if not left:
                return None
            scope, crashitem = left[0]
            workload[scope][crashitem] = True
            for scope, unit in workload.items():
                if not all(unit.values()):
                    self.workqueue[scope] = unit
            for other in self.assigned_work:
                self._reschedule(other)
            return crashitem

        def _reschedule(self, node):
            """A worker runs a test only once it holds the next one or a shutdown (xdist.remote's
            run_one_test): give it work until it holds two tests, or tell it that nothing more comes."""
            super()._reschedule(node)
            while not node.shutting_down and node in self.assigned_work:
                if self._pending_of(self.assigned_work[node]) >= 2:
                    break
                if not self.workqueue:
                    node.shutdown()
                    break
                self._assign_work_unit(node)

    return CrashSafeLoadGroup(config, log)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    names = getattr(config, "_lablib_in_browser", None)
    if names:
        terminalreporter.write_line(
            f"notebooks run in the browser test (tests/test_browser.py) and not again under nbval: {', '.join(names)}"
        )


def pytest_sessionstart(session):
    """Under xdist (``-n``) the controller checks the engines once, before any worker starts (xdist starts
    them in its own ``pytest_sessionstart``, marked trylast): a worker cannot stop the whole session cleanly,
    and two workers would each run the check. The controller collects nothing, so it checks whatever tests
    were asked for: ``-n`` on a few tests that load no engine pays the check (about 30 s on two cores)."""
    config = session.config
    if _is_xdist_worker(config) or not getattr(config.option, "numprocesses", None) or config.option.collectonly:
        return
    _check_engines_or_exit()


def pytest_collection_finish(session):
    """A native crash (SIGILL, SIGSEGV) inside an engine would end the test process with a core
    dump and no summary. So before tests that load engines, each engine runs doctor's smoke step
    once in a child process; one that is not usable stops the session with doctor's message. (Under xdist
    the controller did it in :func:`pytest_sessionstart`.)"""
    if _is_xdist_worker(session.config) or getattr(session.config.option, "numprocesses", None):
        return
    if session.config.option.collectonly or not any(_loads_engines(i) for i in session.items):
        return
    _check_engines_or_exit()


def _check_engines_or_exit() -> None:
    from lablib.engines.doctor import check_engines

    bad = [r for r in check_engines() if not r["usable"]]
    if bad:
        lines = "\n".join(f"  {r['engine']}: {r['detail']}" for r in bad)
        pytest.exit(
            f"engine check failed before the tests (lablib doctor's smoke step, in a child process):\n"
            f"{lines}\nFix the set-up first (`make setup`, `.venv/bin/lablib doctor`).",
            returncode=3,
        )
