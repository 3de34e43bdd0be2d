"""The lab's settings in one place: its folders, quick mode and the quick/full budgets.

Environment variables (all optional; ``LABLIB_THREADS`` is read by :mod:`lablib.machine.threads`):

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


# `lablib doctor` warns when the disk holding the lab home has less free than this (bytes): a quantization ladder,
# an ONNX export or vLLM's environment each writes several GB, and a full disk fails them half way
LOW_DISK_BYTES = 10 * 2**30


def home_usage(home: Path | None = None) -> dict:
    """What the lab home holds: ``folders`` (each top-level entry's bytes, largest first), ``total`` (bytes),
    ``free`` (bytes free on its disk, ``shutil.disk_usage``; None when it cannot be read), ``home``, and
    ``error``: why the home itself could not be read (a permission), else None. Apparent sizes of regular files,
    each counted once (a hard link's bytes in the first folder that has it), symbolic links not followed; a
    missing home holds 0 bytes, an unreadable folder inside it counts as 0."""
    import shutil
    import stat

    home = Path(lab_home() if home is None else home)
    seen: set[tuple[int, int]] = set()

    def size(path: Path) -> int:
        total, stack = 0, [path]
        while stack:
            p = stack.pop()
            try:
                st = p.lstat()  # the link itself, never what it points to
                if stat.S_ISDIR(st.st_mode):
                    stack.extend(p.iterdir())
            except OSError:  # removed meanwhile, or unreadable
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
        return total

    folders, error, free = {}, None, None
    try:
        if home.is_dir():
            folders = {p.name: size(p) for p in home.iterdir()}
    except OSError as e:  # the home, or a folder above it, not readable by this user
        error = f"{type(e).__name__}: {e.strerror or e}"
    folders = dict(sorted(folders.items(), key=lambda kv: -kv[1]))
    for probe in (home, *home.parents):  # the home, or the nearest folder above it that exists
        try:
            free = shutil.disk_usage(probe).free
            break
        except OSError:
            continue
    return {"home": str(home), "folders": folders, "total": sum(folders.values()), "free": free, "error": error}


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
    # lab 01: the first requests after each load, each engine in a fresh process (lablib.studies.first_requests)
    "first_requests": {"loads": (2, 2), "requests": (4, 6)},
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
    # lab 10, structured output (lablib.studies.decoding.structured): output budget (tokens; the shipped schemas'
    # answers take 30-60), constrained and free requests per schema after the first, and the schemas (files in
    # data/schemas: person, order, weather)
    "structured": {
        "max_new_tokens": (64, 96),
        "reps": (1, 3),
        "schemas": (("person",), ("person", "order", "weather")),
    },
    # concurrency sweep; requests per run default to requests_per_client x C
    # quick: 4 clients of short prompts (decode most of each request: lab 03 shows batching's gain, measured
    # 1.4-3.8x across the engines on two cores; 1 and 2 clients of 32-token prompts and 8 tokens showed 1.1-1.6x)
    "concurrency": {
        "max_new_tokens": (16, 32),
        "prompt_tokens": (16, 64),
        "concurrency": ((1, 4), (1, 2, 4, 8)),
        "requests_per_client": (2, 2),
    },
    # lab 05 (lablib.studies.serving): requests per rate, Poisson rates (requests/s), goodput targets (s)
    "serving": {
        "prompt_tokens": (32, 64),
        "max_new_tokens": (8, 16),
        "reps": (2, 5),
        "requests": (4, 12),
        "rates": ([0.5, 4.0], [0.25, 0.5, 1.0, 2.0, 4.0]),
        "ttft_s": (1.0, 2.0),
        "tpot_s": (0.1, 0.1),
    },
    # lab 09 (lablib.studies.scheduler): the long prompt of the head-of-line experiment and the small batch it
    # is prefilled in chunks of (llama-server -b), the knee's rates (requests/s) and requests per rate, the
    # KV-capacity run (prompt, output, blocks of vLLM's cache), the slice of the Mooncake trace replayed
    "scheduler": {
        "hol_prompt_tokens": (256, 1024),
        "hol_batch": (64, 128),
        "knee_rates": ([0.5, 1.0, 2.0, 4.0, 8.0], [0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0]),
        "knee_requests": (6, 16),
        "kv_prompt_tokens": (200, 200),
        "kv_new_tokens": (80, 100),
        "kv_blocks": (5, 5),
        "kv_concurrency": ((1, 2), (1, 2, 3)),
        "replay_start": (26, 0),
        "replay_count": (10, 40),
        "replay_length_scale": (1 / 64, 1 / 32),
        # the requests of that slice replayed twice, prefix caching on and off (lablib.studies.scheduler.prefix_reuse:
        # quick leaves out its two longest, the last); the multi-turn chats (multi_turn): sessions, turns each, a
        # shared system prompt, a question and an answer per turn (tokens), the think time between turns (s)
        "reuse_count": (8, 40),
        "chat_sessions": (2, 4),
        "chat_turns": (3, 5),
        "chat_system_tokens": (128, 256),
        "chat_question_tokens": (32, 48),
        "chat_answer_tokens": (12, 24),
        "chat_think_s": (3.0, 4.0),
    },
    # lab 06 (lablib.studies.ladder): the quantization types, the perplexity text (n_ctx tokens x
    # n_chunks) and the speed request of each rung; the quick ladder keeps Q4_1, the source's own type, whose KL
    # floor the lab's question (1) holds against Q8_0's
    "ladder": {
        "types": (
            ("Q8_0", "Q5_0", "Q4_K_M", "Q4_1", "Q4_0", "Q2_K"),
            ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_1", "Q5_0", "Q4_K_M", "Q4_1", "Q4_0", "IQ4_NL", "Q3_K_M", "Q2_K"),
        ),
        "n_ctx": (128, 512),
        "n_chunks": (2, 4),
        "prompt_tokens": (32, 256),
        "max_new_tokens": (8, 64),
        "reps": (1, 3),
    },
    # lab 07 (lablib.machine.ceilings.measure_machine): repetitions of each micro-benchmark, matmul size n
    # (float32 at n; bfloat16 and int8 up to n within MAX_PRODUCT_S a product): 3-5 s on two cores either way, 6-9 s
    # where a large L3 makes the bandwidth arrays 1 GiB
    "machine": {"reps": (3, 5), "matmul_n": (2048, 2048)},
    # lab 10, speculative decoding (lablib.studies.decoding.speculative): the engines (in-process names and servers
    # the lab starts, comma-separated), draft lengths k, text kinds, the target and the drafts (lab 06's GGUF kinds,
    # for a GGUF server), output tokens, requests per arm after a warm-up, streams in flight (1, then batching)
    "speculative": {
        "engines": ("llama.cpp,llama-server", "llama.cpp,transformers,llama-server"),
        "ks": ((4,), (2, 4, 6)),
        "texts": (("repetitive", "prose"), ("prose", "code", "repetitive")),
        "target": ("F16", "F16"),
        "drafts": (("Q4_0",), ("Q8_0", "Q4_0", "Q2_K")),
        "max_new_tokens": (12, 48),
        "reps": (3, 3),  # the median of 3: one request slowed by a busy machine moves no number
        "parallel": ((1,), (1, 2)),
    },
    # lab 11, adapters (lablib.studies.adapters): the in-process engines and the servers (multi-LoRA), the adapter
    # ranks, the prompt and output of every request (tokens), requests per arm after a warm-up, the servers'
    # closed-loop clients (as many adapters loaded as the most clients) and requests per client
    "adapters": {
        "engines": ("llama.cpp,transformers,mlx", "llama.cpp,transformers,mlx"),
        "servers": ("llama-server", "llama-server,vllm"),
        "ranks": ((8,), (8, 64)),  # quick: rank 8 alone (lab 11 under the browser test with another worker busy)
        "prompt_tokens": (32, 128),
        "max_new_tokens": (16, 32),
        "reps": (2, 3),
        "concurrency": ((1, 4), (1, 2, 4, 8)),
        "requests_per_client": (2, 3),
    },
    # `lablib roofline`: the run measured now for an engine without rows from this machine and model
    "roofline": {"prompt_tokens": (64, 64), "max_new_tokens": (32, 32), "reps": (3, 3)},
}


def budgets(kind: str, quick: bool | None = None) -> dict:
    """Every setting of ``kind`` from :data:`BUDGETS` for quick or full mode, as {setting: value}.
    Raises LabError for an unknown kind."""
    if kind not in BUDGETS:
        raise LabError(f"unknown budget kind {kind!r}: expected one of {', '.join(BUDGETS)}")
    return {setting: budget(kind, setting, quick) for setting in BUDGETS[kind]}


def budget(kind: str, setting: str, quick: bool | None = None):
    """The default of ``setting`` for a ``kind`` of run from :data:`BUDGETS`, in quick mode or
    full (``quick`` None: :func:`quick_mode`). Raises LabError for an unknown kind or setting."""
    if kind not in BUDGETS or setting not in BUDGETS[kind]:
        have = ", ".join(f"{k}.{s}" for k, v in BUDGETS.items() for s in v)
        raise LabError(f"no budget {kind}.{setting}: expected one of {have}")
    q, full = BUDGETS[kind][setting]
    return q if (quick_mode() if quick is None else quick) else full
