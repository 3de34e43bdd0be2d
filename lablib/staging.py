"""Files and folders written whole or not at all.

Each is made as ``<name>.tmp`` beside its place and renamed into place when complete (a rename within one folder
is atomic: a reader sees the old one or the new one, never half of one). An error or an interrupt (Ctrl-C, or
SIGTERM, which every ``lablib`` command takes as one) on the way removes the ``.tmp`` instead, before the
exception goes on: a lab home keeps no half-written conversion (an F32 reference GGUF of the default model is
about 540 MB, its Hugging Face folder about as much), and a results folder no half-written parquet beside the
user's file. A ``.tmp`` left by a process killed outright (``kill -9``, a power loss) is cleared by the next
write of the same name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path


def staging_path(out) -> Path:
    """Where ``out`` is written before it is complete: ``<out>.tmp`` beside it."""
    out = Path(out)
    return out.with_name(out.name + ".tmp")


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
    ``out`` as it was."""
    out = Path(out)
    tmp = staging_path(out)
    remove(tmp)
    if make_folder:
        tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        remove(tmp)
        raise
    if out.is_dir() and not out.is_symlink():
        shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
