"""The lab's settings in one place: its folders, quick mode, threads, and the quick/full budgets.

Environment variables (all optional):

- ``LABLIB_HOME``: derived models and caches (default ``~/.cache/lablib``)
- ``LABLIB_DATA``: the project's ``data/`` folder (default: the one beside ``lablib/``)
- ``LABLIB_QUICK``: small budgets for notebooks and CI (``1``, ``true``, ``yes``)
- ``LABLIB_THREADS``: threads for CPU engines (default: the CPUs this process may use)

:data:`BUDGETS` is the one table of quick and full defaults that the sweeps, the
widgets and the CLI read; :func:`budget` picks the value for the current mode.
"""

from __future__ import annotations

import os
from pathlib import Path

from lablib.errors import LabError


def lab_home() -> Path:
    """Folder for derived models and caches: $LABLIB_HOME or ~/.cache/lablib."""
    return Path(os.environ.get("LABLIB_HOME") or Path.home() / ".cache" / "lablib")


def data_dir() -> Path:
    """The project's data/ folder ($LABLIB_DATA overrides)."""
    return Path(os.environ.get("LABLIB_DATA") or Path(__file__).resolve().parent.parent / "data")


def quick_mode() -> bool:
    """True when LABLIB_QUICK is set to a true value (small budgets for notebooks and CI)."""
    return os.environ.get("LABLIB_QUICK", "").strip().lower() not in ("", "0", "false", "no")


# --- budgets ------------------------------------------------------------------------------------
# kind -> setting -> (quick, full). Prompt lengths and output budgets in tokens.
BUDGETS = {
    # lab 01: the same prompt through each engine
    "side_by_side": {"max_new_tokens": (16, 64), "reps": (2, 5)},
    # context sweep; prompt_tokens None: log-spaced from 64 up to the trained context
    "context": {"max_new_tokens": (8, 32), "reps": (1, 3), "prompt_tokens": ((64, 256), None)},
    # the sweep panel's first context run: short enough to watch
    "context_panel": {"prompt_tokens": ((64, 256), (64, 128, 256, 512, 1024))},
    # lab 03's anchor: llama.cpp's own batched benchmark next to the lab (lablib.studies.anchors.batched_rows)
    "anchors": {"batches": ((1, 2), (1, 2, 4, 8)), "prompt_tokens": (32, 64), "max_new_tokens": (16, 32)},
    # lab 08, prefix caching (lablib.studies.prefix): a system prompt of S tokens + a question, with and without reuse
    "prefix": {
        "shared_tokens": ((16, 64), (64, 256, 1024, 2048)),
        "questions": (2, 3),
        "reps": (1, 3),
        "max_new_tokens": (4, 16),
    },
    # lab 08: a chat, each turn reusing the previous ones (or not); output tokens per answer at most
    "prefix_chat": {"turns": (3, 6), "max_new_tokens": (8, 32)},
    # concurrency sweep; requests per run default to requests_per_client x C
    "concurrency": {
        "max_new_tokens": (8, 32),
        "prompt_tokens": (32, 64),
        "concurrency": ((1, 2), (1, 2, 4, 8)),
        "requests_per_client": (2, 2),
    },
}


def budget(kind: str, setting: str, quick: bool | None = None):
    """The default of ``setting`` for a ``kind`` of run from :data:`BUDGETS`, in quick mode or
    full (``quick`` None: :func:`quick_mode`). Raises LabError for an unknown kind or setting."""
    if kind not in BUDGETS or setting not in BUDGETS[kind]:
        have = ", ".join(f"{k}.{s}" for k, v in BUDGETS.items() for s in v)
        raise LabError(f"no budget {kind}.{setting}: expected one of {have}")
    q, full = BUDGETS[kind][setting]
    return q if (quick_mode() if quick is None else quick) else full
