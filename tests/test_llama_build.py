"""The CPU probe behind the llama.cpp build: extensions are enabled only if they execute."""

import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import emulation
from lablib.build import llama as llama_build

x86 = platform.machine().lower() in ("x86_64", "amd64")


def test_cmake_args_map_each_probe_to_a_flag():
    args = llama_build.cmake_args({"GGML_AVX2": True, "GGML_AMX_INT8": False})
    assert args == "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AMX_INT8=OFF"
    assert llama_build.cmake_args({}) == ""  # non-x86: the engine's own defaults


def test_portable_flags_keep_only_x86_64_v3_extensions_that_run_here():
    probed = {"GGML_AVX2": True, "GGML_FMA": False, "GGML_AVX512": True, "GGML_AVX_VNNI": True, "GGML_AMX_INT8": False}
    args = llama_build.cmake_args(probed, portable=True)
    assert args == (
        "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=OFF -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_INT8=OFF"
    )
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
    feats = emulation.probe()  # llama_build.probe_cpu_features(), once per session
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


# --- the verdict comes from the built library: smoke test and fallback ------------------------

ROOT = Path(__file__).resolve().parent.parent
ALL_ON = {opt: True for opt in llama_build._PROBES}


def _stand_ins(fails_with: set[str], built: list[str], tmp_path: Path, compile_fails: set[str] = frozenset()):
    """A build that records its CMAKE_ARGS (and fails to compile while an option of
    ``compile_fails`` is on) and a smoke step that 'dies with SIGILL' while any option of
    ``fails_with`` is on (a real rebuild inside a test takes minutes)."""

    def build(root, args, log=print):
        built.append(args)
        if any(f"-D{opt}=ON" in args for opt in compile_fails):
            raise subprocess.CalledProcessError(1, ["pip", "wheel"])
        folder = llama_build.wheel_cache_dir(root, args)
        folder.mkdir(parents=True, exist_ok=True)
        wheel = folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
        wheel.write_text(args)
        return wheel

    def smoke(wheel, model, runner=()):
        on = set(re.findall(r"-D(\w+)=ON", wheel.read_text()))
        if on & fails_with:
            return {"ok": False, "signal": "SIGILL", "detail": "the smoke test died with SIGILL"}
        return {"ok": True, "system_info": "CPU : AVX2 = 1 |"}

    return build, smoke


def test_a_build_that_crashes_with_amx_is_rebuilt_without_it(tmp_path):
    built: list[str] = []
    build, smoke = _stand_ins({"GGML_AMX_INT8"}, built, tmp_path)
    wheel, report = llama_build.verified_build(
        dict(ALL_ON), tmp_path, tmp_path / "m.gguf", build=build, smoke=smoke, log=lambda *a: None
    )
    assert len(built) == 2 and "-DGGML_AMX_INT8=ON" in built[0]
    assert "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" in report["cmake_args"]
    assert "-DGGML_AVX512=ON" in report["cmake_args"]  # only the family at fault is switched off
    assert [d["family"] for d in report["dropped"]] == ["AMX"]
    assert "SIGILL" in report["dropped"][0]["reason"]
    assert "AMX_INT8" not in report["enabled"] and "AVX512" in report["enabled"]
    # the crashing build is marked failed for this machine and never served from the cache again
    failed = llama_build.wheel_cache_dir(tmp_path, built[0])
    assert llama_build.failed_here(failed)["signal"] == "SIGILL"
    assert llama_build.cached_wheel(failed) is None
    built.clear()
    wheel2, report2 = llama_build.verified_build(
        dict(ALL_ON), tmp_path, tmp_path / "m.gguf", build=build, smoke=smoke, log=lambda *a: None
    )
    assert built == [report["cmake_args"]]  # the AMX build was not built or tried again
    assert wheel2 == wheel


def test_amx_first_then_the_avx512_family(tmp_path):
    built: list[str] = []
    build, smoke = _stand_ins({"GGML_AMX_TILE", "GGML_AVX512_VNNI"}, built, tmp_path)
    _, report = llama_build.verified_build(
        dict(ALL_ON), tmp_path, tmp_path / "m.gguf", build=build, smoke=smoke, log=lambda *a: None
    )
    assert [d["family"] for d in report["dropped"]] == ["AMX", "AVX-512"]
    assert "-DGGML_AVX512=OFF" in report["cmake_args"] and "-DGGML_AVX2=ON" in report["cmake_args"]
    assert len(built) == 3


