"""Server-sent events: an incremental parser that follows the WHATWG event-stream rules.

Feed it the bytes of each network read; it returns the events completed by that read.
What it handles, as the standard says (html.spec.whatwg.org, "Server-sent events"):

- line ends ``\\n``, ``\\r\\n`` and ``\\r`` (a ``\\r`` at the end of one read and a ``\\n`` at
  the start of the next are one line end);
- comment lines (``: ping``) are ignored, and counted in :attr:`SSEParser.comments`;
- ``field: value`` with one optional space after the colon; a line without a colon is a
  field with an empty value;
- several ``data:`` lines in one event are joined with ``\\n``;
- an event ends at a blank line; an event with no data is not dispatched;
- an event split across reads, and several events in one read;
- a UTF-8 byte-order mark at the start, and UTF-8 characters split across reads;
- ``retry`` only when its value is all ASCII digits, an ``id`` holding U+0000 ignored; a field the
  parser cannot use is ignored and counted (:attr:`SSEParser.malformed`), never raised: nothing a
  server sends leaves the parser in a state that fails the next read.

Checked against web-platform-tests' ``eventsource/format-*`` streams (tests/data/wpt_eventsource.json).

A stream's ``data: [DONE]`` (OpenAI's end marker) and ``event: error`` are ordinary
events here: the HTTP engine gives them their meaning. An event left unfinished when the
stream ends is discarded (:meth:`SSEParser.close` says whether one was).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(slots=True)
class SSEEvent:
    """One dispatched event: ``event`` type (default "message"), ``data`` (lines joined by
    ``\\n``), the last ``id`` seen (None if none) and ``retry`` (ms) when the event set one."""

    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None


class SSEParser:
    """Incremental event-stream parser: :meth:`feed` bytes, get the events they completed."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""  # text not yet ending in a line end
        self._skip_lf = False  # the previous chunk ended in \r: a leading \n belongs to it
        self._first = True  # strip a BOM once
        self._data: list[str] = []
        self._event = ""
        self._retry: int | None = None
        self._has_fields = False
        self._id: str | None = None  # the last event ID buffer: the last valid id field, kept across events
        self.last_id: str | None = None  # the last event ID string: the buffer as of the last dispatch
        self.malformed = 0  # lines with a field that could not be used (ignored)
        self.comments = 0  # comment lines seen (keep-alive pings)
        self.lines = 0  # lines completed (blank, comment and field lines)
        self.events = 0  # events dispatched

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Parse the bytes of one read; returns the events that read completed, in order.

        Never raises on what a server sends: a field it cannot use is ignored (as the standard
        says), and the read's complete lines leave the buffer before any is interpreted, so one
        bad line cannot stay behind to fail every later read."""
        text = self._decoder.decode(chunk)
        if self._first and text:
            self._first = False
            text = text.removeprefix("\ufeff")
        if self._skip_lf and text:
            self._skip_lf = False
            text = text.removeprefix("\n")
        buf = self._buf + text if self._buf else text
        if "\r" not in buf:  # the common case: \n line ends only, one split (no scan per line)
            lines = buf.split("\n")
            self._buf = lines.pop()  # what follows the last line end (committed before the lines are read)
            return self._lines(lines)
        lines: list[str] = []
        pos, n = 0, len(buf)
        while pos < n:
            cr, lf = buf.find("\r", pos), buf.find("\n", pos)
            if cr < 0 and lf < 0:
                break
            end = lf if cr < 0 else cr if lf < 0 else min(cr, lf)
            lines.append(buf[pos:end])
            if buf[end] == "\r":
                if end + 1 < n:
                    pos = end + 2 if buf[end + 1] == "\n" else end + 1
                else:  # \r last: its \n may come with the next read
                    pos, self._skip_lf = end + 1, True
            else:
                pos = end + 1
        self._buf = buf[pos:]  # committed before the lines are read
        return self._lines(lines)

    def _lines(self, lines: list[str]) -> list[SSEEvent]:
        """The events that these complete lines finish, in order."""
        self.lines += len(lines)
        out: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if line[:6] == "data: ":  # the hot path of a token stream: a data line, then a blank line
                data.append(line[6:])
                self._has_fields = True
                continue
            if not line:
                if data and not self._event and self._retry is None:  # _dispatch of the usual event, inline
                    self._data, self._has_fields, self.last_id = [], False, self._id
                    self.events += 1
                    out.append(SSEEvent("message", data[0] if len(data) == 1 else "\n".join(data), self._id, None))
                else:
                    ev = self._dispatch()
                    if ev is not None:
                        out.append(ev)
                data = self._data
                continue
            try:
                self._line(line)
            except (ValueError, TypeError, OverflowError):  # a field it cannot use: ignored, counted
                self.malformed += 1
        return out

    def close(self) -> bool:
        """End of stream: True when an unfinished event (or line) was left and discarded."""
        left = bool(self._buf) or self._has_fields
        self._buf, self._data, self._event, self._retry, self._has_fields = "", [], "", None, False
        return left

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            self.comments += 1
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        self._has_fields = True
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:  # an id with U+0000 is ignored
            self._id = value
        elif name == "retry":  # only ASCII digits set it: "²" and "١٢" are digits to str.isdigit, not here
            if value.isascii() and value.isdigit():
                self._retry = int(value)
            elif value:
                self.malformed += 1
        return None  # other fields are ignored, as the standard says

    def _dispatch(self) -> SSEEvent | None:
        data, event, retry = self._data, self._event, self._retry
        self._data, self._event, self._retry, self._has_fields = [], "", None, False
        self.last_id = self._id  # set at every dispatch, an event without data included
        if not data:
            return None
        self.events += 1
        return SSEEvent(event or "message", data[0] if len(data) == 1 else "\n".join(data), self._id, retry)
