"""MLX's CPU backend on the system's OpenBLAS instead of the reference BLAS its wheel bundles.

Why: the ``mlx-cpu`` wheel (Linux) links ``mlx_cpu.libs/libblas-<hash>.so.3.10.0`` and
``liblapack-<hash>.so.3.10.0``, netlib's reference BLAS and LAPACK (unblocked loops, no SIMD
kernels), through libmlx's RPATH (``$ORIGIN/../../mlx_cpu.libs``, searched before
``LD_LIBRARY_PATH``), and every float32 matrix product of MLX's CPU backend is their
``cblas_sgemm``. Measured on the 2-core AMD EPYC (SmolLM2-135M, float32, same machine state):
a 136-token prefill took 18.7 s there and 0.78 s on Debian's OpenBLAS 0.3.21 (Zen kernels),
a 512-token one 87.8 s and 3.7 s; decode 0.18 and 0.10 s per token; the greedy ids of the
default prompt were the same (33 of 33), the logits within 1.4e-4 (float32 rounding).

How: the two bundled files are moved aside (``<name>.bundled``, beside them) and their names
become symbolic links to the system's ``libblas.so.3`` and ``liblapack.so.3`` from
``libopenblas0-pthread`` (Debian, Ubuntu: ``/usr/lib/<multiarch>/openblas-pthread/``). The
dynamic linker then loads OpenBLAS as libmlx's own dependency, in libmlx's local scope: only MLX
calls it; torch keeps the MKL it carries (checked with ``LD_DEBUG=bindings``). Not
``LD_PRELOAD``: a preloaded OpenBLAS is in every library's scope first, and torch's own
``sgemm_``, ``dgemm_``, its LAPACK calls, bind to it instead of its MKL. pip replaces a link by
unlinking it (a reinstall of mlx-cpu brings the bundled files back; ``--install`` again links).

Then a child process checks the result: ``import mlx.core``, that the mapped BLAS is the
OpenBLAS file, float32 matrix products (matrix-matrix and matrix-vector, transposed too)
against a float64 reference computed in Python, and a LAPACK inverse. When it fails, or when
no OpenBLAS is installed, the bundled libraries stay (or are put back): MLX runs, slowly.
``LABLIB_MLX_BLAS=bundled`` keeps the bundled ones on purpose (``--install`` then restores).
Which BLAS a running MLX calls is :func:`lablib.engines.mlx.blas_info` (``info().flags["blas"]``).

    python -m lablib.build.mlx              # status, as JSON
    python -m lablib.build.mlx --install    # link to the system's OpenBLAS, check; else keep the bundled
    python -m lablib.build.mlx --restore    # the bundled reference BLAS and LAPACK back

Standard library only (install time, like :mod:`lablib.build.llama`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

DIST = "mlx-cpu"  # the distribution that bundles the libraries (mlx[cpu] on Linux)
# role -> (the bundled file's name starts with, the system's OpenBLAS file standing in for it)
ROLES = {"blas": ("libblas-", "libblas.so.3"), "lapack": ("liblapack-", "liblapack.so.3")}
BACKUP = ".bundled"  # suffix of a bundled file moved aside
APT = "libopenblas0-pthread"  # Debian's and Ubuntu's OpenBLAS, threaded with pthreads (not OpenMP)
ENV = "LABLIB_MLX_BLAS"  # "bundled": keep the wheel's reference BLAS


class BlasError(Exception):
    """The libraries cannot be linked or put back; the message says what to do."""


def bundled_libs() -> dict[str, Path] | None:
    """``{role: path}`` of the BLAS and LAPACK files mlx-cpu installed (the names in its RECORD,
    links or not), or None when mlx-cpu is not installed (macOS: MLX runs on Accelerate)."""
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    found: dict[str, list[Path]] = {role: [] for role in ROLES}
    for f in dist.files or ():
        parts = Path(f).parts
        if len(parts) == 2 and parts[0] == "mlx_cpu.libs":
            for role, (prefix, _) in ROLES.items():
                if parts[1].startswith(prefix) and ".so" in parts[1]:
                    found[role].append(Path(dist.locate_file(f)))
    if any(len(v) != 1 for v in found.values()):
        raise BlasError(
            f"{DIST} {dist.version} does not lay out one libblas-* and one liblapack-* in mlx_cpu.libs "
            f"({ {k: [p.name for p in v] for k, v in found.items()} }): this step knows mlx-cpu 0.32's layout"
        )
    return {role: v[0] for role, v in found.items()}


def openblas_dir(given: str | None = None) -> Path | None:
    """The folder holding the system's OpenBLAS ``libblas.so.3`` and ``liblapack.so.3``
    (``given``, else Debian's and Ubuntu's ``/usr/lib/<multiarch>/openblas-pthread``), or None."""
    if given:
        candidates = [Path(given)]
    else:
        arch = sysconfig.get_config_var("MULTIARCH") or ""
        candidates = [Path("/usr/lib") / arch / "openblas-pthread"] if arch else []
        candidates += sorted(Path("/usr/lib").glob("*/openblas-pthread")) + [Path("/usr/lib64/openblas-pthread")]
    for d in candidates:
        if all((d / name).is_file() for _, name in ROLES.values()):
            return d
    return None


def state(libs: dict[str, Path] | None = None) -> dict:
    """Where each bundled name points: ``{"state": "absent" | "bundled" | "openblas" | "mixed" |
    "broken", role: {"path", "target", "backup"}}``; ``broken``: a link whose target is gone (MLX
    cannot be imported until ``--install`` or ``--restore``)."""
    libs = bundled_libs() if libs is None else libs
    if libs is None:
        return {"state": "absent", "why": f"{DIST} is not installed (macOS: MLX runs on Accelerate)"}
    out: dict = {}
    kinds = set()
    for role, path in libs.items():
        backup = path.with_name(path.name + BACKUP)
        target = os.readlink(path) if path.is_symlink() else None
        kinds.add("broken" if target and not path.exists() else "openblas" if target else "bundled")
        out[role] = {"path": str(path), "target": target, "backup": str(backup) if backup.exists() else None}
    out["state"] = kinds.pop() if len(kinds) == 1 else "broken" if "broken" in kinds else "mixed"
    return out


def _replace_with_link(path: Path, target: Path) -> None:
    tmp = path.with_name(path.name + ".lablib-tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, path)  # atomic: a process starting now loads one or the other, never neither


def link(libs: dict[str, Path], folder: Path) -> None:
    """Each bundled file moved to ``<name>.bundled`` (a fresh wheel's file replaces an old
    backup), its name linked to the OpenBLAS file in ``folder``."""
    for role, path in libs.items():
        target = folder / ROLES[role][1]
        if path.is_symlink():
            if Path(os.readlink(path)) != target:
                _replace_with_link(path, target)
            continue
        if not path.is_file():
            raise BlasError(f"{path} is missing: reinstall mlx-cpu (pip install --force-reinstall --no-deps {DIST})")
        os.replace(path, path.with_name(path.name + BACKUP))
        _replace_with_link(path, target)


def restore(libs: dict[str, Path]) -> None:
    """The bundled files back under their names (links removed)."""
    for path in libs.values():
        if not path.is_symlink():
            continue
        backup = path.with_name(path.name + BACKUP)
        if not backup.is_file():
            raise BlasError(
                f"{path} is a link and its bundled original ({backup.name}) is gone: "
                f"reinstall mlx-cpu (pip install --force-reinstall --no-deps {DIST}=={_version()})"
            )
        os.replace(backup, path)


def _version() -> str:
    try:
        return importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:
        return "?"


# Runs in a child (a bad library must not take this process down): MLX with the linked libraries.
# argv[1]: the OpenBLAS libblas.so.3 the link points to. Prints one JSON line; exit 0 when all holds.
_CHECK = r"""
import json, os, random, sys
want = os.path.realpath(sys.argv[1])
import mlx.core as mx
maps = {l.split()[-1] for l in open("/proc/self/maps") if "/" in l}
fails = [] if want in maps else [f"{want} is not mapped: MLX loaded another BLAS"]
rng = random.Random(7)
def rand(r, c): return [[rng.uniform(-1, 1) for _ in range(c)] for _ in range(r)]
def ref(a, b): return [[sum(x * y for x, y in zip(row, col)) for col in zip(*b)] for row in a]
for m, k, n, trans in ((37, 96, 53, False), (1, 160, 72, False), (24, 40, 1, False), (33, 64, 48, True)):
    a, b = rand(m, k), rand(n, k) if trans else rand(k, n)
    bb = [list(c) for c in zip(*b)] if trans else b
    with mx.stream(mx.cpu):
        xb = mx.array(b, dtype=mx.float32)
        got = (mx.array(a, dtype=mx.float32) @ (xb.T if trans else xb)).tolist()
    want_ = ref(a, bb)
    err = max(abs(g - w) for gr, wr in zip(got, want_) for g, w in zip(gr, wr))
    if not err < 1e-4 * k ** 0.5:
        fails.append(f"float32 matmul {m}x{k} @ {k}x{n}{' (B transposed)' if trans else ''}: max error {err:.3g}")