def test_a_build_that_crashes_with_nothing_left_to_drop_is_an_error(tmp_path):
    built: list[str] = []
    build, smoke = _stand_ins({"GGML_AVX2"}, built, tmp_path)
    with pytest.raises(llama_build.BuildError, match=r"does not run on this CPU.*SIGILL.*no extension family"):
        llama_build.verified_build(
            dict(ALL_ON), tmp_path, tmp_path / "m.gguf", build=build, smoke=smoke, log=lambda *a: None
        )
    assert len(built) == 4  # all on, then without AMX, AVX-512 and AVX-VNNI in turn


def test_smoke_test_reports_a_child_killed_by_a_signal(tmp_path):
    """A wheel whose library dies on import (as an illegal instruction would) is a failed verdict."""
    import zipfile

    wheel = tmp_path / "llama_cpp_python-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llama_cpp/__init__.py", "import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n")
        z.writestr("llama_cpp_python-0.0.0.dist-info/METADATA", "Name: llama_cpp_python\nVersion: 0.0.0\n")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    verdict = llama_build.smoke_test(wheel, model, timeout=60)
    assert verdict == {"ok": False, "signal": "SIGILL", "detail": "the smoke test died with SIGILL"}


def test_smoke_test_passes_for_the_wheel_this_environment_was_built_with():
    """The real path: the cached wheel of this environment's build runs prefill, decode and a
    two-sequence batch on the default model in a child process."""
    report = llama_build.build_report()
    assert report is not None, "this environment's llama-cpp-python was not installed by llama_build --install"
    verdict = llama_build.smoke_test(Path(report["wheel"]), llama_build.default_model_path())
    assert verdict["ok"] is True
    assert "CPU :" in verdict["system_info"]


@pytest.mark.skipif(not x86, reason="x86 instruction probes")
def test_amx_probe_says_what_ggml_style_code_does_on_this_cpu(tmp_path):
    """data/cases/amx_tile_config.cpp builds its tile configuration as ggml does; at -O3 with
    g++ 12 it dies on an AMX CPU. The probe must agree with it on every CPU: where it crashes
    (or AMX is missing) the probe refuses AMX, where it runs the probe allows it."""
    cxx = shutil.which("g++") or shutil.which("c++")
    exe = tmp_path / "case"
    subprocess.run(
        [
            cxx,
            "-O3",
            "-mamx-tile",
            "-mamx-int8",
            "-mavx512f",
            str(ROOT / "data" / "cases" / "amx_tile_config.cpp"),
            "-o",
            str(exe),
        ],
        check=True,
    )
    case_runs = subprocess.run([str(exe)], capture_output=True, text=True).returncode == 0
    assert emulation.probe()["GGML_AMX_TILE"] is case_runs  # llama_build.probe_cpu_features(), once per session


def test_doctor_line_names_what_the_library_uses_and_what_the_build_dropped():
    info = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 0 | AMX_INT8 = 0 | OPENMP = 1 | REPACK = 1 |"
    report = {
        "dropped": [{"family": "AMX", "reason": "the smoke test died with SIGILL with AMX on"}],
        "refused_by_probe": ["AVX_VNNI"],
    }
    line = llama_build.describe(info, report)
    assert line == (
        "uses SSE3 AVX2 (with OPENMP REPACK); AMX switched off: the smoke test died with SIGILL "
        "with AMX on; not run by this CPU: AVX_VNNI"
    )
    assert "no build record" in llama_build.describe(info, None)
    why = "its probe built at -O0 runs; g++ (Debian 12.2.0-14) 12.2.0 at -O3 breaks ggml's tile set-up"
    report = {
        "dropped": [],
        "refused_by_probe": ["AMX_BF16", "AMX_INT8", "AMX_TILE", "AVX_VNNI"],
        "refused_by_compiler": {"AMX_BF16": why, "AMX_INT8": why, "AMX_TILE": why},
    }
    assert llama_build.describe(info, report) == (
        f"uses SSE3 AVX2 (with OPENMP REPACK); off although this CPU runs them: AMX_BF16 AMX_INT8 AMX_TILE ({why}); "
        "not run by this CPU: AVX_VNNI"
    )


@pytest.mark.skipif(not x86, reason="x86 instruction probes")
def test_amx_that_the_cpu_runs_and_the_compiler_breaks_is_not_called_the_cpus():
    """On a Xeon with AMX, g++ 12's -O3 build of ggml's tile set-up dies though the CPU runs AMX, and doctor said
    "not run by this CPU: AMX_BF16 AMX_INT8 AMX_TILE". The compiler's refusals are the AMX extensions the probe
    refused where the CPU lists AMX (on the Xeons tried, whose kernels grant the tile state), none where it
    lists none (the EPYCs: the -O0 probe dies with SIGILL too)."""
    feats = emulation.probe()  # llama_build.probe_cpu_features(), once per session
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    refused = {k[5:] for k, ok in feats.items() if not ok and k.startswith("GGML_AMX")}
    found = llama_build.compiler_refusals(feats)
    assert set(found) == (refused if "amx_tile" in flags else set()), (found, refused)
    assert all("at -O3 breaks ggml's tile set-up (data/cases/amx_tile_config.cpp)" in why for why in found.values())


