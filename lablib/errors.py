"""User-facing errors: each message names what was given, what was expected and what to do."""


class LabError(Exception):
    """A user-facing error (the CLI prints its message alone, without a traceback)."""


class ContextOverflowError(LabError):
    """Prompt plus output does not fit the engine's context window."""


class FormatError(LabError):
    """An engine was given a model format it cannot read, or a path is no model."""


class EngineUnavailable(LabError):
    """An engine's library is not installed or cannot load here."""


class TraceError(LabError, ValueError):
    """A metric asked of a trace that lacks the timestamps it needs (a ValueError too)."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (at most 200 characters), for one-line errors."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def is_html(content_type: str, body: str = "") -> bool:
    """Whether an answer is an HTML page: its content type says so, or its text starts as one does."""
    kind = (content_type or "").split(";")[0].strip().lower()
    return kind in ("text/html", "application/xhtml+xml") or body.lstrip()[:15].lower().startswith(
        ("<!doctype html", "<html")
    )


def excerpt(body: str, content_type: str = "", limit: int = 100) -> str:
    """Another program's answer as one short line for a message: an HTML page's text alone (tags, scripts, styles
    and comments dropped, entities read), whitespace run together, at most ``limit`` characters ("..." where
    cut); "" for an empty answer."""
    import html
    import re

    text = body or ""
    if is_html(content_type, text):
        text = re.sub(r"(?is)<(script|style)\b.*?</\1\s*>|<!--.*?-->", " ", text)
        text = html.unescape(re.sub(r"(?s)<[^>]*>", " ", text))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def shown(value) -> str:
    """``value`` as a message shows it: its repr, cut to 40 characters."""
    r = repr(value)
    return r if len(r) < 40 else f"{r[:37]}..."


def json_kind(value) -> str:
    """What a parsed JSON value is, in JSON's words ("null", "array", "string", "number", "true or false",
    "object"), for a message about a file or an answer (was Python's: "a JSON NoneType", "a JSON list")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    kinds = {list: "array", str: "string", int: "number", float: "number", dict: "object"}
    return next((k for t, k in kinds.items() if isinstance(value, t)), type(value).__name__)
