"""The llama.cpp build judged on a CPU this machine is not: an x86 without AVX-512, emulated.

The project's machines differ (AMD EPYC without AVX-512; Intel Xeon with AVX-512 and AMX). CI runs
on one of them; qemu-user's emulation of a Haswell (:data:`lablib.build.llama.PORTABLE_CPU`; QEMU 7.2
executes up to AVX2, FMA and F16C) stands in for a CPU without AVX-512, so each run also checks the
probe and the smoke test, with the real programs and the real built library, on the other kind.

It is the CPU ``make wheelhouse PORTABLE=1`` checks its wheel on, so the smoke test of this
environment's wheel runs once under emulation (minutes on two cores; tests/emulation.py keeps the
verdict per wheel and CPU) and serves both the test of the build and the test of the portable check.
(An EPYC-Rome, the AVX2-only EPYC's model, runs the same instruction set as far as llama.cpp's
CPU features go: the probe below finds the same six on both.)
"""

import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

import emulation
from lablib.build import llama as llama_build, wheelhouse

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="emulates an x86-64 CPU")

CPU = llama_build.PORTABLE_CPU  # Haswell: AVX2, FMA, F16C, BMI2; no AVX-512, AVX-VNNI or AMX
SMOKE = dict(threads=2, timeout=900)  # check_portable's: one emulated smoke run serves both tests
BEYOND = ("AVX512", "AVX_VNNI", "AMX")  # what such a CPU cannot run


@pytest.fixture(scope="session")
def emulated():
    """qemu-user as an EPYC-Rome (lablib.build.llama.emulator), made and checked once per session."""
    return emulation.emulator(CPU)


def test_the_probe_on_a_cpu_without_avx512_keeps_avx2_and_refuses_the_rest(emulated):
    features = emulation.probe(CPU)  # probe_cpu_features(runner=emulated), once per session
    on = {k[5:] for k, ok in features.items() if ok}
    assert on == {"SSE42", "AVX", "AVX2", "FMA", "F16C", "BMI2"}
    args = llama_build.cmake_args(features)
    assert "-DGGML_AVX2=ON" in args and "-DGGML_AVX512=OFF" in args and "-DGGML_AMX_INT8=OFF" in args