# --- a GPU build where a GPU and the CUDA toolkit are, and the CPU build when it does not work ----


def _program(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)


def test_cuda_is_asked_for_only_where_a_gpu_and_nvcc_are(tmp_path, monkeypatch):
    _program(tmp_path, "nvcc", "exit 0")
    _program(tmp_path, "nvidia-smi", "exit 0")  # the driver's tool, listing no GPU
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("LABLIB_LLAMA_GPU", raising=False)
    # a CUDA toolkit on a machine without a GPU (this project's CPU machines ship nvcc 13.0)
    assert llama_build.gpu_cmake_args() == ""
    _program(tmp_path, "nvidia-smi", 'echo "NVIDIA H200, 143771"')
    assert llama_build.gpu_cmake_args() == "-DGGML_CUDA=ON"
    assert llama_build.gpu_cmake_args(portable=True) == ""  # a wheel for other machines stays CPU-only
    monkeypatch.setenv("LABLIB_LLAMA_GPU", "0")
    assert llama_build.gpu_cmake_args() == ""


@pytest.mark.parametrize("compile_fails, smoke_fails", [({"GGML_CUDA"}, set()), (set(), {"GGML_CUDA"})])
def test_a_cuda_build_that_fails_falls_back_to_the_cpu_build(tmp_path, monkeypatch, compile_fails, smoke_fails):
    _program(tmp_path, "nvcc", "exit 0")
    _program(tmp_path, "nvidia-smi", 'echo "NVIDIA H200, 143771"')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("LABLIB_LLAMA_GPU", raising=False)
    built: list[str] = []
    build, smoke = _stand_ins(smoke_fails, built, tmp_path, compile_fails)
    features = {"GGML_AVX2": True, "GGML_AVX512": True}
    _, report = llama_build.verified_build(
        features, tmp_path / "cache", tmp_path / "m.gguf", build=build, smoke=smoke, log=lambda *a: None
    )
    assert built == [
        "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_CUDA=ON",
        "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON",  # the CPU's extensions are kept
    ]
    assert report["cmake_args"] == built[1] and [d["family"] for d in report["dropped"]] == ["CUDA"]
    assert ("SIGILL" if smoke_fails else "failed") in report["dropped"][0]["reason"]


# a stand-in for cmake: records each call; a build "links" each --target into bin/ (FAIL=1: the build fails)
FAKE_CMAKE = """#!/bin/sh
echo "$*" >> "$CMAKE_CALLS"
if [ "$1" = "--build" ]; then
    [ "$FAIL" = 1 ] && { echo "error: server.cpp: it did not compile" >&2; exit 2; }
    tree="$2"; shift 3
    for t in "$@"; do case "$t" in --parallel) break;; *) touch "$tree/bin/$t"; chmod +x "$tree/bin/$t";; esac; done
fi
"""


@pytest.fixture
def tools_tree(tmp_path, monkeypatch):
    """A recorded build tree (src/CMakeLists.txt, build/bin/) and a stand-in cmake on PATH, for
    :func:`llama_build.llama_tools` (its build steps, not llama.cpp's compile)."""
    from lablib.build.llama import tools

    folder = tmp_path / "wheels" / "key"
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "CMakeLists.txt").write_text("")
    (folder / "build" / "bin").mkdir(parents=True)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "cmake").write_text(FAKE_CMAKE)
    (fake / "cmake").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CMAKE_CALLS", str(tmp_path / "calls"))
    monkeypatch.setattr(tools, "build_report", lambda: {"build_dir": str(folder), "cmake_args": "-DGGML_AVX2=ON"})
    return folder, tmp_path / "calls"


