"""Build llama-cpp-python for *this* CPU, and keep only a build that runs here.

Why: a default (``-march=native``) build of llama.cpp can die with SIGILL on
the first multi-token prefill: on a CPU that advertises AMX, the vendored
ggml fills its tile configuration in a struct on the stack and g++ 12 at -O3
drops those stores before ``ldtilecfg`` (``data/cases/amx_tile_config.cpp``
reproduces it in 20 lines). A lowest-common-denominator build runs everywhere
but throws away AVX-512 and AMX where they work.

How:

1. **Probe**: each x86 extension ggml can use is *executed* once in a
   throw-away program; only extensions that run are switched on
   (``-DGGML_NATIVE=OFF -DGGML_<FEATURE>=ON``). The AMX probe is C++ at -O3
   with ggml's own tile-configuration pattern, so it fails where ggml's
   kernels would.
2. **Build** the wheel from llama-cpp-python's source distribution, keeping
   the source and the CMake build tree next to the wheel under
   ``$LABLIB_HOME/wheels/<key of the flags>/``: llama.cpp's own tools
   (:func:`llama_tool`: ``llama-bench``, ``llama-server``, ...) are built later
   from that same tree, so they share the library's source and flags.
3. **Smoke test** (the verdict): a child process loads the default GGUF with
   the built library and runs a multi-token prefill, a few decode steps and a
   two-sequence batch. When it dies by a signal (or returns non-finite
   logits), the wheel is marked failed *for this machine* (never installed or
   served from the cache here again), the next extension family is switched
   off (:data:`FALLBACK`: AMX, then AVX-512, then AVX-VNNI) and the build
   repeats.
4. ``--install`` installs the verified wheel and writes what was enabled and
   dropped, and why, to ``<venv>/lablib-llama-build.json``, which
   ``lablib doctor`` prints.

Another x86 CPU (``--cpu MODEL``): the probe and the smoke test run under QEMU's user-mode
emulation of that CPU model (:func:`emulator`), so a build can be proved on a CPU this machine
is not: QEMU 7.2 executes up to AVX2/FMA/F16C, so ``--cpu EPYC-Rome`` stands in for an AMD EPYC
or a laptop without AVX-512. Its verdicts are kept for that CPU, not for this machine.

On non-x86 machines (Apple silicon, aarch64 Linux) the engine's own defaults
are kept, and the smoke test still runs. GPUs: llama.cpp builds its Metal backend on
macOS by default; where an NVIDIA GPU and the CUDA toolkit's ``nvcc`` are found (:func:`cuda_flags`
of :func:`cuda_facts`) the build adds ``-DGGML_CUDA=ON`` with ``-DCMAKE_CUDA_ARCHITECTURES`` for the
GPUs' compute capabilities (``native`` when they are unknown), prints its wall time, records why CUDA
is on or off (the report's ``cuda``, which ``lablib doctor`` reads), and falls back to the CPU-only
build if that one fails.

Stdlib only: this module runs before the project is installed
(``python -m lablib.build.llama --install``).

The modules: :mod:`.probe` (what runs here, emulation), :mod:`.flags` (CMake flags, fallback order),
:mod:`.wheel` (build, cache, verdicts, install, report), :mod:`.smoke` (the smoke test), :mod:`.tools`
(llama.cpp's programs), :mod:`.main` (the command). The names below are re-exported for
``import lablib.build.llama as llama_build``.
"""

from __future__ import annotations

from lablib.build.llama.flags import (  # noqa: F401
    FALLBACK,
    PORTABLE,
    PORTABLE_CPU,
    cmake_args,
    cuda_facts,
    cuda_flags,
    gpu_cmake_args,
    next_fallback,
)
from lablib.build.llama.main import (  # noqa: F401
    main,
)
from lablib.build.llama.probe import (  # noqa: F401
    _AMX_PROBE,
    _PROBES,
    BuildError,
    _compiler,
    _is_x86,
    _probe,
    compiler_refusals,
    emulator,
    probe_cpu_features,
)
from lablib.build.llama.smoke import (  # noqa: F401
    _SMOKE,
    DEFAULT_MODEL_PACKAGE,
    _ensure_runtime_deps,
    _req_name,
    default_model_path,
    smoke_test,
)
from lablib.build.llama.tools import (  # noqa: F401
    TOOLS,
    converter_path,
    llama_tool,
    llama_tools,
    source_tree,
)
from lablib.build.llama.wheel import (  # noqa: F401
    _BUILD_FEATURES,
    LAYOUT,
    LLAMA_CPP_PYTHON,
    REPORT_NAME,
    _build_env,
    _failures,
    _source,
    build_report,
    build_wheel,
    cached_wheel,
    describe,
    failed_here,
    install,
    machine_fingerprint,
    mark_failed,
    system_info_flags,
    verified_build,
    wall_time,
    wheel_cache_dir,
)
