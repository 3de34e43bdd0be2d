"""Tidy results: one row per request, with the run manifest attached, durable on disk.

Every result carries the manifest of DESIGN.md: model (id, architecture,
parameters, format, quantization, file hash), engine (name, version, backend,
flags), hardware (CPU model, cores, RAM, accelerator), workload, lablib
version and time. The row's columns are declared in :mod:`lablib.results.schema`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import tempfile
import time
from pathlib import Path

from lablib._version import __version__
from lablib.checks import keywords_checked
from lablib.errors import LabError, excerpt, first_line, json_kind, shown
from lablib.machine.device_ceilings import measured_summary
from lablib.machine.identity import hardware_info, load_average, machine_id, machine_key
from lablib.machine.telemetry import gpu_manifest
from lablib.results.schema import CLOCKS, DEFAULTS, METRICS, flatten_manifest
from lablib.results.trace import RequestTrace, now
from lablib.staging import staged


def run_manifest(engine_info: dict, model: dict, workload: dict | None = None) -> dict:
    """The manifest of a run: ``engine_info`` (``Engine.info().to_dict()``), ``model``
    (``ResolvedModel.manifest()``), ``workload`` (what the requests were), plus this machine's
    hardware with its 1-minute load average when the run started (and ``gpu``, the GPUs NVML lists:
    :func:`lablib.machine.telemetry.gpu_manifest`; no such key without one), the lablib version and the
    time (UTC)."""
    gpu = gpu_manifest()
    return {
        "model": model,
        "engine": engine_info,
        # the machine's measured bandwidth and FLOP/s, when it was measured (lablib.machine.measure_machine)
        # the measured ceilings of the device the engine computed on (a GPU's for a CUDA row, not the CPU's)
        "hardware": {
            **hardware_info(),
            "machine_key": machine_key(),
            "machine_id": machine_id(),  # which machine of those of one hostname and one CPU (a workshop room's)
            "load_avg_1m": load_average(),
            **measured_summary(engine_info.get("device")),
            **({"gpu": gpu} if gpu else {}),
        },
        "workload": workload or {},
        "lablib_version": __version__,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        # the Unix time minus the lab's clock (time.perf_counter: CLOCK_MONOTONIC, one per machine), now: a row's
        # t_* + this is its Unix time, which lets merge_results(one_clock=True) put several machines on one time line
        "clock_unix_offset_s": time.time() - now(),
    }


def engine_manifest(engine, workload: dict | None = None) -> dict:
    """The run manifest (:func:`run_manifest`) of a run on a loaded ``engine``: anything with
    ``info()`` (an ``EngineInfo``, ``.to_dict()``) and ``model`` (a ``ResolvedModel``, ``.manifest()``),
    as every :class:`lablib.engines.base.Engine` has (this module does not import the engines)."""
    return run_manifest(engine.info().to_dict(), engine.model.manifest(), workload)


def trace_row(trace: RequestTrace, manifest: dict, *, manifest_columns: dict | None = None, **labels) -> dict:
    """One tidy row (:data:`lablib.results.schema.COLUMNS`): labels (repetition, mode...; a closed loop's
    ``request_index`` and ``client`` from the trace when not given), the metrics, the raw clocks
    and the flattened manifest fields (``manifest_columns``: ``flatten_manifest(manifest)`` made once for
    many rows of one manifest, as a load run's rows are: 40 % of a row's time)."""
    row = dict(labels)
    for label in ("request_index", "client"):
        if label not in row and getattr(trace, label) is not None:
            row[label] = getattr(trace, label)
    row.update(trace.metrics())
    row["itl_s"] = trace.itl_s
    row.update(zip(CLOCKS, (trace.t_submit, trace.t_start, trace.t_tokens[0], trace.t_tokens[-1])))
    row.update(flatten_manifest(manifest) if manifest_columns is None else manifest_columns)
    if trace.threads is not None:  # automatic threads: what this request ran with
        row["threads"] = trace.threads
    return row


# --- durable results on disk -------------------------------------------------------------
FORMATS = (".jsonl", ".parquet")


# what a run writes beside its results file <out>.jsonl, records that are not rows: run records (one line per
# point or run), and lablib bench's samples of the server's /metrics
RUNS_SUFFIX, SERVER_SUFFIX = ".runs.jsonl", ".server.jsonl"
COMPANIONS = (RUNS_SUFFIX, SERVER_SUFFIX)


def runs_path(out) -> Path:
    """Where the run records of results file ``out`` go: ``<out without suffix>.runs.jsonl`` beside it (a bench
    run's summary, a sweep point's telemetry: :data:`lablib.results.schema.TELEMETRY`)."""
    return Path(out).with_name(Path(out).stem + RUNS_SUFFIX)


def server_path(out) -> Path:
    """Where ``lablib bench`` puts its samples of the server's /metrics for results file ``out``:
    ``<out without suffix>.server.jsonl`` beside it."""
    return Path(out).with_name(Path(out).stem + SERVER_SUFFIX)


def append_run(out, record: dict) -> None:
    """One run record (a dict, ``out`` added) appended as a JSON line to :func:`runs_path` of ``out`` (its folder
    made here where no row made it)."""
    runs_path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(runs_path(out), "a", encoding="utf-8") as f:
        f.write(json.dumps({**record, "out": str(out)}, default=_jsonable) + "\n")


def check_folder(folder) -> None:
    """Raise OSError unless files can be written in ``folder``, which need not exist yet (the first write makes
    it): its nearest existing parent must be a folder this process can write in. Nothing is created, so a refusal
    or a failure before the first write leaves no empty folder behind."""
    import errno

    p = Path(folder).absolute()
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{p} is not a folder", str(p))
    tempfile.TemporaryFile(dir=p).close()


def _suffix(path) -> str:
    if not isinstance(path, (str, os.PathLike)):  # was: pathlib's TypeError, "expected str, bytes or os.PathLike"
        raise LabError(
            f"results file {shown(path)}: expected a file name (a str or a Path) ending in .jsonl or .parquet"
        )
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise LabError(f"results file {path}: expected a name ending in .jsonl or .parquet")
    return suffix


class ResultsWriter:
    """Appends rows to a results file as each request finishes.

    ``.jsonl``: one JSON object per line, handed to the operating system as it is written (a crash, a kill or
    Ctrl-C of the lab loses no row written) and made durable with an fsync (which a crash of the machine itself or
    a power loss does not undo): per row; with ``sync_every_s`` (seconds), with the first row written that long or
    longer after the last fsync, and at :meth:`sync` (a run's end) for the rows since (the files written through
    are held open until then: a file renamed meanwhile still gets its fsync). A load run's rows take the latter
    (:data:`LOAD_SYNC_S`): an fsync cost 280 us a row (140 of CPU, in the process whose event loop stamps the other
    streams' tokens; 2-core AMD EPYC, ext4), the rest of its writing 40-60.
    ``.parquet``: the whole file rewritten atomically (temporary file, then
    rename) per row, so a crash leaves the previous complete file (no fsync). Rows
    already in the file are kept: a new sweep adds to them.
    """

    def __init__(self, path, sync_every_s: float = 0.0):
        import pandas as pd

        self.suffix = _suffix(path)
        self.path = Path(path)
        if self.path.name.endswith(COMPANIONS):  # lablib report and merge leave such files out, rows and all
            companion = next(c for c in COMPANIONS if self.path.name.endswith(c))
            raise LabError(
                f"results file {self.path}: a name ending in {companion} is that of a run's records beside its "
                f"results file, which lablib report and merge leave out; expected a results file name, such as "
                f"{self.path.name[: -len(companion)]}.jsonl"
            )
        self.written = 0
        if isinstance(sync_every_s, bool) or not isinstance(sync_every_s, (int, float)) or not sync_every_s >= 0:
            raise LabError(f"sync_every_s={sync_every_s!r}: expected seconds between fsyncs, 0 (every row) or more")
        self.sync_every_s = float(sync_every_s)
        self._synced_at = None  # time.monotonic() of the last fsync; None: none yet
        self._held = None  # the file the rows since the last fsync were last written through, open until it
        self._folder_made = False  # made at the first row (make_folder): a run refused before it leaves none
        # refuse now, before any measurement, what would fail at the first row
        try:
            if self.path.is_dir():
                raise LabError(
                    f"results file {self.path} is a folder; expected a file name ending in .jsonl or .parquet"
                )
            if self.path.exists():
                open(self.path, "ab").close()
            elif self.path.is_symlink():  # a link to a file not there yet: its folder must be
                target = self.path.resolve()
                if not target.parent.is_dir():
                    raise LabError(
                        f"results file {self.path} links to {target}, whose folder does not exist; "
                        "expected a writable place: create the folder or choose another results file"
                    )
                tempfile.TemporaryFile(dir=target.parent).close()
            else:
                check_folder(self.path.parent)
        except OSError as e:
            raise LabError(
                f"results file {self.path}: cannot write there ({e.strerror or e}); expected a "
                "writable folder: choose another results file"
            ) from None
        if self.suffix == ".jsonl" and self.path.is_file() and self.path.stat().st_size:
            _check_jsonl_head(self.path)  # rows appended to a foreign file could not be read back
            _check_jsonl_tail(self.path)  # nor rows appended after a row a crash tore
        # parquet is rewritten whole per row: read what is there now (a corrupt or foreign file is
        # refused here, before a measurement whose row could not be written)
        self._rows = None
        if self.suffix == ".parquet":
            old = _read_file(self.path) if self.path.exists() else None
            if old is not None and len(old):
                named = [old[c].map(lambda v: isinstance(v, str)) for c in NAMING if c in old.columns]
                engine_ok = bool(named) and pd.concat(named, axis=1).any(axis=1).all()  # each row names one
                wrong = [
                    c
                    for c in METRICS
                    if c in old.columns and not old[c].isna().all() and not pd.api.types.is_numeric_dtype(old[c])
                ]  # all-null: e.g. TPOT of 1-token runs
                if not engine_ok or wrong:
                    raise LabError(
                        f"{self.path} is not a results file the lab wrote (engine or server names "
                        f"{'fine' if engine_ok else 'missing or not text'}, non-numeric metric "
                        f"columns {wrong}); expected lab results to add to: write to a new file"
                    )
            self._rows = [] if old is None else old.to_dict("records")

    def make_folder(self) -> Path:
        """The results file's folder, made (with its parents) where it is not there yet: at the first row, or
        before a run's records are written beside the rows. Returns it."""
        if not self._folder_made:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._folder_made = True
        return self.path.parent

    def append(self, row: dict) -> None:
        self.make_folder()
        if self.suffix == ".jsonl":
            line = row_line(row)
            f = open(self.path, "a+", encoding="utf-8")
            self._hold(f)  # from here sync() flushes, fsyncs and closes it, whatever stops the write (an interrupt)
            try:
                if f.tell() > 0:  # a file torn by a crash: start the row on its own line
                    f.seek(f.tell() - 1)
                    if f.read(1) != "\n":
                        f.write("\n")
                f.write(line)
                f.flush()
            except OSError as e:  # a full disk: the row's error is this one
                self._held = None
                with contextlib.suppress(OSError):
                    f.close()
                raise LabError(
                    f"results file {self.path}: a row could not be written ({e.strerror or e}); the rows written "
                    f"before it ({self.written}) are kept: free space, or choose another results file"
                ) from None
            # counted once it is in the file, before its fsync: an interrupt inside the fsync (milliseconds) left a row
            # on disk uncounted, and `lablib bench` said one row fewer than the file held
            self.written += 1
            if self._synced_at is None or time.monotonic() - self._synced_at >= self.sync_every_s:
                self.sync()
        else:
            import pandas as pd

            self._rows.append(row)
            target = self.path.resolve()  # a link's target is rewritten, the link kept (was: a file replaced it)
            with staged(target) as tmp:
                pd.DataFrame(self._rows).to_parquet(tmp, index=False)
            self.written += 1

    def _hold(self, f) -> None:
        """Keep ``f`` open for the next fsync. The handle held before is closed: on the same file, ``f``'s fsync
        covers its rows; on another (the path renamed or replaced since), its rows are fsync'd now."""
        old, self._held = self._held, f
        if old is not None:
            if os.path.sameopenfile(old.fileno(), f.fileno()):
                old.close()
            else:
                self._sync(old)

    def sync(self) -> None:
        """Make the rows written since the last fsync durable (with ``sync_every_s``: at a run's end)."""
        f, self._held = self._held, None
        if f is not None:
            self._sync(f)

    def _sync(self, f) -> None:
        try:
            f.flush()  # the rest of a row an interrupt stopped
            os.fsync(f.fileno())
            self._synced_at = time.monotonic()
        finally:
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """``with writer:`` around a run: its rows made durable at the block's end, whatever ends it; where an
        error ends it, a failed sync is dropped (the run's own error is what the caller sees)."""
        if exc_type is None:
            self.sync()
        else:
            with contextlib.suppress(OSError):
                self.sync()

    def __del__(self):  # a writer let go before a run's end: its last rows made durable (and their files closed)
        try:  # no module global here: at the interpreter's exit they may be gone
            self.sync()
        except Exception:  # noqa: BLE001 - nothing to tell in a collector's call
            pass


LOAD_SYNC_S = 1.0  # a load run's rows: an fsync with the first row this long after the last, and at the run's end (s)
_orjson = None  # the serve extra's orjson, imported at the first row (None: not yet; False: not installed)
_OK_ITEMS = (str, int, type(None))  # bool is an int


def _plain(row: dict) -> bool:
    """Every value a str, an int, a bool, None, a finite float, or a list of them: what orjson writes as
    json.dumps does (values; not spacing). NaN and infinities (json.dumps' ``NaN``, orjson's ``null``), dicts,
    numpy values and the rest are json.dumps'."""
    import math

    for v in row.values():
        t = type(v)
        if t is float:
            if not math.isfinite(v):
                return False
        elif t is list:
            try:
                if math.isfinite(sum(v)):  # numbers: a non-finite one makes the sum so (an overflow: json.dumps)
                    continue
                return False
            except (TypeError, OverflowError):  # not all numbers; an int past a float's range
                if not all(isinstance(x, _OK_ITEMS) or (type(x) is float and math.isfinite(x)) for x in v):
                    return False
        elif not isinstance(v, _OK_ITEMS):
            return False
    return True


def row_line(row: dict) -> str:
    """``row`` as one JSON line, its newline included: orjson's where installed (the serve extra) and the row is
    plain (:func:`_plain`), else ``json.dumps``' (``_jsonable`` for numpy and other values). A load run's row
    (86 columns, 100 ITLs, 7.8 KB) took 20 us (orjson's 9, the plain check's 10) against 155 with json.dumps
    (2-core AMD EPYC, quiet), on the rows' thread, which holds the GIL meanwhile while the loop beside it waits
    to stamp tokens. Both read back (json.loads) to the same values, and both lines are ASCII (a row whose
    orjson line is not, with text beyond ASCII, is json.dumps', which escapes it); orjson writes no spaces."""
    global _orjson
    if _orjson is None:
        try:
            import orjson as _orjson
        except ImportError:
            _orjson = False
    if _orjson and _plain(row):
        try:
            line = _orjson.dumps(row, option=_orjson.OPT_APPEND_NEWLINE)
        except TypeError:  # a key that is not a str, an int past 64 bits: json.dumps'
            line = b""
        # ASCII, as json.dumps' lines are, or json.dumps' (found by a helper: orjson's raw U+2028 split the line
        # where load_results reads lines, and a row torn inside a UTF-8 character stopped the next append)
        if line and line.isascii():
            return line.decode()
    return json.dumps(row, default=_jsonable) + "\n"


NAMING = ("engine", "server")  # a lab row names its engine (a row per request) or its server (lab 05's summary)


def _check_jsonl_head(path: Path) -> None:
    """LabError when the existing file ``path`` does not start as the lab's JSON lines do (one JSON object a
    line, UTF-8, the first naming its ``engine`` or ``server``: :data:`NAMING`): a parquet file or a CSV named
    .jsonl, or JSON lines of something else (a trace to replay, a dataset of prompts), which rows appended to it
    would spoil."""
    with open(path, "rb") as f:
        head = f.read(1 << 20)
        line, newline, _ = head.lstrip().partition(b"\n")
        if not newline and len(head) == 1 << 20:  # a first line longer than 1 MiB (a long row): up to 64 MiB of it
            f.seek(0)
            line = f.readline(64 << 20)
            while line and not line.strip():  # blank lines before it, as lstrip skips them above
                line = f.readline(64 << 20)
            line, newline = line.lstrip(), b"\n" if line.endswith(b"\n") else b""
        elif not newline and f.read(1) == b"":  # the whole file, one line without its newline: read as a row
            newline = b"end"
    ok = line.startswith(b"{")  # a row torn by a crash still starts so (load_results names such a line)
    if ok and newline:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            ok = False
    if not ok:
        raise LabError(
            f"results file {path} is not a JSON lines file the lab wrote (its first line is no JSON object); "
            "expected lab rows to add to, one JSON object a line: write to a new results file"
        )
    try:
        first = json.loads(line) if newline else None  # a torn first row: the tail's check names it
    except ValueError:
        first = None
    if isinstance(first, dict) and not any(isinstance(first.get(k), str) for k in NAMING):
        keys = ", ".join(list(first)[:6]) + (", ..." if len(first) > 6 else "")
        raise LabError(
            f"results file {path} is not one the lab wrote (its first line is a JSON object of {keys or 'no keys'}: "
            "no engine or server named); expected lab rows to add to: write to a new results file"
        )


def _check_jsonl_tail(path: Path) -> None:
    """LabError when the last line of the existing file ``path`` that is not blank is no row: a row a crash tore
    (no complete JSON), NUL bytes (where a power loss left a row's blocks unwritten), a JSON value that is no
    object. Rows appended after it would make the whole file unreadable (:func:`load_results` names such a
    line), while the run said it wrote them. Reads backwards from the end in 64 KiB steps until that line is
    whole; only a file refused is read through (for the line's number)."""
    size, step = path.stat().st_size, 64 << 10
    with open(path, "rb") as f:
        pos = size
        while True:
            pos = max(0, pos - step)
            f.seek(pos)
            body = f.read(size - pos).rstrip(b" \t\r\n")
            if b"\n" in body or pos == 0:
                break
            step *= 2  # a row longer than what was read
        start = pos + body.rfind(b"\n") + 1  # the line's first byte in the file
        line = body[body.rfind(b"\n") + 1 :]
        if not line.strip():
            return  # blank to the end: nothing to be torn
        why = None
        if b"\0" in line:
            why = "NUL bytes (a power loss leaves them where a row's blocks were not written)"
        else:
            try:
                if not isinstance(json.loads(line), dict):
                    why = "a JSON value that is not a row (a JSON object)"
            except ValueError:
                why = "a row torn by a crash (no complete JSON)"
        if why is None:
            return
        f.seek(0)
        n, left = 1, start
        while left > 0:  # in 1 MiB pieces: a results file can be large
            chunk = f.read(min(left, 1 << 20))
            n, left = n + chunk.count(b"\n"), left - len(chunk)
    raise LabError(
        f"results file {path}, line {n}: {why}; rows added after it could not be read back: remove that line "
        f"(sed -i '{n}d' {path}), then run again, or choose another results file"
    )


def load_lab_rows(paths, log=print):
    """:func:`load_results` of ``paths`` for the commands that combine files (``lablib merge``, ``lablib
    report``). A run's companion records (``<out>.runs.jsonl``, ``<out>.server.jsonl``: not rows) are left out,
    each said through ``log`` (a glob such as ``results/*.jsonl`` picks them up beside the rows). LabError for a
    file without rows, or whose rows name neither an engine (rows per request) nor a server (a summary the lab
    wrote: lab 05's rate sweep), naming the file."""
    import pandas as pd

    frames = []
    for p in paths:
        name = str(p)
        if name.endswith(COMPANIONS):
            log(f"left out {name}: a run's records beside its results file, not result rows")
            continue
        df = load_results(p)
        if not len(df):
            raise LabError(f"{name} has no rows: leave it out, or give the file the run wrote its rows to")
        named = pd.Series(False, index=df.index)
        for col in NAMING:
            if col in df.columns:
                named |= df[col].map(lambda v: isinstance(v, str))
        if not named.all():
            raise LabError(
                f"{name} is not a results file the lab wrote ({int((~named).sum())} of {len(df)} rows name neither "
                "an engine nor a server); expected the rows of a sweep, bench or replay, or a summary the lab "
                "wrote: leave it out"
            )
        frames.append(df)
    if not frames:
        raise LabError(
            f"no results files among {', '.join(map(str, paths)) or 'none'}: give the .jsonl or .parquet files of a run"
        )
    return pd.concat(frames, ignore_index=True)


def writable_file(path, flag: str) -> Path:
    """``path`` as a Path; LabError naming ``flag`` (``--out``, ``--html``) when it is a folder or its folder cannot
    be written, before the work whose output would be lost. Its folder is not made here (the write makes it):
    work refused or failed after this check leaves no empty folder behind."""
    path = Path(path)
    if path.is_dir():
        raise LabError(f"{flag} {path} is a folder; expected a file name: choose another {flag}")
    try:
        check_folder(path.parent)
    except OSError as e:
        raise LabError(
            f"{flag} {path}: cannot write there ({e.strerror or e}); expected a writable folder: choose another {flag}"
        ) from None
    return path


def _jsonable(x):
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


@keywords_checked
def load_results(*paths):
    """One pandas DataFrame from results files (.jsonl or .parquet), rows in file order.

    Each row keeps a ``source_file`` column (the file it was first written to); a column of
    :data:`lablib.results.schema.DEFAULTS` a file lacks (written before it existed) gets its default. Raises LabError for unknown
    suffixes or missing files. ``paths``: files, or lists of them (``load_results(["a.jsonl", "b.jsonl"])``); a file
    named twice is read once (was: its rows counted twice, ``lablib report f.jsonl f.jsonl``).
    """
    import pandas as pd

    frames, seen = [], set()
    files = [Path(f) for given in paths for f in (given if isinstance(given, (list, tuple)) else [given])]
    for p in files:
        if p.is_dir():
            raise LabError(f"results file {p} is a folder; expected a .jsonl or .parquet file the lab wrote")
        if not p.is_file():
            _suffix(p)
            raise LabError(f"results file {p} not found")
        if p.resolve() in seen:
            continue
        seen.add(p.resolve())
        df = _read_file(p)
        # a merged file keeps each row's original source
        df["source_file"] = df["source_file"].fillna(str(p)) if "source_file" in df else str(p)
        for col, value in DEFAULTS.items():  # files written before a column existed
            if col not in df.columns:
                df[col] = value
        _decode_unseen_of_older_rows(df)
        frames.append(df)
    if not frames:
        raise LabError("no results files given")
    return pd.concat(frames, ignore_index=True)


def _decode_unseen_of_older_rows(df) -> None:
    """Rows written before the ``decode_unseen`` column (2026-12, :attr:`lablib.results.trace.RequestTrace.decode_unseen`)
    gave a request whose tokens all came at one instant (a buffered stream, or one read late) a ``tpot_s`` of exactly
    0, as if its decode took no time; read now as such rows are written: ``decode_unseen`` True and no ``tpot_s``
    (nor ``decode_tps``), so a summary of an old file leaves them out of its TPOT as it does for a new one. In place;
    rows that have the column, and files of summaries (no ``tpot_s``), are left as they are."""
    import pandas as pd

    if "tpot_s" not in df.columns or "output_tokens" not in df.columns:
        return
    old = df["decode_unseen"].isna() if "decode_unseen" in df.columns else pd.Series(True, index=df.index)
    if not old.any():
        return
    tpot = pd.to_numeric(df["tpot_s"], errors="coerce")
    unseen = old & (tpot == 0) & (pd.to_numeric(df["output_tokens"], errors="coerce") >= 2)
    if "decode_unseen" in df.columns:  # older rows beside newer ones (a merged file), or a new file's failed rows
        df.loc[unseen, "decode_unseen"] = True
    else:
        df["decode_unseen"] = unseen
    for col in ("tpot_s", "decode_tps"):  # NaN: a missing value, as a new file's null reads
        if col in df.columns:
            df.loc[unseen, col] = float("nan")


def _read_file(p):
    """One results file as written (.jsonl or .parquet), a DataFrame; LabError naming a bad line or file."""
    import pandas as pd

    if _suffix(p) == ".jsonl":
        rows = []
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise LabError(
                f"{p}: not UTF-8 text ({e.reason} at byte {e.start}); expected a JSON lines file the lab wrote, "
                "one JSON object a line: restore it, or give another file"
            ) from None
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise LabError(
                        f"{p}, line {n}: not a JSON row ({e}); remove or repair that line "
                        "(a crash can leave a torn last line)"
                    ) from None
                if not isinstance(row, dict):
                    raise LabError(
                        f"{p}, line {n}: a JSON {json_kind(row)}, expected one row as a JSON "
                        'object ({"engine": ..., ...}); remove or repair that line'
                    )
                rows.append(row)
        return pd.DataFrame(rows)
    try:
        return pd.read_parquet(p)
    except Exception as e:  # pyarrow's ArrowInvalid and friends
        raise LabError(
            f"{p}: not a readable parquet file; expected a results file the lab wrote (rows in Parquet): restore it, "
            f"or write to a new file (pyarrow says: {_last_clause(e)})"
        ) from None


def merge_results(paths, out, one_clock: bool = False):
    """Combine results files (for example one per workshop laptop) into ``out``.

    Every row keeps its manifest columns (hostname, cpu_model, engine versions)
    and ``source_file``, so plots can facet by machine. Rows identical in
    everything (the same file given twice) are kept once. Returns the DataFrame.

    ``one_clock``: the files are one run from several client machines (``lablib bench --start-at``, one start
    for all): each row's clocks (:data:`lablib.results.schema.CLOCKS`) are moved onto the Unix time line (its
    ``clock_unix_offset_s`` added, then set to 0), so a run summary of the merged rows (makespan, throughput)
    spans every machine. The machines' clocks then agree as well as their NTP keeps them (milliseconds); each
    request's own latencies (TTFT, TPOT, ITL) are differences on one machine's clock and do not move.
    LabError when a row has no ``clock_unix_offset_s`` (written before the lab recorded it).
    """
    out = Path(out)
    _suffix(out)
    if out.is_dir():
        raise LabError(f"--out {out} is a folder; expected a new file name ending in .jsonl or .parquet")
    if out.exists():
        raise LabError(f"{out} exists: merge writes a new file; remove it or name another")
    df = load_lab_rows(paths)
    writable_file(out, "--out")
    key = [c for c in df.columns if c not in ("source_file",)]
    df = df.loc[~df[key].apply(lambda col: col.map(_as_text)).duplicated()].reset_index(drop=True)
    if one_clock:
        off = df["clock_unix_offset_s"] if "clock_unix_offset_s" in df else None
        if off is None or off.isna().any():
            n = len(df) if off is None else int(off.isna().sum())
            raise LabError(
                f"one_clock: {n} rows have no clock_unix_offset_s (written before the lab recorded it): expected "
                "rows of lablib bench from this version; merge without --one-clock (each machine's own clock)"
            )
        for c in CLOCKS:
            if c in df:
                df[c] = df[c] + off
        df["clock_unix_offset_s"] = 0.0
    out.parent.mkdir(parents=True, exist_ok=True)  # only now: a refusal above leaves no folder behind
    with staged(out) as tmp:  # whole or not at all: a file merged into before is kept until the new one is done
        if out.suffix == ".parquet":
            try:
                df.to_parquet(tmp, index=False)
            except Exception as e:  # pyarrow: a column mixing numbers and text across the files
                raise LabError(
                    f"cannot write {out}: the files disagree on a column's type; expected one type per column in "
                    f"Parquet: merge into a .jsonl instead, or repair the file whose rows differ (pyarrow says: "
                    f"{_last_clause(e)})"
                ) from None
        else:  # full float precision, as ResultsWriter writes
            with open(tmp, "w", encoding="utf-8") as f:
                for row in df.to_dict("records"):
                    f.write(json.dumps({k: v for k, v in row.items() if not _missing(v)}, default=_jsonable) + "\n")
    return df


def _as_text(v) -> str:
    """A value as merge_results compares rows: one text for a value however the file stored it (a list in a .jsonl
    is a NumPy array out of a .parquet, and a missing value None or NaN): a merged .parquet merged again with a
    file it holds kept that file's rows twice, and its machine's throughput doubled in the room's figure."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    try:
        return "" if v is None or v != v else str(v)  # NaN
    except (TypeError, ValueError):  # pandas' NA: its comparison has no truth value
        return ""


def _last_clause(e: BaseException, limit: int = 120) -> str:
    """A library's error as a short clause for the end of a message: its first line, without the path and the
    call pyarrow repeats before the reason ("Could not open Parquet input source '<path>': <the reason>");
    anything else whole (a type clash's "Could not convert 'x' with type str: ..." is the useful part)."""
    import re

    return excerpt(re.sub(r"^Could not open Parquet input source '.*?': ", "", first_line(e)), limit=limit)


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)
