"""The lab as a person sees it: JupyterLab in a real (headless) Chromium runs notebooks 01, 05, 02, 09, 10, 03, 04,
06, 07 and 08.

A JupyterLab server from this environment (quick mode, fresh Jupyter config/data/runtime dirs, a
known token, loopback only) serves labs/; Playwright drives the system Chromium
(/usr/bin/chromium, Debian's package ``chromium``; no browser is downloaded). For each notebook:
Run All Cells, wait until every code cell has an execution count and the kernel is idle, then check
what is on screen: no traceback, no "Error displaying widget" / "model not found", every plotly
figure drawn. In notebook 05 (real servers: llama-cpp-python's, llama-server, two vLLMs) the
figures must show what its text says: vLLM among the servers of the goodput figure, and one vLLM
run's client/server timeline with the server's running, waiting and KV-cache traces drawn. In
notebook 02 the sweep panel is used as a person would: untick mlx, type prompt lengths, press Run,
watch the figure grow. In the others each figure its text describes is on screen with what the text
claims of it (:class:`Drawn`: a line or a bar per engine, the axes it calls logarithmic, serial dashed and
batched solid, a marker per phase, the near-tie's tokens). Screenshots go to results/browser/, one per
notebook (NN_name.png).

Autosave is off in the server's fresh settings, so running the notebooks never writes them back;
the server's log must show no save (checkpoints go to a tmp folder too). Everything has a time
limit, per notebook and for the module (a watchdog stops the server 30 s past it): 9.5 minutes for
labs 01 and 02 and the server's start, 6 more for lab 05, which starts two vLLM servers (1-2 minutes
together on a quiet machine) and measures them, 9 for lab 09, 7 for lab 10, 8 for lab 03 (its first run builds
llama-batched-bench), 6 for lab 04, 5 for lab 07 and 7 each for labs 06 and 08 (each about 2-3 times what it took on
a busy 2-core machine): about an hour in all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from lablib import children

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
SHOTS = ROOT / "results" / "browser"
NB01 = "01_one_model_three_engines.ipynb"
NB02 = "02_prefill_vs_decode.ipynb"
NB05 = "05_serving.ipynb"
NB09 = "09_scheduler.ipynb"
NB10 = "10_decoding_tricks.ipynb"
NB11 = "11_adapters.ipynb"
NB03 = "03_concurrency.ipynb"
NB04 = "04_engine_or_model.ipynb"
NB06 = "06_formats_and_quantization.ipynb"
NB07 = "07_roofline.ipynb"
NB08 = "08_prefix_caching.ipynb"
# the notebooks these tests run: conftest.py leaves them out of nbval in a session that runs these tests
BROWSER_NOTEBOOKS = (NB01, NB02, NB05, NB09, NB10, NB11, NB03, NB04, NB06, NB07, NB08)
CHROMIUM = os.environ.get("LABLIB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
VIEWPORT = {"width": 1400, "height": 1000}

NB05_EXTRA_S = 360  # lab 05's vLLM servers: their start and their runs (on a busy 2-core machine)
NB09_S = 540  # lab 09: five llama-servers and a vLLM, about 4 minutes under nbval on a quiet 2-core machine
NB10_S = 420  # lab 10: two llama-servers, llama.cpp and transformers, about 3 minutes on a quiet 2-core machine
NB11_S = 600  # lab 11: three engines without and with a rank-8 adapter (unmerged, merged), then a llama-server with
# four: 94 s alone on a quiet 2-core machine, 342 s (with rank 64 too) beside the other worker in a fresh clone's make test
NB03_S = 480  # lab 03: every engine serial and batched, 2.5 minutes on a busy 2-core machine; and llama-batched-bench
# built on first use (minutes: it waits for any other tool build of llama.cpp's tree, lablib.build.llama.tools)
NB04_S = 360  # lab 04: llama.cpp and a misread MLX folder against transformers in float32, a second model (Gemma 3
# 270M) through three engines, then eight questions alone and in batches of 1-8 on llama.cpp: about 2.5 minutes
NB06_S = 420  # lab 06: five quantized rungs measured, transformers and mlx scored against the reference: 2-2.5 minutes
NB07_S = 300  # lab 07: the machine's ceilings, a context sweep of every engine, a short concurrency run: about 1 minute
NB08_S = 420  # lab 08: every engine with and without reuse, then a chat: 1-2.5 minutes on a busy 2-core machine
LATER_S = NB03_S + NB04_S + NB06_S + NB07_S + NB08_S  # labs 03, 04, 06, 07 and 08
# every wait below is cut to what is left of this; the watchdog fires 30 s after it
MODULE_BUDGET_S = 570 + NB05_EXTRA_S + NB09_S + NB10_S + NB11_S + LATER_S
_CLOCK = {"t0": None}  # set when this module's first browser fixture starts (not at collection)
CONSOLE: dict[str, list[str]] = {}  # the browser console's errors, per notebook


def elapsed() -> float:
    if _CLOCK["t0"] is None:
        _CLOCK["t0"] = time.monotonic()
    return time.monotonic() - _CLOCK["t0"]


def left(budget: float) -> float:
    """Seconds for one wait: ``budget``, or less when the module's budget is nearly spent."""
    remaining = MODULE_BUDGET_S - elapsed()
    if remaining <= 1:
        pytest.fail(f"the browser tests ran out of their {MODULE_BUDGET_S} s budget")
    return min(budget, remaining)


