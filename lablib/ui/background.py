"""A panel's run in a background thread, and its status line: what Run starts (the widgets stay live while it runs), what a notebook
or a test waits for, and the event Cancel sets. The panels (:class:`lablib.ui.widgets.SweepPanel`,
:class:`lablib.ui.replay.ReplayPanel`) inherit it and define ``_execute(values, raise_errors)``."""

from __future__ import annotations

import html
import threading
import time
import traceback
import weakref

from lablib.errors import LabError

DRAW_EVERY_S = 1.0  # a panel's live figure is redrawn at most this often while a run goes on (seconds)
WAIT_POLL_S = 0.2  # how often a run waiting for another checks for Cancel (seconds)

# one lock for every panel's status line: Cancel's "cancelling" and a run's last status, written from two threads
_STATUS = threading.RLock()

# every panel that started a run in this process: a run waits for the ones going on when it was asked for (a
# panel whose cell was run again keeps running, out of sight; two runs at once would share the CPU and skew both)
_PANELS: weakref.WeakSet = weakref.WeakSet()


def status_html(text: str, error: bool = False, details: str | None = None) -> str:
    """A panel's status line as HTML: ``text`` escaped (red when ``error``), ``details`` folded below it."""
    body = html.escape(text)
    if details:
        body += f"<details><summary>details</summary><pre>{html.escape(details)}</pre></details>"
    color = "#B00020" if error else "#333"
    return f"<div style='color:{color};white-space:pre-wrap'>{body}</div>"


def default_out(kind: str) -> str:
    """A fresh results file name for a panel, relative to the notebook's folder: results/<kind>-<time>.jsonl."""
    import datetime

    return f"results/{kind}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.jsonl"


def status_plain(value: str) -> str:
    """A status line's text (:func:`status_html`'s ``text``), without its markup and folded details."""
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", value.split("<details>")[0]))


