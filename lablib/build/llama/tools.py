"""llama.cpp's own programs (llama-bench, llama-server, ...), built from the installed library's CMake tree.

Standard library only (it runs before the lab is installed).
"""

from __future__ import annotations

import fcntl
import subprocess
import time
from pathlib import Path

from lablib.build.llama.probe import BuildError
from lablib.build.llama.wheel import _build_env, build_report, wall_time

# llama.cpp's own programs, built from the library's build tree on first use (llama_tool)
TOOLS = (
    "llama-bench",
    "llama-batched-bench",
    "llama-server",
    "llama-perplexity",
    "llama-quantize",
    "llama-export-lora",
)


def source_tree() -> Path:
    """The llama.cpp source this environment's library was built from (``<build dir>/src/vendor/llama.cpp``,
    kept by ``--install``). Raises BuildError when no build is recorded for this environment or the tree is
    gone."""
    report = build_report()
    folder = Path(report["build_dir"]) if report and report.get("build_dir") else None
    tree = folder / "src" / "vendor" / "llama.cpp" if folder else None
    if tree is None or not tree.is_dir():
        raise BuildError(
            "llama.cpp's source is kept next to the library's build, and none is recorded for this environment: "
            "run `python -m lablib.build.llama --install` (`make setup` does)"
        )
    return tree


def converter_path() -> Path:
    """llama.cpp's ``convert_hf_to_gguf.py`` from :func:`source_tree`: a Hugging Face folder to GGUF, written
    the way the library of this environment reads it (same version). Raises BuildError as
    :func:`source_tree` does, or when the script is missing."""
    script = source_tree() / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise BuildError(f"{script} is missing: the llama.cpp source next to the library's build is incomplete")
    return script


def llama_tool(name: str, log=print) -> Path:
    """Path of llama.cpp's program ``name`` (one of :data:`TOOLS`), built on first use.

    It is built in the CMake tree of this environment's installed library (same source, same
    flags: the report ``--install`` wrote), so it measures the same kernels as the in-process
    engine. The first call for a tool takes a minute or more (the library's objects are reused).
    Raises BuildError when ``name`` is unknown or this environment's library was not installed
    by ``python -m lablib.build.llama --install``.
    """
    return llama_tools((name,), log=log)[name]


def llama_tools(names=TOOLS, log=print, build: bool = True) -> dict[str, Path]:
    """``{name: path}`` of llama.cpp's programs ``names`` (default: all of :data:`TOOLS`), the missing ones
    built together: one CMake configure and one ``cmake --build`` of their targets, so the objects they share
    (llama.cpp's ``common`` library) compile once and on every core. ``make setup`` builds them all this way,
    in the background while the lab's packages install (``python -m lablib.build.llama --tool all``), then
    waits for that build (``build=False``, ``--wait``): it takes the build's lock and builds nothing itself.

    One build at a time per tree (a file lock, ``tools.lock``): a second process waits, then finds them
    built. Raises BuildError as :func:`llama_tool` does, with the build's last lines when it fails, or (with
    ``build=False``) naming the programs no build made.
    """
    names = tuple(dict.fromkeys((names,) if isinstance(names, str) else names))
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise BuildError(f"unknown llama.cpp tool {unknown[0]!r}: expected one of {', '.join(TOOLS)}")
    report = build_report()
    folder = Path(report["build_dir"]) if report and report.get("build_dir") else None
    if folder is None or not (folder / "src" / "CMakeLists.txt").exists() or not (folder / "build").is_dir():
        raise BuildError(
            f"llama.cpp's programs ({', '.join(names)}) are built from the same build tree as the installed "
            "library, and none is recorded for this environment: run `python -m lablib.build.llama --install` "
            "(`make setup` does)"
        )
    tree = folder / "build"
    exes = {n: tree / "bin" / n for n in names}
    if build and all(e.is_file() for e in exes.values()):
        return exes  # (waiting, the lock is taken first: a program is a file before its linker is done)
    with open(folder / "tools.lock", "w") as lock:  # one tool build at a time in this tree
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [n for n, e in exes.items() if not e.is_file()]  # another process may have built some
        if missing and not build:
            raise BuildError(
                f"llama.cpp's {', '.join(missing)} not built: the build this waited for failed, or none ran; "
                "`python -m lablib.build.llama --tool all` builds them (and says why one fails)"
            )
        if missing:
            log(
                f"llama.cpp: building {', '.join(missing)} from the library's build tree "
                f"(CMAKE_ARGS={report['cmake_args']!r})"
            )
            env = _build_env(report["cmake_args"])
            # LLAVA_BUILD=OFF: llama.cpp's tools add its mtmd folder themselves (llama-cpp-python adds it too otherwise)
            steps = [
                [
                    "cmake",
                    "-S",
                    str(folder / "src"),
                    "-B",
                    str(tree),
                    "-DLLAVA_BUILD=OFF",
                    "-DLLAMA_BUILD_TOOLS=ON",
                    "-DLLAMA_BUILD_SERVER=ON",
                    "-DLLAMA_BUILD_UI=OFF",
                    "-DLLAMA_USE_PREBUILT_UI=OFF",
                ],
                ["cmake", "--build", str(tree), "--target", *missing, "--parallel", env["CMAKE_BUILD_PARALLEL_LEVEL"]],
            ]
            start = time.monotonic()
            for cmd in steps:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if p.returncode != 0:
                    tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-15:])
                    raise BuildError(
                        f"building llama.cpp's {', '.join(missing)} failed ({' '.join(cmd[:3])} ...):\n{tail}"
                    )
            log(f"llama.cpp: built {', '.join(missing)} in {wall_time(time.monotonic() - start)}")
    absent = [str(e) for e in exes.values() if not e.is_file()]
    if absent:
        raise BuildError(f"building llama.cpp's tools finished but {', '.join(absent)} does not exist")
    return exes
