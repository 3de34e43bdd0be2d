"""The one check of the whole numbers and lists a user gives (counts, ports, slots, tokens).

One semantics everywhere: an ``int`` or a numpy integer (anything :func:`operator.index` takes),
never a ``bool``, never a float; a string of digits only where the caller says so
(``strings=True``: a CLI flag, an environment variable, a widget's text). Raises LabError naming
what was given and what was expected.
"""

from __future__ import annotations

import functools
import operator

from lablib.errors import LabError, shown


def whole(value, what: str, expected: str, lo: int | None = 1, hi: int | None = None, strings: bool = False) -> int:
    """``value`` as an int from ``lo`` to ``hi`` (either None: unbounded); LabError
    ``"{what}={value!r}: expected {expected}"`` otherwise."""
    try:
        if strings and isinstance(value, str) and value.strip().isdecimal():
            n = int(value)
        else:
            n = None if isinstance(value, bool) else operator.index(value)
    except (TypeError, ValueError):
        n = None
    if n is None or (lo is not None and n < lo) or (hi is not None and n > hi):
        raise LabError(f"{what}={shown(value)}: expected {expected}")
    return n


def csv_list(values, what: str = "list", example: str = "a,b") -> list:
    """The one reading of a comma-separated list a user gives (a CLI flag, a widget's text): "a,b, c" as
    ["a", "b", "c"]; "" (or blanks) as []; a list or tuple as a list; None as []. An empty item ("a,,b", "a,b,")
    is refused, never dropped: LabError ``"{what}='a,,b': an empty item ... e.g. {example}"`` (the CLI names the
    flag)."""
    if values is None:
        return []
    if isinstance(values, str):
        if not values.strip():
            return []
        items = [v.strip() for v in values.split(",")]
        if "" in items:
            raise LabError(
                f"{what}={shown(values)}: an empty item (two commas together, or one at an end); expected values "
                f"separated by single commas, e.g. {example}"
            )
        return items
    return list(values)


def csv_text(values) -> str:
    """Values as one comma-separated string ("64,256"): what :func:`csv_list` reads back."""
    return ",".join(str(v) for v in values)


def positive_ints(values, what: str) -> list[int]:
    """``values`` (a list, or "64,256" from a command line or widget, or one whole number: ``prompt_tokens=8``) as
    a non-empty list of ints of at least 1; LabError otherwise (was, for one number: "expected whole numbers such
    as 64,256")."""
    if not isinstance(values, (str, bool)) and hasattr(values, "__index__"):
        values = [values]
    if isinstance(values, dict):  # its keys would pass for the values
        raise LabError(f"{what}={shown(values)}: expected whole numbers such as 64,256")
    items = csv_list(values, what, "64,256") if isinstance(values, str) else values
    try:
        items = list(items)
    except TypeError:
        raise LabError(f"{what}={shown(values)}: expected whole numbers such as 64,256") from None
    if not items:
        raise LabError(f"{what} is empty: expected at least one value")
    out = []
    for v in items:
        try:
            out.append(whole(v, what, "whole numbers such as 64,256", lo=None, strings=True))
        except LabError:
            raise LabError(f"{what}={shown(values)}: expected whole numbers such as 64,256") from None
    bad = [v for v in out if v < 1]
    if bad and len(out) == 1:  # one value (a flag such as --reps): said as one, not as a list
        raise LabError(f"{what}={out[0]}: expected a whole number of at least 1")
    if bad:
        raise LabError(f"{what}={out}: every value must be at least 1 (got {bad})")
    return out


def chat_messages(messages, what: str = "messages") -> list[dict]:
    """``messages`` as a chat: a non-empty list of {"role": text, "content": text (or a list of parts)} objects;
    LabError naming the first that is not (was: the chat template's own error, jinja2's "'dict object' has no
    attribute 'content'", or transformers' "Chat messages should be dicts")."""
    expected = 'expected a non-empty list of {"role": ..., "content": ...} objects, such as [{"role": "user", "content": "Hi"}]'
    if not isinstance(messages, (list, tuple)) or not messages:
        raise LabError(f"{what}={shown(messages)}: {expected}")
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), (str, list))
        ):
            raise LabError(f"{what}[{i}]={shown(m)}: {expected}")
    return list(messages)


def keywords_checked(fn):
    """``fn``, whose call with a keyword it does not take is one LabError naming that keyword, the nearest one it
    takes, and all it takes: "context_sweep takes no prompt_token=: did you mean prompt_tokens=? It takes model,
    engines, ...". For the functions a notebook calls through ``lablib.`` (was: Python's TypeError "got an unexpected
    keyword argument", which names no keyword it takes). A function that takes ``**kwargs`` is left as it is."""
    import difflib
    import inspect

    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            near = difflib.get_close_matches(unknown[0], names, 1)
            guess = f"did you mean {near[0]}=? " if near else ""
            raise LabError(f"{fn.__name__} takes no {unknown[0]}=: {guess}It takes {', '.join(names)}")
        return fn(*args, **kwargs)

    checked.keywords_checked = True  # carried by wrappers above it (functools.wraps updates __dict__)
    return checked