class BackgroundRun:
    """``running``, :meth:`wait` and :meth:`_start_background` for a panel with an ``_execute(values,
    raise_errors)`` method (its run, in the calling thread when ``raise_errors`` is True), a ``cancel_event``,
    ``run_button`` and ``cancel_button``, and ``_show(text, error=False, details=None)`` (its status line).

    One run at a time in a process: a run asked for while another panel's is going on (a panel whose cell was run
    again keeps running, out of sight) first waits for it, saying so; Cancel then stops both. ``run_sync`` (the
    calling thread) waits for the panel's own background run too (:meth:`_wait_for_runs`)."""

    _thread: threading.Thread | None = None
    _ended = True  # the background run wrote its last status (or none runs): Cancel has nothing to say
    _said: tuple | None = None  # (widget, value): the last status written (:meth:`_say`)
    _replaced: tuple | None = None  # the status Cancel's line replaced, while no later one was written

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _cancel(self, say, text: str) -> None:
        """Cancel: set ``cancel_event``, and while a background run goes on ``say(text)`` ("cancelling: ..."). A
        run that ends meanwhile keeps its last status: a "cancelling" written over it (the run's thread wrote
        "done" between Cancel's look at ``running`` and its line) is taken back as the run ends
        (:meth:`_run_after`), and none is written once it ended."""
        with _STATUS:
            self.cancel_event.set()
            if self.running and not self._ended:
                before = self._said
                say(text)
                self._replaced = before

    def _runs_going(self, include_self: bool = False) -> list:
        """The runs going on now (this panel's too when ``include_self``): (panel, its run's thread) pairs. The
        thread, not the panel: a panel whose run ends and that runs again is a run asked for later, which may be
        waiting for this one (waiting for the panel, each of two waited for the other's next run, for ever)."""
        return [(p, p._thread) for p in list(_PANELS) if p.running and (include_self or p is not self)]

    def _start_background(self, values, name: str, busy) -> threading.Thread | None:
        """``_execute(values(), False)`` in a daemon thread called ``name``, started, or None: when a run is
        going on (``busy()`` then says so in the panel) or ``values()`` refused the form (None: its message is
        already shown). Another panel's run going on now is waited for first, in that thread."""
        if self.running:
            busy()
            return None
        v = values()
        if v is None:
            return None
        before = self._runs_going()  # the runs going on now, never one asked for later (no two wait for each other)
        _PANELS.add(self)
        self._ended = False
        self._thread = threading.Thread(target=self._run_after, args=(before, v), daemon=True, name=name)
        self._thread.start()
        return self._thread

    def _checked(self, read):
        """``read()`` (the form's values or plan) with a fresh ``cancel_event`` for the run it is for; None after
        showing its LabError in the status line, in red."""
        try:
            v = read()
        except LabError as e:
            self._show(str(e), error=True)
            return None
        self.cancel_event = threading.Event()
        return v

    def _show_failure(self, e: BaseException) -> None:
        """A failed run in the status line, in red: a LabError's message; anything else (a bug, an engine's crash)
        its type and message, the traceback folded below."""
        if isinstance(e, LabError):
            self._show(str(e), error=True)
        else:
            self._show(f"{type(e).__name__}: {e}", error=True, details=traceback.format_exc())

    def _run_after(self, before: list, v) -> None:
        try:
            if self._wait_for_runs(before, cancellable=True):
                self._execute(v, False)
        finally:
            with _STATUS:  # the run's last status stays: a "cancelling" written over it is taken back
                if self._replaced is not None:
                    widget, value = self._replaced
                    widget.value = value
                    self._said, self._replaced = self._replaced, None
                self._ended = True

    def _wait_for_runs(self, runs: list, cancellable: bool = False) -> bool:
        """Wait for ``runs`` (:meth:`_runs_going`) to end, saying so in this panel; True when this run may start. A
        ``cancellable`` wait (a background run's: Run disabled, Cancel enabled meanwhile) returns False when Cancel
        (this panel's ``cancel_event``) was pressed: it stops them too, and this run does not start. Else (the
        calling thread's, ``run_sync``: no click is handled until it returns) it waits until they end."""
        runs = [(p, t) for p, t in runs if t.is_alive()]
        if not runs:
            return True
        _PANELS.add(self)
        self._show(
            "waiting for the run already going on to end (a panel of this notebook, perhaps from before its cell "
            "was run again): two runs at once would share the CPU and skew both"
            + ("; Cancel stops it and this one" if cancellable else "")
        )
        if cancellable:
            self.run_button.disabled, self.cancel_button.disabled = True, False
        try:
            while any(t.is_alive() for _, t in runs):
                if cancellable and self.cancel_event.is_set():
                    for p, t in runs:
                        if t is p._thread:  # the run waited for, not one the panel started since
                            p.cancel_event.set()
                for _, t in runs:
                    t.join(WAIT_POLL_S)
        finally:
            if cancellable:
                self.run_button.disabled, self.cancel_button.disabled = False, True
        if cancellable and self.cancel_event.is_set():
            self._show("cancelled: the run going on was stopped (its finished rows are kept), and this one not started")
            return False
        self._show("")
        return True

    def _say(self, widget, text: str, error: bool = False, details: str | None = None) -> None:
        """``text`` in the status ``widget`` (an HTML widget; :func:`status_html`); an error also sets ``error``."""
        with _STATUS:
            widget.value = status_html(text, error, details)
            self._said, self._replaced = (widget, widget.value), None
            if error:
                self.error = text

    def wait(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` seconds; None: as long as it takes) for a background run to end."""
        if self._thread is not None:
            self._thread.join(timeout)


class Redrawer:
    """A panel's live figure, redrawn while a run goes on, never in the row callback: ``stale()`` (cheap, from any
    thread: an engine loop's row callback, the load generator's event loop) marks the figure out of date, and it is
    drawn at most every ``every_s`` seconds (:data:`DRAW_EVERY_S`; ``math.inf``: never, the panel draws once at the
    end). Where it is drawn:

    * ``at_rest=True`` (a sweep: each of its points ends with no request in flight, and the next one's warm-up has
      not begun): only in :meth:`rest`, which the sweep calls between two points (its ``on_point``), in the
      measuring thread. No draw overlaps a measured request; a draw adds its own seconds between two points.
    * otherwise (a replay: requests keep the trace's times, and the client is never at rest): a daemon thread
      draws, off the event loop that stamps tokens. It still shares the interpreter with that loop, which waits up
      to Python's switch interval (5 ms) for its turn while a draw runs: lab 09's replay panel, a draw of about
      0.15 s after each finished request at most every second, took the client's loop lag p99 from 1.4-1.5 ms to
      2.9-5.2 ms (four runs), over the run's own "client near its limit" line (ITL p50 / 10, about 4 ms) in three.
      The replay panel draws at most every :data:`lablib.ui.replay.REPLAY_DRAW_EVERY_S` (5 s): 1.7 and 2.9 ms.

    :meth:`close` waits for a draw in progress and stops the thread; the panel then draws its final figure itself.
    An exception in ``draw`` is the panel's to report: it stops nothing.

    Why: a redraw (a figure of every row so far, sent to the browser) takes a few tenths of a second of a core. In
    the row callback it stalled what was measured (lab 03's batched runs waited 0.8-1.4 s in the lab's queue for
    it). In a thread of its own it still takes a core, and the engine computes on both of a two-core machine's:
    ``benchmarks/panel_redraw.py`` (llama.cpp, serial, 8 requests of 16-token prompts, a draw a second) measured
    the request a draw overlapped at 2.0-3.1 times the run's median prefill (about 65 ms against 161-202 ms) and
    1.8 times its median TPOT. Drawn at rest, the slowest request was 1.01-1.21 times the median prefill and
    1.02-1.15 times the median TPOT, as in the same run without a panel (1.20-1.23, 1.07-1.15)."""

    def __init__(self, draw, every_s: float = DRAW_EVERY_S, name: str = "lablib-redraw", at_rest: bool = False):
        self._draw, self.every_s, self.at_rest = draw, every_s, at_rest
        self._stale, self._closed = threading.Event(), threading.Event()
        self._last = -float("inf")  # perf_counter when the last draw ended
        self.draws = 0  # draws made while the run went on
        self._thread = None
        if not at_rest:
            self._thread = threading.Thread(target=self._loop, daemon=True, name=name)
            self._thread.start()

    def stale(self) -> None:
        """The figure is out of date: draw it when ``every_s`` has passed since the last draw."""
        self._stale.set()

    def rest(self, *_) -> None:
        """Nothing is measured now (a sweep between two points; the point's record, when given, is not read): draw
        here, in the caller's thread, when the figure is stale and ``every_s`` has passed since the last draw."""
        if not self.at_rest or self._closed.is_set() or self.every_s == float("inf") or not self._stale.is_set():
            return
        if time.perf_counter() - self._last < self.every_s:
            return
        self._stale.clear()
        self._draw_once()

    def _draw_once(self) -> None:
        try:
            self._draw()
        except Exception:  # noqa: BLE001 - the panel's draw says what went wrong, in its status line
            pass
        self.draws += 1
        self._last = time.perf_counter()

    def _loop(self) -> None:
        if self.every_s == float("inf"):
            return
        while not self._closed.is_set():
            if not self._stale.wait(0.05) or self._closed.is_set():
                continue
            self._stale.clear()
            t = time.perf_counter()
            self._draw_once()
            self._closed.wait(max(0.0, self.every_s - (time.perf_counter() - t)))

    def close(self) -> None:
        """Stop redrawing: waits for a draw in progress to end (so the panel's final draw is the last)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
