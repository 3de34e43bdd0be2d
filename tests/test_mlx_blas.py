"""MLX's CPU backend on OpenBLAS, linked by set-up for MLX alone (lablib.build.mlx), with the results
of the reference BLAS its wheel bundles.

The reference values were computed on the bundled netlib BLAS (mlx-cpu 0.32.4, the default model,
float32): the greedy ids of the default prompt and the logits of its last position. On OpenBLAS the
ids are the same and the logits within 1.4e-4 (measured, every position and token); a wrong kernel
or a BLAS that does not do what MLX asks misses them by far more.
"""

import ctypes
import os
import sys
from pathlib import Path

import pytest

from lablib.build import mlx as build_mlx
from lablib.engines.base import GenerationConfig
from lablib.measure.workload import DEFAULT_MESSAGES, chat_ids

ON_MLX_CPU = sys.platform.startswith("linux") and build_mlx.bundled_libs() is not None
# the default prompt (chat template, 37 tokens): "The capital of France is Paris." then <|im_end|> (2)
DEFAULT_GREEDY = [504, 3575, 282, 4649, 314, 7042, 30, 2]
# its last position: the 5 highest logits, token id -> logit, on the bundled reference BLAS
DEFAULT_TOP5 = {504: 25.32543182, 60: 25.24328995, 15319: 24.94243050, 2219: 24.40167618, 7026: 24.31467438}


@pytest.mark.engine
@pytest.mark.skipif(not ON_MLX_CPU, reason="MLX runs on mlx-cpu's libraries on Linux only")
def test_mlx_runs_on_openblas_and_says_so(mlx):
    """Set-up linked MLX to the system's OpenBLAS (`make setup`, `make test`: python -m
    lablib.build.mlx --install); info() names it. Not so? `make mlx-blas` says why."""
    blas = mlx.info().flags["blas"]
    state = build_mlx.state()
    assert state["state"] == "openblas", f"{state}: run `make mlx-blas` (needs Debian's {build_mlx.APT})"
    assert blas["name"].startswith("OpenBLAS 0."), blas
    assert blas["file"] == os.path.realpath(state["blas"]["path"])  # the linked file is what MLX calls
    assert "mlx_cpu.libs" not in blas["file"] and blas["core"] and blas["threads"] >= 1
    assert mlx.info().backend.endswith(f"BLAS: {blas['name']}")


@pytest.mark.engine
@pytest.mark.skipif(not ON_MLX_CPU, reason="MLX runs on mlx-cpu's libraries on Linux only")
def test_only_mlx_sees_the_openblas(mlx, hf):
    """OpenBLAS is libmlx's own dependency, not in the process's global scope, where torch's
    ``sgemm_``, ``dgemm_`` and LAPACK calls would bind to it instead of torch's own MKL (as they do
    under a process-wide LD_PRELOAD: LD_DEBUG=bindings shows it)."""
    import torch

    assert mlx.info().flags["blas"]["name"].startswith("OpenBLAS")
    everyone = ctypes.CDLL(None)  # the global scope: the program, LD_PRELOAD, RTLD_GLOBAL libraries
    assert not hasattr(everyone, "openblas_get_config") and not hasattr(everyone, "sgemm_")
    assert "BLAS_INFO=mkl" in torch.__config__.show()


@pytest.mark.engine
@pytest.mark.skipif(not ON_MLX_CPU, reason="the reference values are MLX's CPU backend's")
def test_mlx_keeps_the_reference_blas_results(mlx, model):
    """The default prompt: the same 8 greedy ids as on the bundled reference BLAS, and the same
    top 5 logits of its last position within 1e-3."""
    import numpy as np

    ids = chat_ids(model, DEFAULT_MESSAGES)
    assert len(ids) == 37
    assert mlx.generate(ids, GenerationConfig(max_new_tokens=8, ignore_eos=True)).token_ids == DEFAULT_GREEDY
    last = mlx.logits(ids)[-1]
    top = np.argsort(-last)[:5].tolist()
    assert top == list(DEFAULT_TOP5)
    assert np.abs(last[top] - np.array(list(DEFAULT_TOP5.values()))).max() < 1e-3


# --- the set-up step, on a stand-in layout (no wheel is touched) ---------------------------------
@pytest.fixture
def layout(tmp_path):
    libs_dir = tmp_path / "site" / "mlx_cpu.libs"
    libs_dir.mkdir(parents=True)
    libs = {"blas": libs_dir / "libblas-0000.so.3.10.0", "lapack": libs_dir / "liblapack-0000.so.3.10.0"}
    for p in libs.values():
        p.write_bytes(b"bundled " + p.name.encode())
    system = tmp_path / "openblas-pthread"
    system.mkdir()
    for name in ("libblas.so.3", "liblapack.so.3"):
        (system / name).write_bytes(b"openblas " + name.encode())
    return libs, system


