"""Any OpenAI-compatible server as an engine (:mod:`lablib.engines.http.engine`), with its
event-stream parser (:mod:`lablib.engines.http.sse`)."""

from __future__ import annotations

from lablib.engines.http.engine import (  # noqa: F401
    KINDS,
    PROFILES,
    HTTPEngine,
    HTTPEngineError,
    HTTPTrace,
    ServerProfile,
    parse_chunk,
)
