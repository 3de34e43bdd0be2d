"""The one tokenizer the lab uses for text: the model's Hugging Face tokenizer (loaded once per folder).

Every engine is fed the same token ids; text becomes ids (prompts, chat templates, streamed text
re-tokenized by the HTTP engine) through this tokenizer only.

Loaded without torch. ``AutoTokenizer`` picks the class (from the folder's tokenizer_config.json, its
config's model type and transformers' own tables), and to read the config it imports transformers'
configuration module, which imports torch: 2.5-3.8 s and about 250 MiB in a process that only needs
token ids (a llama.cpp run, a client of a server, a notebook before its first transformers engine).
So the class ``AutoTokenizer`` picks for a folder is asked once, in a child process, and kept (a small
JSON file under ``lab_home()/cache/tokenizer``, keyed by the folder, the files that decide the choice
and transformers' version); every later load imports that class and calls its own ``from_pretrained``,
which is the call ``AutoTokenizer`` itself ends with: the same object, token for token (tested on
every model the lab has prepared). Where torch is already imported, ``AutoTokenizer`` is used as is.
A class from outside transformers (a hub repository's own code), or any failure of the light path,
falls back to ``AutoTokenizer`` in this process, which says what is wrong as it always did.
From transformers 5.18: 5.11-5.17's tokenizer module imports torch itself (its GGUF reader, at the top), so
there the class is still loaded this way, and torch with it.
"""

from __future__ import annotations

import functools
import sys
import threading

from lablib.errors import FormatError, LabError

# a tokenizer's own files (the fast tokenizer's, SentencePiece's, a BPE vocabulary's); a folder with none of them
# makes transformers 5 build an empty tokenizer that turns every text into no ids at all
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def check_tokenizer_files(path) -> None:
    """FormatError unless the model folder ``path`` holds a tokenizer's own files (:data:`TOKENIZER_FILES`): the lab
    makes every prompt with it, and llama.cpp's converter and mlx-lm need it to derive their formats."""
    from pathlib import Path

    if not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        raise FormatError(
            f"{path}: no tokenizer beside the weights (none of {', '.join(TOKENIZER_FILES)}); expected the model's "
            "tokenizer files in its folder: save them there (tokenizer.save_pretrained(FOLDER)) or copy them in"
        )


# the files of a folder that decide which class AutoTokenizer picks, besides transformers' version
CLASS_DECIDED_BY = ("tokenizer_config.json", "config.json", "tokenizer.json", "tokenizer.model", "vocab.json")
CLASS_CACHE_VERSION = 1
# run in a child: AutoTokenizer's choice of class for the folder argv[1], as "module:qualname" on the last line
_ASK_CLASS = """\
import sys
from transformers import AutoTokenizer
t = type(AutoTokenizer.from_pretrained(sys.argv[1]))
print(t.__module__ + ":" + t.__qualname__)
"""
_lock = threading.Lock()  # transformers' lazy imports are not safe from two threads at once


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str):
    check_tokenizer_files(path)
    with _lock:
        if "torch" not in sys.modules:
            cls = tokenizer_class(path)
            if cls is not None:
                try:
                    return cls.from_pretrained(path)
                except Exception:  # noqa: BLE001 - AutoTokenizer below says what is wrong, as it always did
                    pass
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        _keep_class_name(path, f"{type(tok).__module__}:{type(tok).__qualname__}")
        return tok


def tokenizer_class(path: str):
    """The class ``AutoTokenizer.from_pretrained(path)`` returns an instance of, found without importing torch
    in this process: kept from an earlier ask (see the module docstring), or asked of a child process (seconds,
    once per folder and transformers version). None when it cannot be told (the child failed, a class from outside
    transformers, a cache that cannot be written is no failure)."""
    import importlib

    name = _kept_class(path)
    if name is None:
        name = _ask_class(path)
        if name is None:
            return None
        _keep_class_name(path, name)
    module, _, qualname = name.partition(":")
    if not module.startswith("transformers.") or not qualname or "." in qualname:
        return None
    try:
        cls = getattr(importlib.import_module(module), qualname)
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except (ImportError, AttributeError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, PreTrainedTokenizerBase) else None


def _class_cache_file(path: str):
    import hashlib
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    from lablib.config import lab_home

    try:
        tv = version("transformers")
    except PackageNotFoundError:
        return None
    folder = Path(path).resolve()
    parts = [str(CLASS_CACHE_VERSION), str(folder), tv]
    for f in CLASS_DECIDED_BY:
        try:
            st = (folder / f).stat()
            parts.append(f"{f}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{f}:-")
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]
    return lab_home() / "cache" / "tokenizer" / f"{key}.json"


def _kept_class(path: str) -> str | None:
    import json

    f = _class_cache_file(path)
    try:
        name = json.loads(f.read_text())["class"] if f is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or unreadable: ask again
    return name if isinstance(name, str) else None  # a number or a list there (a hand edit): ask again


def _keep_class_name(path: str, name: str) -> None:
    import json

    from lablib.staging import staged

    f = _class_cache_file(path)
    if f is None:
        return
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        with staged(f) as tmp:
            tmp.write_text(json.dumps({"folder": str(path), "class": name}) + "\n")
    except OSError:
        pass  # a read-only lab home: ask again next time


def _ask_class(path: str) -> str | None:
    import subprocess

    from lablib.children import tied

    try:
        # no standard input: a folder with its own code (auto_map) makes AutoTokenizer ask "run the custom code?
        # [y/N]" there; the child read the caller's (a script's piped input; a terminal: 15 s of silence) and
        # could say yes with it. Given none, it says no at once, and AutoTokenizer in this process asks as it did
        done = subprocess.run(
            tied([sys.executable, "-c", _ASK_CLASS, str(path)]),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[-1].strip() if done.returncode == 0 and lines else None


def lab_tokenizer(model):
    """The one tokenizer the lab uses for text: the model's Hugging Face tokenizer.

    ``model``: a ResolvedModel with an HF or MLX folder. Raises LabError otherwise.
    """
    path = model.hf_path or model.mlx_path
    if not path and getattr(model, "unavailable", {}).get("hf"):
        raise LabError(
            f"{model.source}: the lab makes prompts with the model's Hugging Face tokenizer, and no Hugging Face "
            f"folder could be made from it ({model.unavailable['hf']})"
        )
    if not path:
        raise LabError(f"{model.source} has no Hugging Face tokenizer folder; run `lablib prepare` on it")
    return _tokenizer(path)
