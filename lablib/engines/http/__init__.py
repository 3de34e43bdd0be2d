"""Any OpenAI-compatible server as an engine.

- :mod:`lablib.engines.http.engine`: :class:`HTTPEngine` (its event-loop thread, session, timeouts, requests);
- :mod:`lablib.engines.http.protocol`: the APIs, each server kind's stream profile, one chunk parsed, the
  token count across a stream, HTTP errors as one message;
- :mod:`lablib.engines.http.trace`: :class:`HTTPTrace`, one request's trace with the stream's facts;
- :mod:`lablib.engines.http.sse`: the event-stream parser.
"""

from __future__ import annotations

from lablib.engines.http.engine import HTTPEngine  # noqa: F401
from lablib.engines.http.protocol import KINDS, PROFILES, HTTPEngineError, ServerProfile, parse_chunk  # noqa: F401
from lablib.engines.http.trace import HTTPTrace  # noqa: F401
