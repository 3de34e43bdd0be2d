"""The worked-example cases of lab 04, read from ``data/cases/`` (one reader, one unescaping).

- ``first_token_flip``: the default model's chat prompt as token ids, and what each engine picked
- ``rope_theta_v5``: a config as transformers 5 writes it (returns the path of its config.json)
- ``tokenizer_probe``: text heavy in digits, whitespace, unicode and code (``\\n`` and ``\\t``
  written as escapes in the file, returned unescaped)
"""

from __future__ import annotations

import json
from pathlib import Path

from lablib.checks import keywords_checked
from lablib.config import data_dir
from lablib.errors import LabError

CASES = ("first_token_flip", "rope_theta_v5", "tokenizer_probe")


def cases_dir(root: Path | None = None) -> Path:
    """The folder of the cases: ``root`` or ``data_dir()/cases``."""
    return Path(root) if root is not None else data_dir() / "cases"


def unescape_probe(text: str) -> str:
    """The probe file's lines with ``\\n`` and ``\\t`` written as escapes, as the real text."""
    return "\n".join(ln.replace("\\n", "\n").replace("\\t", "\t") for ln in text.splitlines())


@keywords_checked
def load_case(name: str, root: Path | None = None):
    """One case: ``first_token_flip`` (a dict), ``rope_theta_v5`` (the Path of its config.json) or
    ``tokenizer_probe`` (a str). ``root``: another cases folder (the tests keep their own copy).
    Raises LabError for an unknown name or a missing file."""
    folder = cases_dir(root)
    files = {
        "first_token_flip": "first_token_flip.json",
        "rope_theta_v5": "rope_theta_v5/config.json",
        "tokenizer_probe": "tokenizer_probe.txt",
    }
    if name not in files:
        raise LabError(f"unknown case {name!r}: expected one of {', '.join(CASES)}")
    path = folder / files[name]
    if not path.is_file():
        raise LabError(
            f"case {name}: {path} not found; expected the project's data/ folder "
            "(set LABLIB_DATA to its path when lablib is installed elsewhere)"
        )
    if name == "first_token_flip":
        return json.loads(path.read_text(encoding="utf-8"))
    if name == "tokenizer_probe":
        return unescape_probe(path.read_text(encoding="utf-8"))
    return path
