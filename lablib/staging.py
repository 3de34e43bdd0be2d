"""Files and folders written whole or not at all.

Each is made as ``<name>.<pid>.tmp`` beside its place and renamed into place when complete (a rename within one
folder is atomic: a reader sees the old one or the new one, never half of one). An error or an interrupt (Ctrl-C,
or SIGTERM, which every ``lablib`` command takes as one) on the way removes the ``.tmp`` instead, before the
exception goes on: a lab home keeps no half-written conversion (an F32 reference GGUF of the default model is
about 540 MB, its Hugging Face folder about as much), and a results folder no half-written parquet beside the
user's file. A ``.tmp`` left by a process killed outright (``kill -9``, a power loss) is cleared by the next
write of the same name; one of a process still running is its own, left alone.

One staging name per process: two processes making the same file at once (a lab 06 and a lab 10 kernel both
quantizing the Q4_0 rung; two notebooks measuring the machine) each write their own, and the last rename wins,
whole. With one name for all, the second cleared the first's file as it began, the first then renamed the
second's half-written file into place (a GGUF loaded half-written) and the second failed on a file gone
(tests/test_staging.py).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
from pathlib import Path

from lablib.children import pid_alive


def staging_path(out) -> Path:
    """Where this process writes ``out`` before it is complete: ``<out>.<pid>.tmp`` beside it."""
    out = Path(out)
    return out.with_name(f"{out.name}.{os.getpid()}.tmp")


def leftovers(out) -> list[Path]:
    """What writers of ``out`` that are gone (killed outright) left beside it: their ``<out>.<pid>.tmp`` and
    ``<out>.<pid>.old`` (:func:`staged`), and ``<out>.tmp``, the one name earlier versions of the lab used."""
    out = Path(out)
    found = [out.with_name(out.name + ".tmp")]
    for kind in ("tmp", "old"):
        for p in out.parent.glob(f"{glob.escape(out.name)}.*.{kind}"):
            pid = p.name[len(out.name) + 1 : -len(kind) - 1]
            if pid.isdigit() and (int(pid) == os.getpid() or not pid_alive(int(pid))):
                found.append(p)
    return [p for p in found if p.exists() or p.is_symlink()]


def remove(path) -> None:
    """``path`` gone, a folder with all it holds (a link itself, never what it points to); no error if absent."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def staged(out, make_folder: bool = False):
    """Yields ``<out>.tmp`` (a path, cleared first; made as an empty folder when ``make_folder``) to write ``out``
    into. On a clean exit it replaces ``out`` (a folder there before is removed first: a folder cannot be renamed
    over another); on any exception, a KeyboardInterrupt included, it is removed and the exception goes on, with
    ``out`` as it was. What writers that are gone left beside ``out`` is cleared first (:func:`leftovers`).
    A folder: the one there before is renamed aside (``<out>.<pid>.old``) and removed once the new one is in
    place; if another process put its own in place meanwhile (the same conversion, done first), that one is
    kept and this one removed."""
    out = Path(out)
    tmp = staging_path(out)
    for p in leftovers(out):
        remove(p)
    if make_folder:
        tmp.mkdir(parents=True)
    try:
        yield tmp
        _put_in_place(tmp, out)
    except BaseException:
        remove(tmp)
        raise


def _put_in_place(tmp: Path, out: Path) -> None:
    """``tmp`` renamed to ``out``; a folder at ``out`` renamed aside first (a folder cannot be renamed over a
    folder that holds files) and removed after, or put back if the rename failed."""
    old = None
    if out.is_dir() and not out.is_symlink():
        old = out.with_name(f"{out.name}.{os.getpid()}.old")
        try:
            os.replace(out, old)
        except FileNotFoundError:  # another writer moved it meanwhile
            old = None
    try:
        os.replace(tmp, out)
    except OSError as e:
        if old is not None and not out.exists():
            os.replace(old, out)
            old = None
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not out.is_dir():
            raise
        remove(tmp)  # another process's folder, put in place between the two renames: kept
    finally:
        if old is not None:
            remove(old)