def _calls(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_the_missing_tools_are_configured_once_and_built_in_one_cmake_call(tools_tree):
    folder, calls = tools_tree
    (folder / "build" / "bin" / "llama-bench").touch()  # built before: not built again
    exes = llama_build.llama_tools(("llama-server", "llama-quantize", "llama-bench", "llama-server"), log=print)
    assert list(exes) == ["llama-server", "llama-quantize", "llama-bench"]  # in order, each once
    assert all(p == folder / "build" / "bin" / n and p.is_file() for n, p in exes.items())
    configure, build = _calls(calls)
    assert configure.startswith(f"-S {folder / 'src'} -B {folder / 'build'}") and "-DLLAMA_BUILD_SERVER=ON" in configure
    assert build == f"--build {folder / 'build'} --target llama-server llama-quantize --parallel {os.cpu_count() or 2}"
    assert llama_build.llama_tools("llama-server") == {"llama-server": exes["llama-server"]}  # a name alone
    assert len(_calls(calls)) == 2  # all there: nothing run again


def test_waiting_builds_nothing_and_names_what_is_missing(tools_tree):
    folder, calls = tools_tree
    (folder / "build" / "bin" / "llama-server").touch()
    assert llama_build.llama_tools(("llama-server",), build=False) == {
        "llama-server": folder / "build/bin/llama-server"
    }
    with pytest.raises(llama_build.BuildError, match=r"llama-bench not built: the build this waited for failed"):
        llama_build.llama_tools(("llama-server", "llama-bench"), build=False)
    assert _calls(calls) == []


def test_a_failed_tools_build_says_which_and_shows_the_compilers_words(tools_tree, monkeypatch, capsys):
    folder, calls = tools_tree
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(llama_build.BuildError, match=r"building llama.cpp's llama-server, llama-bench failed") as e:
        llama_build.llama_tools(("llama-server", "llama-bench"), log=lambda m: None)
    assert "server.cpp: it did not compile" in str(e.value)
    # the command line: the paths on stdout alone, the build's own words on stderr; --wait builds nothing
    assert llama_build.main(["--tool", "all", "--wait"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "not built: the build this waited for failed" in out.err
    assert len(_calls(calls)) == 2  # the failed configure and build; the wait ran neither
    monkeypatch.delenv("FAIL")
    assert llama_build.main(["--tool", "all"]) == 0
    out = capsys.readouterr()
    assert out.out.split() == [str(folder / "build" / "bin" / n) for n in llama_build.TOOLS]
    assert "llama.cpp: building llama-bench, llama-batched-bench" in out.err
    with pytest.raises(llama_build.BuildError, match="unknown llama.cpp tool 'llama-cli'"):
        llama_build.llama_tools(("llama-server", "llama-cli"))


# An in-tree PEP 517 backend (no requirement of its own) for the stand-in sdist below: pip reads its metadata
# the way it reads llama-cpp-python's through scikit-build-core
_BACKEND = """
import os

def get_requires_for_build_wheel(config_settings=None):
    return []

def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    import kitdep  # the build requirement, installed by pip into its isolated build environment

    info = os.path.join(metadata_directory, "llama_cpp_python-0.3.36.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\\nName: llama-cpp-python\\nVersion: 0.3.36\\n")
    return "llama_cpp_python-0.3.36.dist-info"
"""


def _wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of ``files`` (path -> text), written by hand as the wheel format describes it."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"])
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, text in files.items():
            z.writestr(p, text)
    return path


def test_the_source_comes_from_a_wheel_folder_with_no_index(tmp_path, monkeypatch):
    """A machine without network (a GPU box, an offline room): llama-cpp-python's sdist and the wheels its build
    needs in one find-links folder serve :func:`_source`, since only llama-cpp-python itself is asked for as
    source. Asking for everything as source (``--no-binary :all:``) refuses the build requirement's wheel."""
    import tarfile

    from lablib.build.llama import wheel

    links = tmp_path / "links"
    links.mkdir()
    _wheel(links, "kitdep", "1.0", {"kitdep.py": "MARK = 1\n"})
    top = tmp_path / "llama_cpp_python-0.3.36"
    top.mkdir()
    (top / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["kitdep"]\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    )
    (top / "backend.py").write_text(_BACKEND)
    (top / "CMakeLists.txt").write_text("project(stand_in)\n")
    (top / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: llama-cpp-python\nVersion: 0.3.36\n")
    with tarfile.open(links / "llama_cpp_python-0.3.36.tar.gz", "w:gz") as tar:
        tar.add(top, arcname=top.name)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this machine's own find-links and indexes left out

    src = wheel._source(tmp_path / "cache", log=lambda *_: None)

    assert src == tmp_path / "cache" / "src"
    assert (src / "CMakeLists.txt").read_text() == "project(stand_in)\n"
    assert (src / "backend.py").read_text() == _BACKEND


def test_a_source_pip_cannot_fetch_is_named_with_what_to_do(tmp_path, monkeypatch):
    from lablib.build.llama import wheel

    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # an empty folder: no sdist
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with pytest.raises(llama_build.BuildError) as e:
        wheel._source(tmp_path / "cache", log=lambda *_: None)
    assert "could not fetch the source distribution of llama-cpp-python==0.3.36" in str(e.value)
    assert "PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR" in str(e.value)
    assert not (tmp_path / "cache" / "src").exists()