def test_the_emulator_runs_python_and_numpy_as_that_cpu(emulated):
    """The control for the next test: Python and numpy run under the emulation, and numpy's own
    dispatch sees a CPU without AVX-512 (so a crash there is the library's, not the emulator's)."""
    code = (
        "import numpy as np\n"
        "try:\n    from numpy._core._multiarray_umath import __cpu_features__ as f\n"
        "except ImportError:  # numpy 1.x\n    from numpy.core._multiarray_umath import __cpu_features__ as f\n"
        "print(float(np.arange(10.0).sum()), f['AVX2'], f['AVX512F'])"
    )
    out = subprocess.run([*emulated, sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["45.0", "True", "False"]


def test_the_smoke_test_judges_this_environments_build_on_a_cpu_without_avx512(emulated):
    """The real library on the real model, on the emulated CPU: a build that switched on an
    extension that CPU lacks dies there with SIGILL, which the smoke test reports (the verdict
    the fallback acts on, as on an AMX Xeon); a build without them runs."""
    report = llama_build.build_report()
    assert report is not None, "this environment's llama-cpp-python was not installed by llama_build --install"
    beyond = [e for e in report["enabled"] if e.startswith(BEYOND)]
    # smoke_test(wheel, model, threads=2, timeout=900, runner=emulated): once per session and wheel
    verdict = emulation.smoke(Path(report["wheel"]), llama_build.default_model_path(), CPU, **SMOKE)
    if beyond:
        assert verdict == {"ok": False, "signal": "SIGILL", "detail": "the smoke test died with SIGILL"}, beyond
    else:
        assert verdict["ok"] is True, verdict
        assert "AVX512 = 1" not in verdict["system_info"]


def test_a_wheel_for_other_laptops_is_run_on_an_emulated_x86_64_v3_cpu():
    """``make wheelhouse PORTABLE=1`` runs the portable wheel on an emulated Haswell too; a wheel
    with more than x86-64-v3 in it (this environment's, where the CPU has AVX-512) is refused there."""
    report = llama_build.build_report()
    assert report is not None, "this environment's llama-cpp-python was not installed by llama_build --install"
    beyond = sorted(set(report["enabled"]) - {opt[5:] for opt in llama_build.PORTABLE})
    called = []

    def smoke(wheel, model, threads, timeout, runner):  # the real smoke test, once per wheel and CPU
        called.append(runner)
        assert {"threads": threads, "timeout": timeout} == SMOKE and tuple(runner) == emulation.emulator(CPU)
        return emulation.smoke(wheel, model, CPU, **SMOKE)

    run = lambda: wheelhouse.check_portable(
        Path(report["wheel"]), llama_build.default_model_path(), log=lambda *a: None, smoke=smoke
    )
    if beyond:
        with pytest.raises(RuntimeError, match=r"does not run on an emulated Haswell \(x86-64-v3\): .*SIGILL"):
            run()
    else:
        assert run() == ["emulated Haswell (x86-64-v3)"]
    assert len(called) == 1  # it ran the smoke test on the emulated Haswell


def test_verdicts_on_an_emulated_cpu_are_kept_for_that_cpu_not_this_machine(emulated, tmp_path):
    """A build that fails on the emulated CPU is never served there again, and stays usable here."""
    assert llama_build.machine_fingerprint(emulated) != llama_build.machine_fingerprint()
    built: list[str] = []

    def build(root, args, log=print):
        built.append(args)
        folder = llama_build.wheel_cache_dir(root, args)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_text(args)
        return folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"

    def smoke(wheel, model, runner=()):  # stand-in: AVX-512 dies on the emulated CPU only
        dies = runner and "-DGGML_AVX512=ON" in wheel.read_text()
        return {"ok": False, "signal": "SIGILL", "detail": "died"} if dies else {"ok": True, "system_info": ""}

    features = {"GGML_AVX2": True, "GGML_AVX512": True}
    quiet = dict(build=build, smoke=smoke, log=lambda *a: None)
    wheel, report = llama_build.verified_build(features, tmp_path, tmp_path / "m.gguf", runner=emulated, **quiet)
    assert [d["family"] for d in report["dropped"]] == ["AVX-512"]
    assert report["emulated"] == list(emulated) and report["machine"] == llama_build.machine_fingerprint(emulated)
    first = llama_build.wheel_cache_dir(tmp_path, built[0])
    assert llama_build.failed_here(first, emulated)["signal"] == "SIGILL"
    assert llama_build.failed_here(first) is None  # this machine's verdict on that build is not touched
    built.clear()
    here, report_here = llama_build.verified_build(features, tmp_path, tmp_path / "m.gguf", **quiet)
    assert built == [report_here["cmake_args"]]  # the AVX-512 build, not refused here
    assert "-DGGML_AVX512=ON" in report_here["cmake_args"] and report_here["dropped"] == []


def test_an_unknown_cpu_model_is_refused_with_where_to_look():
    with pytest.raises(llama_build.BuildError, match=r"no CPU model 'Pentium-9'.*-cpu help"):
        llama_build.emulator("Pentium-9")


@pytest.mark.parametrize("word", ["avx2", "Available", "(alias", "x86"])
def test_a_word_of_qemus_help_that_is_no_cpu_model_is_refused(word):
    """``qemu-x86_64 -cpu help`` also lists CPUID flags and prose: none of that is a CPU model (qemu
    itself refuses it, so every probe would fail and a build with all extensions off would follow)."""
    with pytest.raises(llama_build.BuildError, match=rf"no CPU model '{re.escape(word)}'.*-cpu help"):
        llama_build.emulator(word)


def test_a_cpu_model_in_other_case_is_refused_naming_the_model_meant():
    with pytest.raises(llama_build.BuildError, match=r"no CPU model 'epyc-rome' \(did you mean 'EPYC-Rome'\?\)"):
        llama_build.emulator("epyc-rome")


def test_a_32_bit_cpu_model_is_refused_as_one_that_cannot_run_x86_64_programs():
    with pytest.raises(llama_build.BuildError, match=r"CPU model 'pentium3' does not run x86-64 programs"):
        llama_build.emulator("pentium3")
    assert llama_build.emulator("Haswell")[1:] == ("-cpu", "Haswell")


@pytest.mark.parametrize("option", [["--cpu", CPU], ["--portable"]])
def test_tool_with_an_option_it_cannot_honour_is_refused_not_ignored(option, capsys):
    """``--tool`` builds llama.cpp's program from this environment's installed library and its flags
    (for this CPU): asked together with ``--cpu`` or ``--portable`` it would hand back a program for
    this machine while the user asked for another CPU; refused before anything is built."""
    with pytest.raises(SystemExit) as e:
        llama_build.main([*option, "--tool", "llama-server"])
    assert e.value.code == 2
    err = capsys.readouterr()
    assert f"{option[0]} does not apply to --tool" in err.err and err.out == ""


def test_emulating_an_x86_cpu_on_another_architecture_is_refused_at_once(monkeypatch):
    """On an ARM machine with qemu-x86_64 installed, this interpreter and compiler make ARM
    programs: the probe would find nothing and a native build would follow, only for its smoke
    test to fail under qemu minutes later. Refused before anything runs."""
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    with pytest.raises(llama_build.BuildError, match=rf"emulating the CPU '{CPU}' .*this machine is aarch64"):
        llama_build.emulator(CPU)
