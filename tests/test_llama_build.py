"""The CPU probe behind the llama.cpp build: extensions are enabled only if they execute."""
import platform
import shutil
import tempfile
from pathlib import Path

import pytest

from lablib import llama_build

x86 = platform.machine().lower() in ("x86_64", "amd64")


def test_cmake_args_map_each_probe_to_a_flag():
    args = llama_build.cmake_args({"GGML_AVX2": True, "GGML_AMX_INT8": False})
    assert args == "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AMX_INT8=OFF"
    assert llama_build.cmake_args({}) == ""  # non-x86: the engine's own defaults


def test_portable_flags_keep_only_x86_64_v3_extensions_that_run_here():
    probed = {"GGML_AVX2": True, "GGML_FMA": False, "GGML_AVX512": True, "GGML_AVX_VNNI": True,
              "GGML_AMX_INT8": False}
    args = llama_build.cmake_args(probed, portable=True)
    assert args == ("-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=OFF -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF "
                    "-DGGML_AMX_INT8=OFF")
    assert llama_build.cmake_args(probed, portable=True) != llama_build.cmake_args(probed)  # its own wheel


def test_wheel_cache_key_depends_on_flags():
    root = Path("/tmp/x")
    assert llama_build.wheel_cache_dir(root, "-DA=ON") != llama_build.wheel_cache_dir(root, "-DA=OFF")
    assert llama_build.wheel_cache_dir(root, "-DA=ON") == llama_build.wheel_cache_dir(root, "-DA=ON")


@pytest.mark.skipif(not x86, reason="x86 instruction probes")
def test_probe_reports_an_illegal_instruction_as_unavailable():
    cc = shutil.which("cc") or shutil.which("gcc")
    with tempfile.TemporaryDirectory() as tmp:
        # ud2 raises SIGILL on every x86 CPU: exactly what a missing extension does
        assert llama_build._probe("", "__builtin_trap();", cc, Path(tmp)) is False
        assert llama_build._probe("-mavx2", "return 0;", cc, Path(tmp)) is True


@pytest.mark.skipif(not x86, reason="x86 instruction probes")
def test_probe_matches_what_the_kernel_reports():
    feats = llama_build.probe_cpu_features()
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    # AVX2 executes where the CPU and kernel advertise it
    assert feats["GGML_AVX2"] == ("avx2" in flags)
    # AMX can only run where it is advertised (it may still be refused by the sandbox)
    if "amx_tile" not in flags:
        assert feats["GGML_AMX_TILE"] is False


def test_portable_flags_need_no_probe():
    """No compiler to probe with: --portable still names x86-64-v3, never ggml's -march=native default."""
    args = llama_build.cmake_args({}, portable=True)
    if not x86:
        assert args == ""
        return
    assert args.startswith("-DGGML_NATIVE=OFF") and "-DGGML_AVX2=ON" in args and "-DGGML_AVX512=OFF" in args


def test_a_compiler_that_does_not_run_is_named(monkeypatch):
    if not x86:
        pytest.skip("the probe runs on x86 only")
    monkeypatch.setenv("CC", "/nonexistent/cc --flag")
    with pytest.raises(llama_build.BuildError, match=r"C compiler '/nonexistent/cc --flag'.*install gcc"):
        llama_build.probe_cpu_features()
