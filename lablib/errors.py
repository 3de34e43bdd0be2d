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