s = rand(12, 12)
for i in range(12):
    s[i][i] += 12.0  # diagonally dominant: well conditioned
with mx.stream(mx.cpu):
    eye = (mx.array(s) @ mx.linalg.inv(mx.array(s))).tolist()
err = max(abs(v - (i == j)) for i, r in enumerate(eye) for j, v in enumerate(r))
if not err < 1e-4:
    fails.append(f"LAPACK inverse: |A A^-1 - I| = {err:.3g}")
print(json.dumps({"ok": not fails, "fails": fails}))
sys.exit(1 if fails else 0)
"""


def check(folder: Path, timeout: float = 300) -> tuple[bool, str]:
    """MLX on the linked libraries, in a child process: (it holds, what failed)."""
    try:
        p = subprocess.run(
            [sys.executable, "-c", _CHECK, str(folder / ROLES["blas"][1])],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False, f"the check did not finish within {timeout:.0f} s"
    if p.returncode < 0:
        return False, f"the check died with {signal.Signals(-p.returncode).name}"
    try:
        verdict = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return False, (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return bool(verdict["ok"]), "; ".join(verdict["fails"])


def install(given: str | None = None, log=print) -> dict:
    """Link MLX to the system's OpenBLAS when it is installed and the check passes; otherwise the
    bundled libraries stay (or come back). Returns :func:`state`, with ``why`` when bundled."""
    libs = bundled_libs()
    if libs is None:
        st = state(libs)
        log(f"lablib.build.mlx: nothing to link ({st['why']})")
        return st
    if os.environ.get(ENV, "").strip().lower() == "bundled":
        restore(libs)
        st = {**state(libs), "why": f"{ENV}=bundled"}
        log(f"lablib.build.mlx: MLX keeps the reference BLAS bundled with {DIST} ({ENV}=bundled)")
        return st
    folder = openblas_dir(given)
    if folder is None:
        restore(libs)
        where = given or "/usr/lib/<multiarch>/openblas-pthread"
        why = f"no OpenBLAS libblas.so.3 and liblapack.so.3 in {where}"
        log(
            f"lablib.build.mlx: MLX keeps the slow reference BLAS bundled with {DIST} ({why}). For prefill "
            f"~20x faster: sudo apt-get install {APT}, then make mlx-blas"
        )
        return {**state(libs), "why": why}
    link(libs, folder)
    ok, why = check(folder)
    if not ok:
        restore(libs)
        log(f"lablib.build.mlx: MLX on {folder} failed its check ({why}); the bundled reference BLAS is back")
        return {**state(libs), "why": why}
    log(f"lablib.build.mlx: MLX ({DIST} {_version()}) runs on the OpenBLAS in {folder} (checked)")
    return state(libs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="MLX's CPU backend on the system's OpenBLAS (Linux).")
    act = ap.add_mutually_exclusive_group()
    act.add_argument("--install", action="store_true", help="link to the system's OpenBLAS and check it")
    act.add_argument("--restore", action="store_true", help="the bundled reference BLAS and LAPACK back")
    ap.add_argument(
        "--openblas",
        metavar="DIR",
        help="folder with OpenBLAS's libblas.so.3 and liblapack.so.3 (default: /usr/lib/<multiarch>/openblas-pthread)",
    )
    ns = ap.parse_args(argv)
    try:
        if ns.install:
            install(ns.openblas)
            return 0
        if ns.restore:
            libs = bundled_libs()
            if libs is not None:
                restore(libs)
        print(json.dumps(state(), indent=1))
    except (BlasError, OSError) as e:
        print(f"lablib.build.mlx: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
