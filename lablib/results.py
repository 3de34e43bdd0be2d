"""Tidy results: one row per request, with the run manifest attached.

Every result carries the manifest of DESIGN.md: model (id, architecture,
parameters, format, quantization, file hash), engine (name, version, backend,
flags), hardware (CPU model, cores, RAM, accelerator), workload, lablib
version and time.
"""
from __future__ import annotations

import datetime as _dt

from .trace import RequestTrace


def run_manifest(engine, workload: dict | None = None) -> dict:
    """The manifest of a run on ``engine`` (an Engine); ``workload`` describes the requests."""
    from . import __version__
    from .hardware import hardware_info, measured_summary

    return {
        "model": engine.model.manifest(),
        "engine": engine.info().to_dict(),
        # the machine's measured bandwidth and FLOP/s, when it was measured (lablib.hardware.measure_machine)
        "hardware": {**hardware_info(), **measured_summary()},
        "workload": workload or {},
        "lablib_version": __version__,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def trace_row(trace: RequestTrace, manifest: dict, **labels) -> dict:
    """One tidy row: labels (repetition, mode...), the metrics, and flattened manifest fields."""
    row = dict(labels)
    row.update(trace.metrics())
    row["itl_s"] = trace.itl_s
    # raw clock readings (perf_counter seconds, comparable within one process/run): timelines
    row.update(t_submit=trace.t_submit, t_start=trace.t_start, t_first_token=trace.t_tokens[0],
               t_last_token=trace.t_tokens[-1])
    m, e, h = manifest["model"], manifest["engine"], manifest["hardware"]
    row.update({
        "engine": e["name"], "engine_version": e["version"], "backend": e["backend"],
        "dtype": e["dtype"], "threads": e["threads"], "n_ctx": e["n_ctx"],
        "model": m["id"], "model_format": m["format"], "quantization": m["quantization"],
        "model_sha256": m["file_sha256"], "cpu_model": h["cpu_model"],
        "cores": h["cores_physical"], "ram_bytes": h["ram_bytes"], "accelerator": h["accelerator"],
        "hostname": h["hostname"], "cpu_quota": h.get("cpu_quota"),
        "memory_limit_bytes": h.get("memory_limit_bytes"), "lablib_version": manifest["lablib_version"], "time": manifest["time"],
    })
    row.update({k: v for k, v in h.items() if k.startswith("measured_")})  # bandwidth, FLOP/s: when measured
    return row


# --- durable results on disk -------------------------------------------------------------
FORMATS = (".jsonl", ".parquet")


def _suffix(path) -> str:
    from pathlib import Path

    from .errors import LabError

    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise LabError(f"results file {path}: expected a name ending in .jsonl or .parquet")
    return suffix


class ResultsWriter:
    """Appends rows to a results file as each request finishes.

    ``.jsonl``: one JSON object per line, appended and flushed to disk per row.
    ``.parquet``: the whole file rewritten atomically (temporary file, then
    rename) per row, so a crash leaves the previous complete file. Rows
    already in the file are kept: a new sweep adds to them.
    """

    def __init__(self, path):
        from pathlib import Path

        import tempfile

        import pandas as pd

        from .errors import LabError

        self.path = Path(path)
        self.suffix = _suffix(self.path)
        self.written = 0
        # refuse now, before any measurement, what would fail at the first row
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.is_dir():
                raise LabError(f"results file {self.path} is a folder; expected a file name ending in "
                               ".jsonl or .parquet")
            if self.path.exists():
                open(self.path, "ab").close()
            elif self.path.is_symlink():  # a link to a file not there yet: its folder must be
                target = self.path.resolve()
                if not target.parent.is_dir():
                    raise LabError(f"results file {self.path} links to {target}, whose folder does not exist; "
                                   "expected a writable place: create the folder or choose another --out")
                tempfile.TemporaryFile(dir=target.parent).close()
            else:
                tempfile.TemporaryFile(dir=self.path.parent).close()
        except OSError as e:
            raise LabError(f"results file {self.path}: cannot write there ({e.strerror or e}); expected a "
                           "writable folder: choose another --out") from None
        # parquet is rewritten whole per row: read what is there now (a corrupt or foreign file is
        # refused here, before a measurement whose row could not be written)
        self._rows = None
        if self.suffix == ".parquet":
            old = _read_file(self.path) if self.path.exists() else None
            if old is not None and len(old):
                from .trace import METRICS

                engine_ok = "engine" in old.columns and old["engine"].map(lambda v: isinstance(v, str)).all()
                wrong = [c for c in METRICS if c in old.columns and not old[c].isna().all()
                         and not pd.api.types.is_numeric_dtype(old[c])]  # all-null: e.g. TPOT of 1-token runs
                if not engine_ok or wrong:
                    raise LabError(f"{self.path} is not a results file the lab wrote (engine names "
                                   f"{'fine' if engine_ok else 'missing or not text'}, non-numeric metric "
                                   f"columns {wrong}); expected lab results to add to: write to a new file")
            self._rows = [] if old is None else old.to_dict("records")

    def append(self, row: dict) -> None:
        import json
        import os

        if self.suffix == ".jsonl":
            with open(self.path, "a+", encoding="utf-8") as f:
                if f.tell() > 0:  # a file torn by a crash: start the row on its own line
                    f.seek(f.tell() - 1)
                    if f.read(1) != "\n":
                        f.write("\n")
                f.write(json.dumps(row, default=_jsonable) + "\n")
                f.flush()
                os.fsync(f.fileno())
        else:
            import pandas as pd

            self._rows.append(row)
            tmp = self.path.with_name(self.path.name + ".tmp")
            pd.DataFrame(self._rows).to_parquet(tmp, index=False)
            os.replace(tmp, self.path)
        self.written += 1


def _jsonable(x):
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def load_results(*paths):
    """One pandas DataFrame from results files (.jsonl or .parquet), rows in file order.

    Each row keeps a ``source_file`` column (the file it was first written to). Raises LabError for unknown
    suffixes or missing files.
    """
    from pathlib import Path

    import pandas as pd

    from .errors import LabError

    frames = []
    for p in paths:
        p = Path(p)
        if not p.is_file():
            _suffix(p)
            raise LabError(f"results file {p} not found")
        df = _read_file(p)
        # a merged file keeps each row's original source
        df["source_file"] = df["source_file"].fillna(str(p)) if "source_file" in df else str(p)
        frames.append(df)
    if not frames:
        raise LabError("no results files given")
    return pd.concat(frames, ignore_index=True)


def _read_file(p):
    """One results file as written (.jsonl or .parquet), a DataFrame; LabError naming a bad line or file."""
    import json

    import pandas as pd

    from .errors import LabError

    if _suffix(p) == ".jsonl":
        rows = []
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise LabError(f"{p}, line {n}: not a JSON row ({e}); remove or repair that line "
                                   "(a crash can leave a torn last line)") from None
                if not isinstance(row, dict):
                    raise LabError(f"{p}, line {n}: a JSON {type(row).__name__}, expected one row as a JSON "
                                   "object ({\"engine\": ..., ...}); remove or repair that line")
                rows.append(row)
        return pd.DataFrame(rows)
    try:
        return pd.read_parquet(p)
    except Exception as e:  # pyarrow's ArrowInvalid and friends
        raise LabError(f"{p}: not a readable parquet file ({type(e).__name__}: "
                       f"{(str(e).splitlines() or [''])[0][:200]}); expected a results file the lab "
                       "wrote: restore it, or write to a new file") from None


def merge_results(paths, out):
    """Combine results files (for example one per workshop laptop) into ``out``.

    Every row keeps its manifest columns (hostname, cpu_model, engine versions)
    and ``source_file``, so plots can facet by machine. Rows identical in
    everything (the same file given twice) are kept once. Returns the DataFrame.
    """
    from pathlib import Path

    from .errors import LabError

    out = Path(out)
    _suffix(out)
    if out.exists():
        raise LabError(f"{out} exists: merge writes a new file; remove it or name another")
    df = load_results(*paths)
    key = [c for c in df.columns if c not in ("source_file",)]
    df = df.loc[~df[key].astype(str).duplicated()].reset_index(drop=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        tmp = out.with_name(out.name + ".tmp")
        try:
            df.to_parquet(tmp, index=False)
        except Exception as e:  # pyarrow: a column mixing numbers and text across the files
            tmp.unlink(missing_ok=True)
            raise LabError(f"cannot write {out}: the files disagree on a column's type ({type(e).__name__}: "
                           f"{(str(e).splitlines() or [''])[0][:200]}); merge into a .jsonl instead, or "
                           "repair the file whose rows differ") from None
        tmp.replace(out)
    else:  # full float precision, as ResultsWriter writes
        import json

        with open(out, "w", encoding="utf-8") as f:
            for row in df.to_dict("records"):
                f.write(json.dumps({k: v for k, v in row.items() if not _missing(v)}, default=_jsonable) + "\n")
    return df


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)
