"""A panel's run in a background thread, and its status line: what Run starts (the widgets stay live while it runs), what a notebook
or a test waits for, and the event Cancel sets. The panels (:class:`lablib.ui.widgets.SweepPanel`,
:class:`lablib.ui.replay.ReplayPanel`) inherit it and define ``_execute(values, raise_errors)``."""

from __future__ import annotations

import html
import threading


def status_html(text: str, error: bool = False, details: str | None = None) -> str:
    """A panel's status line as HTML: ``text`` escaped (red when ``error``), ``details`` folded below it."""
    body = html.escape(text)
    if details:
        body += f"<details><summary>details</summary><pre>{html.escape(details)}</pre></details>"
    color = "#B00020" if error else "#333"
    return f"<div style='color:{color};white-space:pre-wrap'>{body}</div>"


class BackgroundRun:
    """``running``, :meth:`wait` and :meth:`_start_background` for a panel with an ``_execute(values,
    raise_errors)`` method (its run, in the calling thread when ``raise_errors`` is True)."""

    _thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _start_background(self, values, name: str, busy) -> threading.Thread | None:
        """``_execute(values(), False)`` in a daemon thread called ``name``, started, or None: when a run is
        going on (``busy()`` then says so in the panel) or ``values()`` refused the form (None: its message is
        already shown)."""
        if self.running:
            busy()
            return None
        v = values()
        if v is None:
            return None
        self._thread = threading.Thread(target=self._execute, args=(v, False), daemon=True, name=name)
        self._thread.start()
        return self._thread

    def _say(self, widget, text: str, error: bool = False, details: str | None = None) -> None:
        """``text`` in the status ``widget`` (an HTML widget; :func:`status_html`); an error also sets ``error``."""
        widget.value = status_html(text, error, details)
        if error:
            self.error = text

    def wait(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` seconds; None: as long as it takes) for a background run to end."""
        if self._thread is not None:
            self._thread.join(timeout)