def test_link_and_restore_are_each_others_undo(layout):
    libs, system = layout
    assert build_mlx.state(libs)["state"] == "bundled"
    build_mlx.link(libs, system)
    st = build_mlx.state(libs)
    assert st["state"] == "openblas"
    assert st["blas"]["target"] == str(system / "libblas.so.3")
    assert st["lapack"]["target"] == str(system / "liblapack.so.3")
    assert libs["blas"].read_bytes() == b"openblas libblas.so.3"
    assert Path(st["blas"]["backup"]).read_bytes() == b"bundled libblas-0000.so.3.10.0"
    build_mlx.link(libs, system)  # again: nothing changes, the backup is not overwritten by a link
    assert Path(st["blas"]["backup"]).read_bytes() == b"bundled libblas-0000.so.3.10.0"
    build_mlx.restore(libs)
    assert build_mlx.state(libs)["state"] == "bundled"
    assert libs["blas"].read_bytes() == b"bundled libblas-0000.so.3.10.0" and not libs["blas"].is_symlink()
    assert not any(p.name.endswith(build_mlx.BACKUP) for p in libs["blas"].parent.iterdir())


def test_a_reinstalled_wheel_is_linked_again_and_a_missing_target_is_broken(layout):
    libs, system = layout
    build_mlx.link(libs, system)
    libs["blas"].unlink()  # pip reinstalls mlx-cpu: it unlinks the link and writes the bundled file
    libs["blas"].write_bytes(b"fresh wheel")
    assert build_mlx.state(libs)["state"] == "mixed"
    build_mlx.link(libs, system)
    assert build_mlx.state(libs)["state"] == "openblas"
    assert Path(build_mlx.state(libs)["blas"]["backup"]).read_bytes() == b"fresh wheel"
    (system / "libblas.so.3").unlink()  # OpenBLAS removed from the system: MLX would not import
    assert build_mlx.state(libs)["state"] == "broken"
    build_mlx.restore(libs)
    assert build_mlx.state(libs)["state"] == "bundled"


def test_restore_without_the_bundled_file_says_to_reinstall(layout):
    libs, system = layout
    build_mlx.link(libs, system)
    Path(build_mlx.state(libs)["blas"]["backup"]).unlink()
    with pytest.raises(build_mlx.BlasError, match="pip install --force-reinstall --no-deps mlx-cpu"):
        build_mlx.restore(libs)


def test_install_links_only_what_passes_its_check(layout, monkeypatch):
    libs, system = layout
    monkeypatch.setattr(build_mlx, "bundled_libs", lambda: libs)
    monkeypatch.delenv(build_mlx.ENV, raising=False)
    said = []
    monkeypatch.setattr(build_mlx, "check", lambda folder: (False, "float32 matmul 37x96 @ 96x53: max error 3.1"))
    st = build_mlx.install(str(system), log=said.append)
    assert st["state"] == "bundled" and "max error 3.1" in st["why"] and "failed its check" in said[-1]
    monkeypatch.setattr(build_mlx, "check", lambda folder: (True, ""))
    assert build_mlx.install(str(system), log=said.append)["state"] == "openblas"
    monkeypatch.setenv(build_mlx.ENV, "bundled")  # kept on purpose: install puts the bundled files back
    assert build_mlx.install(str(system), log=said.append)["state"] == "bundled"
    monkeypatch.delenv(build_mlx.ENV)
    st = build_mlx.install(str(system / "nowhere"), log=said.append)
    assert st["state"] == "bundled" and f"apt-get install {build_mlx.APT}" in said[-1]


def test_make_links_mlx_in_setup_and_again_after_the_test_packages():
    """A fresh clone: `make setup` links when OpenBLAS is there; `make test` installs the Debian
    package with the others and links again before pytest."""
    root = Path(__file__).resolve().parents[1]
    make = (root / "Makefile").read_text()
    setup = make.split("$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert setup.index('-e ".[all]"') < setup.index("-m lablib.build.mlx --install")
    test = make.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "test-packages" in test.splitlines()[0]
    assert test.index("-m lablib.build.mlx --install") < test.index("-m pytest")
    assert build_mlx.APT in (root / "scripts" / "ensure-test-packages").read_text()
