"""The SSE parser against web-platform-tests' eventsource/format-* streams (tests/data/wpt_eventsource.json,
BSD-3-Clause, its notice kept there), whole and split at every byte, and against malformed fields that
must never poison it."""

import json
from pathlib import Path

import pytest

from lablib.engines.http.sse import SSEParser

WPT = json.loads((Path(__file__).parent / "data" / "wpt_eventsource.json").read_text(encoding="utf-8"))
CASES = WPT["cases"]


def parse(parts):
    p = SSEParser()
    events = []
    for part in parts:
        events += p.feed(part)
    return events, p


def as_wpt(events):
    """What an EventSource shows: lastEventId is "" where the parser has None (no id yet)."""
    out = []
    for e in events:
        d = {"data": e.data, "event": e.event, "id": e.id or ""}
        if e.retry is not None:
            d["retry"] = e.retry
        out.append(d)
    return out


def test_the_data_file_keeps_the_wpt_license():
    text = "\n".join(WPT["license"])
    assert "Copyright © web-platform-tests contributors" in text and "3-Clause BSD" in text
    assert len(CASES) == 21


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
@pytest.mark.parametrize("split", ["whole", "bytes"])
def test_wpt_format_case(case, split):
    raw = case["stream"].encode("utf-8")
    parts = [raw] if split == "whole" else [raw[i : i + 1] for i in range(len(raw))]
    events, p = parse(parts)
    assert as_wpt(events) == case["events"], case.get("note", case["source"])
    assert p.close() is bool(case.get("unfinished"))
    if "last_event_id" in case:
        assert (p.last_id or "") == case["last_event_id"]


# --- malformed fields never poison the parser (spec: "retry" only if all ASCII digits, else ignored) -------
@pytest.mark.parametrize(
    "value",
    ["²", "١٢", "１２", "12a", "-5", " 5", "1.5", "9" * 5000, "\0", "\ufffd"],
    ids=["superscript", "arabic-indic", "fullwidth", "suffix", "negative", "space", "float", "huge", "nul", "fffd"],
)
def test_a_bogus_retry_is_ignored_and_the_stream_goes_on(value):
    p = SSEParser()
    first = p.feed(f"retry: 300\ndata: a\n\nretry: {value}\ndata: x\n\n".encode())
    assert [(e.data, e.retry) for e in first] == [("a", 300), ("x", None)]  # the read's events are kept
    assert p.malformed == 1
    later = p.feed(b"data: y\n\n")  # and the next read parses
    assert [e.data for e in later] == ["y"]


def test_no_bytes_at_all_can_make_feed_raise():
    import random

    rng = random.Random(23)
    alphabet = [b"data", b"retry", b"id", b"event", b":", b" ", b"\n", b"\r", b"\0", "²".encode(), b"\xff", b"7"]
    p = SSEParser()
    for _ in range(2000):
        p.feed(b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))))
    p.feed(b"\n\ndata: after\n\n")
    assert p.feed(b"data: still\n\n")[0].data == "still"