def require_chromium(path: str = CHROMIUM) -> str:
    """The Chromium executable, or a failure (never a skip) that says how to install it."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(
            f"Chromium not found at {path}: the browser test needs Debian's chromium package. "
            "Install it with `apt-get update && apt-get install -y chromium` (as root; .ci/run does this), "
            "or point LABLIB_CHROMIUM at a Chromium executable. Never `playwright install`: "
            "no browser is downloaded at test time.",
            pytrace=False,
        )
    return path


def test_missing_chromium_fails_with_install_hint(tmp_path):
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install -y chromium"):
        require_chromium(str(tmp_path / "no-chromium"))


# --- the JupyterLab server -------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, token: str, log: Path):
        self.proc, self.port, self.token, self.log = proc, port, token, log
        self.base = f"http://127.0.0.1:{port}"
        self.pids: set[int] = set()  # the server's processes and its kernels, to end them by pid

    def api(self, method: str, path: str, timeout: float = 10):
        req = urllib.request.Request(
            f"{self.base}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
        return json.loads(body) if body else None

    def url(self, notebook: str) -> str:
        # one workspace per notebook, so opening 02 does not restore 01 (and start its kernel again)
        return f"{self.base}/lab/workspaces/{Path(notebook).stem}/tree/{notebook}?token={self.token}"

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def remember_children(self) -> None:
        import psutil

        with contextlib.suppress(psutil.Error):
            self.pids.update(p.pid for p in psutil.Process(self.proc.pid).children(recursive=True))

    def shutdown_kernels(self) -> None:
        """Shut down every kernel session of this server (a notebook done with frees its memory)."""
        self.remember_children()
        with contextlib.suppress(OSError, ValueError):
            for s in self.api("GET", "/api/sessions"):
                with contextlib.suppress(OSError, ValueError):
                    self.api("DELETE", f"/api/sessions/{s['id']}", timeout=30)

    def stop(self) -> None:
        import psutil

        self.remember_children()
        if self.proc.poll() is None:
            self.shutdown_kernels()
            with contextlib.suppress(OSError, ValueError):
                self.api("POST", "/api/shutdown", timeout=10)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
        for pid in self.pids:  # kernels that outlived the server (only the ones it started)
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                p.terminate()
                p.wait(5)
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    elapsed()  # the module's clock starts here
    home = tmp_path_factory.mktemp("jupyter")
    config, data, runtime = home / "config", home / "data", home / "runtime"
    settings, workspaces = config / "lab" / "user-settings", config / "lab" / "workspaces"
    for d in (config, data, runtime, settings, workspaces, home / "ipython"):
        d.mkdir(parents=True, exist_ok=True)
    # no autosave: running the notebooks must not write them back; no news/update checks (offline)
    _write_json(settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings", {"autosave": False})
    _write_json(
        settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
        {"fetchNews": "false", "checkForUpdates": False},
    )

    env = dict(os.environ)
    for var in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "JUPYTER_TOKEN", "JUPYTER_PREFER_ENV_PATH"):
        env.pop(var, None)
    env.update(
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_DATA_DIR=str(data),
        JUPYTER_RUNTIME_DIR=str(runtime),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(workspaces),
        IPYTHONDIR=str(home / "ipython"),
        LABLIB_QUICK="1",
        PYTHONUNBUFFERED="1",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={LABS}",
        "--expose-app-in-browser",
        # opening a notebook makes a checkpoint copy: in the tmp folder, not labs/.ipynb_checkpoints
        f"--FileCheckpoints.checkpoint_dir={home / 'checkpoints'}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = home / "server.log"
    with open(log, "wb") as out:
        # tied to this worker (lablib.children): a worker killed without its teardown (a SIGTERM to the run) took
        # its JupyterLab down with it, not left it and its kernels running (seen: 20 minutes of CPU after a kill)
        proc = children.popen(
            cmd,
            cwd=LABS,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = Server(proc, port, token, log)

    def watchdog():
        print(f"\n[browser test] over {MODULE_BUDGET_S + 30} s: stopping the JupyterLab server", flush=True)
        server.remember_children()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    timer = threading.Timer(MODULE_BUDGET_S + 30 - elapsed(), watchdog)
    timer.daemon = True
    timer.start()
    try:
        t0, deadline = time.monotonic(), time.monotonic() + left(120)
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode} at start:\n{server.log_tail()}", pytrace=False)
            with contextlib.suppress(OSError, ValueError):
                server.api("GET", "/api/status", timeout=5)
                break
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer on {server.base} in time:\n{server.log_tail()}", pytrace=False)
            time.sleep(0.5)
        print(f"\n[browser test] JupyterLab answered on {server.base} after {time.monotonic() - t0:.1f} s")
        yield server
    finally:
        timer.cancel()
        server.stop()
    # autosave is off and nothing presses Save: the notebooks in labs/ must come out untouched
    saved = [line for line in server.log_tail(10**7).splitlines() if "Saving file at" in line]
    assert not saved, f"the browser session saved files in labs/ (check git diff): {saved}"


# --- the browser -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = require_chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the Python package playwright is missing: pip install -e '.[dev]' "
            "(it drives the system Chromium; no browser download)",
            pytrace=False,
        )
    elapsed()  # the module's clock starts here
    profile = tmp_path_factory.mktemp("chromium-profile")  # a fresh --user-data-dir
    pw = sync_playwright().start()
    context = None
    try:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=chromium, headless=True, args=CHROMIUM_ARGS, viewport=VIEWPORT, timeout=60_000
        )
        context.set_default_timeout(60_000)
        yield context
    finally:
        if context is not None:
            with contextlib.suppress(Exception):
                context.close()
        pw.stop()


# --- driving JupyterLab --------------------------------------------------------------------------------
# window.jupyterapp exists because the server runs with --expose-app-in-browser.
FIND_PANEL = """
const findPanel = (path) => {
  const app = window.jupyterapp;
  if (!app || !app.shell) return null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path && w.content && w.content.widgets) return w;
  }
  return null;
};
"""

STATE_JS = (
    "(path) => {"
    + FIND_PANEL
    + """
  const p = findPanel(path);
  if (!p) return {found: false, app: !!window.jupyterapp};
  p.node.setAttribute('data-lablib-path', path);
  const sc = p.sessionContext;
  const kernel = sc && sc.session ? sc.session.kernel : null;
  const code = p.content.widgets.filter(c => c.model.type === 'code');
  const errors = [];
  code.forEach((c, i) => {
    const outs = c.model.outputs;
    for (let k = 0; k < outs.length; k++) {
      const o = outs.get(k).toJSON();
      if (o.output_type === 'error') errors.push(`code cell ${i + 1}: ${o.ename}: ${o.evalue}`);
    }
  });
  return {found: true, ready: !!(p.context.isReady && sc && sc.isReady),
          kernel: kernel ? kernel.status : null, kernelName: kernel ? kernel.name : null,
          cells: code.length, counted: code.filter(c => c.model.executionCount != null).length,
          errors};
}"""
)

RUN_ALL_JS = (
    "(path) => {"
    + FIND_PANEL
    + """
  const p = findPanel(path);
  window.jupyterapp.shell.activateById(p.id);
  window.__lablibRun = null;
  window.jupyterapp.commands.execute('notebook:run-all-cells').then(
    ok => { window.__lablibRun = {ok: ok}; },
    err => { window.__lablibRun = {error: String(err)}; });
  return true;
}"""
)

# What a person would see, read from the DOM of the notebook's tab.
SCREEN_JS = """(path) => {
  const root = document.querySelector(`[data-lablib-path="${path}"]`);
  if (!root) return null;
  const text = (el) => (el.textContent || '').trim();
  const prompts = [...root.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(text);
  const tracebacks = [...root.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
    .map(text).filter(t => t.includes('Traceback'))
    .map(t => t.slice(0, 600));
  const all = document.body.textContent || '';
  const widgetErrors = ['Error displaying widget', 'model not found', 'Error rendering']
    .filter(s => all.toLowerCase().includes(s.toLowerCase()));
  const plots = [...root.querySelectorAll('.js-plotly-plot')].map(el => {
    const r = el.getBoundingClientRect();
    return {svg: el.querySelectorAll('svg.main-svg').length, w: Math.round(r.width), h: Math.round(r.height),
            traces: el.querySelectorAll('g.trace').length,
            marks: el.querySelectorAll('g.point, path.js-line').length,
            title: text(el.querySelector('.gtitle') || document.createElement('i'))};
  });
  const dialogs = [...document.querySelectorAll('.jp-Dialog')].map(d => text(d).slice(0, 300));
  const widgets = root.querySelectorAll('.jupyter-widgets').length;
  const buttons = [...root.querySelectorAll('button.widget-button')].map(text);
  return {prompts, tracebacks, widgetErrors, plots, dialogs, widgets, buttons};
}"""


def state(page, notebook: str) -> dict:
    return page.evaluate(STATE_JS, notebook)


def wait_until(page, what: str, check, budget: float, interval: float = 0.5, fail: bool = True):
    """Poll ``check()`` (truthy: done) until ``budget`` seconds pass; then fail with the last value
    (or return None when not ``fail``: the assertions after it say what is wrong)."""
    deadline, last = time.monotonic() + left(budget), None
    while True:
        last = check()
        if last and not (isinstance(last, dict) and last.get("_not_yet")):
            return last
        if time.monotonic() > deadline:
            if not fail:
                return None
            pytest.fail(f"timed out waiting for {what}; last seen: {last}", pytrace=False)
        page.wait_for_timeout(interval * 1000)


def open_notebook(browser, server: Server, notebook: str):
    page = browser.new_page()
    console = CONSOLE.setdefault(notebook, [])
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    t0 = time.monotonic()
    page.goto(server.url(notebook), wait_until="domcontentloaded", timeout=left(120) * 1000)
    s = wait_until(
        page,
        f"{notebook} to open with an idle kernel",
        lambda: (
            lambda st: (
                st if st.get("found") and st.get("ready") and st.get("kernel") == "idle" else {"_not_yet": True, **st}
            )
        )(state(page, notebook)),
        180,
    )
    print(f"[browser test] {notebook}: open, kernel {s['kernelName']} idle after {time.monotonic() - t0:.1f} s")
    return page


def run_all(page, notebook: str, budget: float) -> dict:
    t0 = time.monotonic()
    page.evaluate(RUN_ALL_JS, notebook)
    done = wait_until(
        page, f"Run All Cells of {notebook}", lambda: page.evaluate("() => window.__lablibRun"), budget, interval=1
    )

    def settled():
        st = state(page, notebook)
        return st if st["kernel"] == "idle" else {"_not_yet": True, **st}

    st = wait_until(page, f"the kernel of {notebook} to be idle", settled, 60)
    # figures draw after their output arrives: give plotly a moment (assert_screen_ok judges them)
    wait_until(
        page,
        f"the plotly figures of {notebook} to draw",
        lambda: (
            lambda sc: (
                sc if sc and sc["plots"] and all(p["svg"] for p in sc["plots"]) else {"_not_yet": True, "screen": sc}
            )
        )(page.evaluate(SCREEN_JS, notebook)),
        30 if st["errors"] else 60,
        fail=False,
    )
    page.wait_for_timeout(1500)
    print(
        f"[browser test] {notebook}: Run All Cells finished in {time.monotonic() - t0:.1f} s "
        f"(result {done}); {st['counted']}/{st['cells']} code cells executed"
    )
    return {"run": done, **st}


HEIGHT_JS = """(path) => {
  const root = document.querySelector(`[data-lablib-path="${path}"]`);
  const scroller = root.querySelector('.jp-WindowedPanel-outer') || root;
  scroller.scrollTop = 0;
  const cells = root.querySelectorAll('.jp-Cell');
  const box = scroller.getBoundingClientRect();
  const contentBottom = cells.length ? cells[cells.length - 1].getBoundingClientRect().bottom : box.bottom;
  // everything above the notebook (menus, toolbar) + its cells + what lies below it (status bar)
  return Math.ceil(contentBottom + 40 + (window.innerHeight - box.bottom));
}"""


def full_screenshot(page, notebook: str, name: str) -> Path:
    """The whole notebook in one PNG: JupyterLab scrolls inside its own panel, so a plain full-page
    shot shows one screen only; the viewport grows to the notebook's height (scrolled to the top),
    then shrinks back."""
    for _ in range(2):  # cells that come into view lay out at their real height: measure again
        height = page.evaluate(HEIGHT_JS, notebook)
        page.set_viewport_size({"width": VIEWPORT["width"], "height": max(VIEWPORT["height"], min(height, 15000))})
        page.wait_for_timeout(1500)  # plotly relayouts on resize
    page.evaluate(HEIGHT_JS, notebook)  # scrolled to the top again
    page.wait_for_timeout(500)
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    page.screenshot(path=str(path), full_page=True, timeout=60_000)
    page.set_viewport_size(VIEWPORT)
    page.wait_for_timeout(1000)
    print(f"[browser test] screenshot: {path}")
    return path


def assert_screen_ok(page, notebook: str, run: dict) -> dict:
    screen = page.evaluate(SCREEN_JS, notebook)
    print(
        f"[browser test] {notebook}: prompts {screen['prompts']}; plots {screen['plots']}; "
        f"{screen['widgets']} widget areas; buttons {screen['buttons']}"
    )
    if CONSOLE.get(notebook):
        print(f"[browser test] {notebook}: browser console errors:\n  " + "\n  ".join(CONSOLE[notebook][:20]))
    problems = []
    if run["run"].get("ok") is not True:
        problems.append(f"Run All Cells did not complete: {run['run']}")
    if run["errors"]:
        problems.append(f"error outputs: {run['errors']}")
    if run["counted"] != run["cells"]:
        problems.append(f"only {run['counted']} of {run['cells']} code cells have an execution count")
    bad_prompts = [p for p in screen["prompts"] if not re.fullmatch(r"\[\d+\]:", p)]
    if bad_prompts:
        problems.append(f"code cells whose prompt shows no execution count: {bad_prompts}")
    if screen["tracebacks"]:
        problems.append("tracebacks on screen:\n" + "\n---\n".join(screen["tracebacks"]))
    if screen["widgetErrors"]:
        problems.append(f"widget errors on screen: {screen['widgetErrors']}")
    if not screen["plots"]:
        problems.append("no plotly figure on screen")
    undrawn = [p for p in screen["plots"] if not (p["svg"] and p["w"] > 0 and p["h"] > 0 and p["traces"])]
    if undrawn:
        problems.append(f"plotly figures not drawn (no svg, no size or no trace): {undrawn}")
    if screen["dialogs"]:
        problems.append(f"a dialog is open: {screen['dialogs']}")
    assert not problems, f"{notebook} in the browser:\n" + "\n".join(problems)
    return screen


# --- the tests -------------------------------------------------------------------------------------------
def test_notebook_01_runs_in_the_browser(browser, lab_server):
    page = open_notebook(browser, lab_server, NB01)
    started = time.time()
    try:
        run = run_all(page, NB01, 300)
        full_screenshot(page, NB01, "01_one_model_three_engines.png")
        assert_screen_ok(page, NB01, run)
        # each study's rows written where the text says, by this run (a file of earlier runs is added to)
        from lablib.results.store import load_results

        for name, engines in [
            ("01_engines.jsonl", {"transformers", "llama.cpp", "mlx"}),
            ("01_first_requests.jsonl", {"transformers", "llama.cpp", "openvino"}),
        ]:
            path = LABS / "results" / name
            assert path.is_file() and path.stat().st_mtime >= started, path
            assert engines <= set(load_results(path)["engine"]), (name, set(load_results(path)["engine"]))
    finally:
        page.close()
        lab_server.shutdown_kernels()  # its engines' memory back before notebook 02


# the figures as plotly drew them: each figure's title, its traces (name; n, the points plotly computed for it:
# gd.calcdata, as gd.data keeps the figure's arrays base64-encoded; the first values of x and y as plotly decoded
# them, gd._fullData; line dash and marker symbol), the lines and markers in its SVG, its legend, the type of each
# axis (linear, log, category), its annotations (subplot titles, a vertical line's label) and its tick labels
FIGURES_JS = """(path) => {
  const root = document.querySelector(`[data-lablib-path="${path}"]`);
  if (!root) return null;
  const first = (a) => a && a.length !== undefined ? Array.from(a).slice(0, 40) : null;
  return [...root.querySelectorAll('.js-plotly-plot')].map(el => {
    const full = el._fullLayout || {};
    const fullData = el._fullData || [];
    return {
      title: (el.querySelector('.gtitle') || {}).textContent || '',
      traces: (el.data || []).map((t, i) => {
        const f = fullData.find(d => d.index === i) || {};
        return {name: t.name || '', visible: t.visible !== false,
                n: el.calcdata && el.calcdata[i] ? el.calcdata[i].length : null,
                x: first(f.x), y: first(f.y),
                dash: f.line ? f.line.dash || null : null,
                symbol: f.marker && typeof f.marker.symbol === 'string' ? f.marker.symbol : null};
      }),
      lines: el.querySelectorAll('path.js-line').length,
      points: el.querySelectorAll('.point').length,
      legend: [...el.querySelectorAll('g.legend text.legendtext')].map(t => t.textContent.trim()),
      axes: Object.fromEntries(Object.keys(full).filter(k => /^[xy]axis\\d*$/.test(k)).map(k => [k, full[k].type])),
      annotations: (full.annotations || []).map(a => a.text || ''),
      ticks: [...el.querySelectorAll('g.xtick text, g.ytick text')].map(t => t.textContent.trim()),
    };
  });
}"""
NB05_TIMELINE = (
    "requests in flight (client)",
    "TTFT of each request (s, at its first token)",
    "running (server)",
    "waiting (server)",
    "KV cache used (server, %)",
)


def test_notebook_05_runs_in_the_browser(browser, lab_server):
    """Lab 05 starts real servers (llama-cpp-python's, llama-server, two vLLMs) from a kernel the browser
    drives; its goodput figure has vLLM among the servers swept, and its timeline of one vLLM run shows
    the client's view (requests in flight, TTFT) and vLLM's own (running, waiting, KV cache) drawn."""
    from lablib.config import budgets

    page = open_notebook(browser, lab_server, NB05)
    try:
        run = run_all(page, NB05, 600 + NB05_EXTRA_S)
        full_screenshot(page, NB05, "05_serving.png")
        assert_screen_ok(page, NB05, run)
        figures = page.evaluate(FIGURES_JS, NB05)
        print(f"[browser test] {NB05}: figures {figures}")
        by_title = {f["title"]: f for f in figures}
        goodput = next((f for t, f in by_title.items() if t.startswith("Goodput and TTFT p95")), None)
        assert goodput is not None, f"no goodput figure on screen: {list(by_title)}"
        servers = {t["name"] for t in goodput["traces"]}
        assert {"llama-cpp-python", "vllm"} <= servers, f"the goodput figure's servers: {servers}"
        rates = len(budgets("serving", quick=True)["rates"])  # goodput and TTFT p95: one point per rate each
        assert all(t["n"] == rates for t in goodput["traces"]), goodput["traces"]
        assert goodput["lines"] >= len(goodput["traces"]) and goodput["points"] > 0, goodput
        # beside it, the full sweep measured on the lab's machine (data/reference/): the three servers, five rates
        ref = next((f for t, f in by_title.items() if t.startswith("Reference: the full sweep")), None)
        assert ref is not None, f"no reference sweep on screen: {list(by_title)}"
        named = {t["name"]: t["n"] for t in ref["traces"] if not t["name"].startswith("arrival rate")}
        assert set(named) == {"llama-cpp-python", "llama-server", "vllm"} and set(named.values()) == {5}, named
        timeline = next((f for t, f in by_title.items() if t.startswith("vLLM,")), None)
        assert timeline is not None, f"no vLLM timeline on screen: {list(by_title)}"
        drawn = {t["name"]: t["n"] for t in timeline["traces"]}
        assert set(NB05_TIMELINE) <= set(drawn), f"the timeline's traces: {drawn}"
        assert all((drawn[name] or 0) >= 2 for name in NB05_TIMELINE[2:]), f"vLLM's samples per trace: {drawn}"
        assert drawn["TTFT of each request (s, at its first token)"] == int(timeline["title"].split()[1]), drawn
        assert timeline["lines"] >= 4 and timeline["points"] > 0, timeline  # in flight, running, waiting, KV
        assert set(NB05_TIMELINE) <= set(timeline["legend"]), timeline["legend"]
    finally:
        page.close()
        lab_server.shutdown_kernels()  # the servers it started are stopped by the notebook; engines' memory back


@pytest.fixture(scope="module")
def nb02(browser, lab_server):
    page = open_notebook(browser, lab_server, NB02)
    try:
        run = run_all(page, NB02, 360)
        full_screenshot(page, NB02, "02_prefill_vs_decode.png")
        yield page, run
    finally:
        page.close()
        lab_server.shutdown_kernels()


def test_notebook_02_runs_in_the_browser(nb02):
    page, run = nb02
    screen = assert_screen_ok(page, NB02, run)
    assert screen["widgets"] > 0, "no ipywidgets area on screen"
    assert "Run" in screen["buttons"], f"the sweep panel's Run button is not on screen: {screen['buttons']}"


PANEL_JS = """() => {
  const cells = [...document.querySelectorAll('.jp-CodeCell')].filter(c =>
    [...c.querySelectorAll('button.widget-button')].some(b => b.textContent.trim() === 'Run'));
  if (cells.length !== 1) return {found: cells.length};
  const cell = cells[0];
  cell.setAttribute('data-lablib-panel', '1');
  const text = (el) => el ? (el.textContent || '').trim() : null;
  const plot = cell.querySelector('.js-plotly-plot');
  const run = [...cell.querySelectorAll('button.widget-button')].find(b => b.textContent.trim() === 'Run');
  const bar = cell.querySelector('.widget-hprogress .progress-bar');
  return {
    found: 1,
    runDisabled: run.disabled,
    progress: text(cell.querySelector('.widget-hprogress .widget-label')),
    barClass: bar ? bar.className : null,
    status: [...cell.querySelectorAll('.widget-hbox .widget-label')].map(text).filter(t => /^\\d+\\/\\d+ requests/.test(t)),
    message: text(cell.querySelector('.widget-html-content')),
    svg: plot ? plot.querySelectorAll('svg.main-svg').length : 0,
    points: plot ? plot.querySelectorAll('g.point').length : 0,
    xticks: plot ? [...plot.querySelectorAll('g.xtick text')].map(text) : [],
    legend: plot ? [...plot.querySelectorAll('g.legend text.legendtext')].map(text) : [],
  };
}"""


def test_sweep_panel_run_button_grows_the_figure(nb02):
    """Press Run as a person would (mlx unticked, four prompt lengths typed): the progress reaches
    its end, the panel says done, and its figure now has bars for the new prompt lengths."""
    page, _ = nb02
    before = page.evaluate(PANEL_JS)
    assert before.get("found") == 1, f"expected one sweep panel (a cell with a Run button), found {before}"
    print(f"[browser test] panel before Run: {before}")
    assert before["svg"] and before["points"] > 0, f"the panel's figure is not drawn after run_sync: {before}"
    panel = page.locator('[data-lablib-panel="1"] .jp-OutputArea')
    SHOTS.mkdir(parents=True, exist_ok=True)
    panel.screenshot(path=str(SHOTS / "02_sweep_panel_before_run.png"))
    print(f"[browser test] screenshot: {SHOTS / '02_sweep_panel_before_run.png'}")

    lengths = ["32", "64", "128", "256"]
    mlx = panel.get_by_role("checkbox", name="mlx", exact=True)
    mlx.uncheck()
    prompt = panel.locator(".widget-text").filter(has_text="prompt tokens").locator("input")
    prompt.fill(",".join(lengths))
    prompt.press("Tab")
    page.wait_for_timeout(500)
    expected = 2 * len(lengths)  # transformers and llama.cpp, one repetition each in quick mode

    t0 = time.monotonic()
    panel.locator("button.widget-button").filter(has_text=re.compile(r"^\s*Run\s*$")).click()
    seen = []

    def finished():
        s = page.evaluate(PANEL_JS)
        snap = (s["progress"], s["points"])
        if not seen or seen[-1] != snap:
            seen.append(snap)
        msg = s["message"] or ""
        if msg.startswith("done:") and f"done: {expected} requests" in msg and not s["runDisabled"]:
            return s
        if "progress-bar-danger" in (s["barClass"] or "") or msg.startswith("cancelled"):
            pytest.fail(f"the panel's run failed: {s}", pytrace=False)
        return {"_not_yet": True, **s}

    after = wait_until(page, "the panel's run to finish", finished, 300, interval=1)
    page.wait_for_timeout(1500)  # the last figure update
    after = page.evaluate(PANEL_JS)
    elapsed = time.monotonic() - t0
    print(f"[browser test] panel run finished in {elapsed:.1f} s; (progress, bars) seen: {seen}")
    print(f"[browser test] panel after Run: {after}")
    shot = SHOTS / "02_sweep_panel_after_run.png"
    panel.screenshot(path=str(shot))
    print(f"[browser test] screenshot: {shot}")

    assert after["progress"] == f"{expected}/{expected}", after
    assert "progress-bar-success" in (after["barClass"] or ""), after
    assert after["message"].startswith(f"done: {expected} requests"), after
    assert after["points"] > before["points"], f"the figure got no new bars: before {before}, after {after}"
    assert after["xticks"] == lengths, f"the figure's prompt lengths: {after['xticks']}, expected {lengths}"
    assert not any(t.startswith("mlx") for t in after["legend"]), after["legend"]
    screen = page.evaluate(SCREEN_JS, NB02)
    assert not screen["widgetErrors"] and not screen["tracebacks"], screen


# lab 09's figures, by the start of their titles (lablib.plots.scheduler and plots.server_timeline)
NB09_FIGURES = (
    "The running streams' ITL",
    ("Saturation knee at", "No knee in the sweep"),
    "Mooncake slice on llama-server",
    "Prefix caching on and off",
    "Multi-turn chats",
)


@dataclasses.dataclass(frozen=True)
class Drawn:
    """A figure as its lab's text describes it, checked on what plotly drew (:data:`FIGURES_JS`): the start of its
    title (a tuple: one of them); the traces drawn with data in it, by name (a callable: the names when the test
    runs, one per engine of :data:`lablib.engines.NAMES`); its axes drawn logarithmic; texts on it (subplot titles,
    annotations, tick labels, legend entries), each the start of one; and ``check(figure)``, a problem in words or
    None."""

    title: str | tuple[str, ...]
    traces: tuple[str, ...] | Callable[[], Iterable[str]] = ()
    log_axes: tuple[str, ...] = ()
    texts: tuple[str, ...] | Callable[[], Iterable[str]] = ()
    check: Callable[[dict], str | None] | None = None

    def titles(self, title: str) -> bool:
        return any(title.startswith(s) for s in ((self.title,) if isinstance(self.title, str) else self.title))

    def problems(self, fig: dict) -> list[str]:
        out = []
        drawn = {t["name"] for t in fig["traces"] if t["visible"] and t["n"]}
        missing = [n for n in (self.traces() if callable(self.traces) else self.traces) if n not in drawn]
        if missing:
            out.append(f"traces not drawn: {missing} (drawn: {sorted(drawn)})")
        linear = {a: fig["axes"].get(a) for a in self.log_axes if fig["axes"].get(a) != "log"}
        if linear:
            out.append(f"axes not logarithmic: {linear}")
        shown = [*fig["annotations"], *fig["ticks"], *fig["legend"]]
        absent = [
            t for t in (self.texts() if callable(self.texts) else self.texts) if not any(s.startswith(t) for s in shown)
        ]
        if absent:
            out.append(f"not on the figure: {absent} (its texts: {shown})")
        problem = self.check(fig) if self.check else None
        return out + ([problem] if problem else [])


def lab_engines() -> tuple[str, ...]:
    """The engines a lab runs when it names none (its sweeps' default): one line, bar or point each."""
    from lablib.engines import NAMES

    return NAMES


def styled(key: str, by_suffix: dict[str, str]) -> Callable[[dict], str | None]:
    """A check that each trace whose name ends with a key of ``by_suffix`` has that ``key`` ("dash", "symbol")."""

    def check(fig: dict) -> str | None:
        wrong = [
            (t["name"], t[key], want)
            for t in fig["traces"]
            for suffix, want in by_suffix.items()
            if t["name"].endswith(suffix) and t[key] != want
        ]
        return f"traces whose {key} is not what the text says (name, drawn, said): {wrong}" if wrong else None

    return check


def _figures_drawn(browser, lab_server, nb: str, budget_s: float, shot: str, expected) -> list[dict]:
    """Run notebook ``nb`` in the browser (within ``budget_s``), screenshot it to ``shot``, and check that a figure
    titled with each of ``expected`` (a start of a title, a tuple of alternatives, or a :class:`Drawn` with what the
    lab's text claims of it) is on screen and that every figure drew traces with data. Returns the figures."""
    page = open_notebook(browser, lab_server, nb)
    try:
        try:
            run = run_all(page, nb, budget_s)
        except BaseException:
            with contextlib.suppress(Exception):
                full_screenshot(page, nb, shot)  # what the screen showed when the run failed or ran out of time
            raise
        full_screenshot(page, nb, shot)
        assert_screen_ok(page, nb, run)
        figures = page.evaluate(FIGURES_JS, nb)
        print(f"[browser test] {nb}: figures {figures}")
        titles = [f["title"] for f in figures]
        for item in expected:
            spec = item if isinstance(item, Drawn) else Drawn(item)
            titled = [f for f in figures if spec.titles(f["title"])]
            assert titled, f"no figure titled {spec.title!r}...: {titles}"
            problems = [spec.problems(f) for f in titled]
            assert any(not p for p in problems), (
                f"{nb}: no figure titled {spec.title!r} as its text says: "
                + "; ".join(f"{f['title']!r}: {p}" for f, p in zip(titled, problems))
            )
        for f in figures:
            drawn = [t for t in f["traces"] if t["visible"] and t["n"]]
            assert drawn and f["points"] + f["lines"] > 0, f"{f['title']!r} drew nothing: {f}"
        return figures
    finally:
        page.close()
        lab_server.shutdown_kernels()  # the notebook stops the servers it started; engines' memory back


def test_notebook_09_runs_in_the_browser(browser, lab_server):
    """Lab 09 starts llama-servers and a vLLM from a kernel the browser drives: its head-of-line timeline, its
    knee figure, the replayed Mooncake slice's timeline, prefix caching on and off and the chat turns are
    each drawn with data in them."""
    _figures_drawn(browser, lab_server, NB09, NB09_S, "09_scheduler.png", NB09_FIGURES)


# lab 10's figures, by the start of their titles (lablib.plots.speculative and plots.structured)
NB10_FIGURES = (
    "Speculative decoding: measured and predicted speedup",
    "Acceptance by position in the draft",
    "What a grammar buys",
    "What a grammar costs each step",
)


def test_notebook_10_runs_in_the_browser(browser, lab_server):
    """Lab 10 speculates on llama.cpp and llama-server and constrains llama.cpp and transformers from a kernel the
    browser drives: its speedup and acceptance figures and its two structured-output figures are each drawn with
    data in them (the values are tests/test_speculative.py's and tests/test_structured.py's)."""
    _figures_drawn(browser, lab_server, NB10, NB10_S, "10_decoding_tricks.png", NB10_FIGURES)


# lab 11's figures (lablib.plots.adapters): one bar series per engine of the lab's adapter budget (its arms: no adapter,
# each rank unmerged and merged, told apart by pattern), for TPOT and for TTFT; llama-server's lines for no adapter,
# the same adapter and distinct adapters
def _nb11_engines() -> list[str]:
    from lablib.config import budgets

    return [e for e in budgets("adapters")["engines"].split(",")]


NB11_FIGURES = (
    Drawn(
        "What an adapter costs each decode step",
        traces=_nb11_engines,
        texts=("no adapter", "rank 8 unmerged", "rank 8 merged"),
    ),
    Drawn("What an adapter costs the prefill", traces=_nb11_engines),
    Drawn(
        "Many adapters at once",
        traces=("llama-server, no adapter", "llama-server, same adapter", "llama-server, distinct adapters"),
        check=styled("dash", {"no adapter": "dot", "same adapter": "dash", "distinct adapters": "solid"}),
    ),
)


def test_notebook_11_runs_in_the_browser(browser, lab_server):
    """Lab 11 runs every engine of its budget without an adapter and with two lab-made adapters, unmerged and merged,
    then a llama-server serving several adapters, from a kernel the browser drives: its cost bars (TPOT and TTFT, one
    series per engine, every arm on the axis) and its multi-LoRA lines are each drawn with data in them (the values
    are tests/test_adapters.py's and tests/test_lora_study.py's)."""
    _figures_drawn(browser, lab_server, NB11, NB11_S, "11_adapters.png", NB11_FIGURES)


# lab 03's figures (lablib.plots.concurrency and plots.anchors): three panels of lines, one per engine and mode, serial
# dashed and batched solid, every axis logarithmic; a timeline panel per engine and mode, each request's queue, prefill
# and decode drawn; llama-batched-bench's bars beside the lab's
def _nb03_panels() -> list[str]:
    return [f"{e} · {m}: " for m in ("serial", "batched") for e in lab_engines()]


NB03_FIGURES = (
    Drawn(
        "Concurrency: does batching raise throughput",
        traces=lambda: [f"{e} · {m}" for e in lab_engines() for m in ("serial", "batched")],
        log_axes=("xaxis", "xaxis2", "xaxis3", "yaxis", "yaxis2", "yaxis3"),
        check=styled("dash", {" · serial": "dash", " · batched": "solid"}),
    ),
    Drawn(
        "Request timeline at concurrency",
        traces=lambda: [f"{e} · {p}" for e in lab_engines() for p in ("queue", "prefill", "decode")],
        texts=_nb03_panels,
        check=lambda f: (
            f"a timeline panel without a run: {f['annotations']}"
            if any("no run" in a for a in f["annotations"])
            else None
        ),
    ),
    Drawn("llama.cpp batched decode: the lab against llama-batched-bench", traces=("lab", "llama-batched-bench")),
    # the learner's run beside the shipped two-core reference (data/reference/concurrency-ci-2cpu-amd-epyc.jsonl):
    # one row of panels each, the reference's three engines in both modes
    Drawn(
        "Concurrency: does batching raise throughput",
        traces=lambda: [f"{e} · {m}" for e in ("llama.cpp", "transformers", "mlx") for m in ("serial", "batched")],
        texts=("this machine: ", "reference: AMD EPYC, 2 cores"),
    ),
)


def test_notebook_03_runs_in_the_browser(browser, lab_server):
    """Lab 03 sweeps every engine serial and batched from a kernel the browser drives: its throughput and TTFT lines,
    its request timelines and llama.cpp's own batched benchmark beside the lab's are drawn as its text says."""
    _figures_drawn(browser, lab_server, NB03, NB03_S, "03_concurrency.png", NB03_FIGURES)


# lab 04's figures (lablib.plots.compare): llama.cpp's KL per prompt position on a log axis; the reference's and
# llama.cpp's top tokens where the greedy texts part, at generated position 0: "The" and "L", the near-tie; the eight
# questions by batch size (lablib.plots.batch_invariance), a square each (which ones part is the CPU's)
NB04_FIGURES = (
    Drawn("Next-token KL divergence, reference vs llama.cpp", traces=("KL, llama.cpp",), log_axes=("yaxis",)),
    Drawn(
        "Top-",
        traces=("transformers", "llama.cpp"),
        texts=("'The'", "'L'"),
        check=lambda f: None if "at generated position 0" in f["title"] else f"not at position 0: {f['title']!r}",
    ),
    Drawn(
        "Greedy ids beside other prompts vs alone",
        traces=("same ids as alone",),  # and "parts from alone" where this CPU parts any
        texts=("What is the capital of France?", "Describe a cat."),
    ),
)


def test_notebook_04_runs_in_the_browser(browser, lab_server):
    """Lab 04 compares llama.cpp (and a misread MLX folder) with transformers layer by layer from a kernel the browser
    drives: llama.cpp's KL per position and the top tokens where its text parts (the near-tie its text names) are
    drawn."""
    _figures_drawn(browser, lab_server, NB04, NB04_S, "04_engine_or_model.png", NB04_FIGURES)


def _mostly_q5_0(fig: dict) -> str | None:
    """Lab 06's claim: a "Q4_K_M" of this 576-wide model is mostly Q5_0."""
    q5 = next((t for t in fig["traces"] if t["name"] == "Q5_0"), None)
    share = dict(zip(q5["x"] or (), q5["y"] or ())).get("Q4_K_M") if q5 else None
    return None if share is not None and share > 50 else f"Q4_K_M's share of Q5_0 weights: {share} (text: mostly)"


# lab 06's figures (lablib.plots.quant): the tensor types of each quick rung; quality and speed against file size (log
# axes), llama.cpp's ladder and then the other engines' variants; decode against bytes per token (log-log)
NB06_FIGURES = (
    Drawn("What each file really holds", traces=("Q5_0", "Q8_0"), check=_mostly_q5_0),
    Drawn(
        "Quality against file size: mean KL",
        traces=("llama.cpp", "Pareto front"),
        log_axes=("xaxis", "yaxis"),
    ),
    Drawn(
        "Quality against file size: mean KL",
        traces=("llama.cpp", "transformers", "mlx", "Pareto front"),
        log_axes=("xaxis", "yaxis"),
    ),
    Drawn("Speed against file size: decode", traces=("llama.cpp", "Pareto front"), log_axes=("xaxis", "yaxis")),
    Drawn("Does decode speed follow the bytes read per token?", traces=("llama.cpp",), log_axes=("xaxis", "yaxis")),
)


def test_notebook_06_runs_in_the_browser(browser, lab_server):
    """Lab 06 quantizes the reference to each quick rung with llama.cpp and scores transformers and mlx against it
    from a kernel the browser drives: the type mix, quality and speed against size and decode against bytes per
    token are drawn as its text says."""
    _figures_drawn(browser, lab_server, NB06, NB06_S, "06_formats_and_quantization.png", NB06_FIGURES)


# lab 07's figures (lablib.plots.roofline): log-log roofline, each engine's prefill (filled circles) and decode (open
# diamonds) under the roofs; each engine's decode step beside its two bounds; llama.cpp's predicted decode against
# batch size, its crossover and measured runs
NB07_FIGURES = (
    Drawn(
        "Roofline: measured prefill and decode",
        traces=lambda: [f"{e} · {p}" for e in lab_engines() for p in ("prefill", "decode")],
        log_axes=("xaxis", "yaxis"),
        texts=("roof: ",),
        check=styled("symbol", {" · prefill": "circle", " · decode": "diamond-open"}),
    ),
    # the third line (lablib.studies.launch_floor): per engine, the measured step, the roofline's and the launch floor
    Drawn(
        "One decode step: measured, what the bytes allow",
        traces=(
            "measured: one decode step",
            "bytes ÷ bandwidth, FLOPs ÷ peak (the roofline)",
            "launch floor (the model's skeleton)",
        ),
        texts=lambda: lab_engines(),
    ),
    Drawn(
        "Decode against batch size on",
        traces=("llama.cpp: roofline bound", "llama.cpp: measured (batched)"),
        log_axes=("xaxis", "yaxis"),
        texts=("crossover batch",),
    ),
)


def test_notebook_07_runs_in_the_browser(browser, lab_server):
    """Lab 07 measures this machine's ceilings and every engine's prefill and decode from a kernel the browser
    drives: its roofline and its batch figure are drawn as its text says."""
    _figures_drawn(browser, lab_server, NB07, NB07_S, "07_roofline.png", NB07_FIGURES)


def _distinct_markers(fig: dict) -> str | None:
    """transformers and mlx keep the same float32 bytes: each engine's measured points need a marker of their own."""
    symbols = [t["symbol"] for t in fig["traces"] if t["name"].endswith(", measured")]
    return None if len(set(symbols)) == len(symbols) else f"engines' measured points share a marker: {symbols}"


# lab 08's figures (lablib.plots.prefix): TTFT with reuse (solid) and without (dashed) per engine, against the shared
# prefix and per chat turn, on log axes; the kept cache's bytes per engine, measured and counted
NB08_REUSE = styled("dash", {", reuse": "solid", ", no reuse": "dash"})
NB08_FIGURES = (
    Drawn(
        "TTFT with and without prefix reuse",
        traces=lambda: [f"{e}, {r}" for e in lab_engines() for r in ("no reuse", "reuse")],
        log_axes=("yaxis",),
        check=NB08_REUSE,
    ),
    Drawn(
        "A chat: TTFT per turn",
        traces=lambda: [f"{e}, {r}" for e in lab_engines() for r in ("no reuse", "reuse")],
        log_axes=("yaxis",),
        check=NB08_REUSE,
    ),
    Drawn(
        "What a kept prefix cache costs",
        traces=lambda: [f"{e}, {k}" for e in lab_engines() for k in ("counted", "measured")],
        check=_distinct_markers,
    ),
)


def test_notebook_08_runs_in_the_browser(browser, lab_server):
    """Lab 08 keeps prefixes' KV caches in every engine from a kernel the browser drives: TTFT with and without reuse
    against the shared prefix and per chat turn, and the memory a kept cache costs, are drawn as its text says."""
    _figures_drawn(browser, lab_server, NB08, NB08_S, "08_prefix_caching.png", NB08_FIGURES)
