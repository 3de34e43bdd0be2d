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
    from .hardware import hardware_info

    return {
        "model": engine.model.manifest(),
        "engine": engine.info().to_dict(),
        "hardware": hardware_info(),
        "workload": workload or {},
        "lablib_version": __version__,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def trace_row(trace: RequestTrace, manifest: dict, **labels) -> dict:
    """One tidy row: labels (repetition, mode...), the metrics, and flattened manifest fields."""
    row = dict(labels)
    row.update(trace.metrics())
    row["itl_s"] = trace.itl_s
    m, e, h = manifest["model"], manifest["engine"], manifest["hardware"]
    row.update({
        "engine": e["name"], "engine_version": e["version"], "backend": e["backend"],
        "dtype": e["dtype"], "threads": e["threads"], "n_ctx": e["n_ctx"],
        "model": m["id"], "model_format": m["format"], "quantization": m["quantization"],
        "model_sha256": m["file_sha256"], "cpu_model": h["cpu_model"],
        "cores": h["cores_physical"], "ram_bytes": h["ram_bytes"], "accelerator": h["accelerator"],
        "hostname": h["hostname"], "lablib_version": manifest["lablib_version"], "time": manifest["time"],
    })
    return row
