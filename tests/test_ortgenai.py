"""ONNX Runtime GenAI on the real default model: the ONNX model built from the lab's Hugging Face
folder (fp32 and int4, cached), greedy ids against transformers, the trace, EOS kept under
ignore_eos, the errors a missing package or a failing build give, and a killed loader taking
its builder with it."""

import json
from dataclasses import replace

import pytest

from lablib.engines import ENGINES, load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.ortgenai import BUILD_RECORD, OnnxRuntimeGenAIEngine, onnx_folder
from lablib.errors import EngineUnavailable, LabError
from procs import wait_gone

pytestmark = pytest.mark.engine

NAME = OnnxRuntimeGenAIEngine.name


@pytest.fixture(scope="module")
def ort(model):
    e = load_engine(NAME, model, n_ctx=2048)
    yield e
    e.close()


def test_greedy_ids_agree_with_transformers(ort, hf, first_token_flip):
    ids = first_token_flip["prompt_token_ids"]
    cfg = GenerationConfig(max_new_tokens=8)
    assert ort.generate(ids, cfg).token_ids == hf.generate(ids, cfg).token_ids


def test_teacher_forced_logits_and_config_agree_with_transformers(ort, hf, first_token_flip):
    ids = first_token_flip["prompt_token_ids"][:24]
    a, b = ort.logits(ids), hf.logits(ids)
    assert a.shape == b.shape == (24, 49152)
    assert abs(a - b).max() < 1e-3  # float32 both; measured 6e-5
    assert (a.argmax(-1) == b.argmax(-1)).all()
    assert ort.effective_config() == hf.effective_config()  # RoPE base read back from the graph's cos_cache


def test_trace_has_one_timestamp_per_id_and_prefill_first(ort, first_token_flip):
    ids = first_token_flip["prompt_token_ids"]
    tr = ort.generate(ids, GenerationConfig(max_new_tokens=5))
    assert tr.output_tokens == 5 == len(tr.token_ids) == len(tr.t_tokens)
    assert tr.prompt_tokens == len(ids) and tr.cached_tokens == 0 and tr.finish_reason == "length"
    assert tr.t_submit <= tr.t_start < tr.t_tokens[0]
    assert all(b > a for a, b in zip(tr.t_tokens, tr.t_tokens[1:]))
    assert tr.threads == ort.threads == ort.info().flags["intra_op_num_threads"]


def test_ignore_eos_keeps_the_eos_and_goes_on_as_transformers(ort, hf, first_token_flip):
    ids = first_token_flip["prompt_token_ids"]
    stop = ort.generate(ids, GenerationConfig(max_new_tokens=16, ignore_eos=False))
    assert stop.finish_reason == "stop" and stop.token_ids[-1] in ort.eos_ids and stop.output_tokens < 16
    full = ort.generate(ids, GenerationConfig(max_new_tokens=16))
    assert full.output_tokens == 16 and full.token_ids[: stop.output_tokens] == stop.token_ids
    assert full.token_ids == hf.generate(ids, GenerationConfig(max_new_tokens=16)).token_ids


def test_the_build_is_cached(model, ort):
    logged = []
    folder = onnx_folder(model, "fp32", log=logged.append)
    assert folder == ort.folder and logged == []  # no build, nothing printed
    before = (folder / "model.onnx").stat().st_mtime_ns
    e = load_engine(NAME, model, n_ctx=256)
    e.close()
    assert (folder / "model.onnx").stat().st_mtime_ns == before
    record = json.loads((folder / BUILD_RECORD).read_text())
    assert record["precision"] == "fp32" and "onnxruntime_genai.models.builder" in record["command"]


def test_int4_builds_smaller_and_generates(model, first_token_flip):
    e = load_engine(NAME, model, precision="int4", n_ctx=512)
    try:
        fp32 = onnx_folder(model, "fp32")
        assert e.folder != fp32 and e.info().dtype.startswith("int4")
        # 4-bit weights in blocks of 32 with float32 scales: about 6x smaller than float32
        assert (fp32 / "model.onnx.data").stat().st_size > 5 * (e.folder / "model.onnx.data").stat().st_size
        tr = e.generate(first_token_flip["prompt_token_ids"], GenerationConfig(max_new_tokens=4))
        assert tr.output_tokens == 4 and all(0 <= t < 49152 for t in tr.token_ids)
    finally:
        e.close()


def test_serial_only(ort, model):
    from lablib.measure.sweep import concurrency_sweep

    assert OnnxRuntimeGenAIEngine.modes == ("serial",)
    with pytest.raises(LabError, match="no batched mode"):
        ort.batch_session(GenerationConfig(max_new_tokens=2), max_sequences=2, max_seq_tokens=64)
    # a sweep asked for both modes runs it serial only: 2 clients, 4 requests
    df = concurrency_sweep(
        model,
        engines=["ort"],
        concurrency=[2],
        modes="serial,batched",
        prompt_tokens=16,
        max_new_tokens=2,
        warmup=0,
        progress=False,
    )
    assert list(df["mode"]) == ["serial"] * 4 and (df["output_tokens"] == 2).all()


def test_a_missing_package_says_not_installed_and_how_to_install(monkeypatch, model):
    from lablib.engines.doctor import check_engine

    class Missing(OnnxRuntimeGenAIEngine):
        requires = "onnxruntime_genai_not_here"

    monkeypatch.setitem(ENGINES, NAME, Missing)
    with pytest.raises(EngineUnavailable, match="not installed.*onnxruntime_genai_not_here.*pip install"):
        load_engine("ort", model)
    r = check_engine(NAME)
    assert not r["usable"] and r["detail"].startswith("not installed") and Missing.install_hint in r["detail"]


def test_a_failing_build_names_the_command(monkeypatch, tmp_path, model):
    monkeypatch.setenv("LABLIB_HOME", str(tmp_path / "home"))
    broken = tmp_path / "hf"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # no weights, no model type: the builder fails
    with pytest.raises(LabError, match=r"building the ONNX model failed .*onnxruntime_genai\.models\.builder -i ") as e:
        onnx_folder(replace(model, hf_path=str(broken)), "fp32", log=lambda *_: None)
    # no half-built model is left (its .tmp folder went too); the builder's log is kept where the message says
    left = [p for p in (tmp_path / "home" / "onnx").iterdir() if not p.name.endswith(".lock")]
    assert [p.name for p in left] == [f"{left[0].name.removesuffix('.build.log')}.build.log"]
    assert f"Last lines of its output ({left[0]}): " in str(e.value) and left[0].stat().st_size > 0


def test_a_context_beyond_the_models_is_capped_and_refused_before_work(model):
    """The builder's model holds genai_config.json's context_length (8192 for SmolLM2) and ORT
    GenAI refuses a longer generator (a RuntimeError mid-request): n_ctx is capped there, so a
    request past it is a ContextOverflowError before any work."""
    from lablib.errors import ContextOverflowError

    e = load_engine(NAME, model, n_ctx=9000)
    try:
        assert e.n_ctx == e.info().n_ctx == 8192
        with pytest.raises(ContextOverflowError, match="8190 \\+ output 8 = 8198 tokens, but the context holds 8192"):
            e.generate([1] * 8190, GenerationConfig(max_new_tokens=8))
    finally:
        e.close()


# A lab process that loads onnxruntime-genai into a fresh lab home (argv[1]) after resolving the
# default model in the usual one: its load starts the model builder, a grandchild of the test.
_LOADER = """\
import os, sys
from lablib.engines import load_engine
from lablib.model.resolve import prepare

model = prepare(log=lambda *_: None)
os.environ["LABLIB_HOME"] = sys.argv[1]
load_engine("onnxruntime-genai", model, n_ctx=256)
"""


def test_a_killed_loader_takes_its_builder_with_it(monkeypatch, tmp_path, model, ort, first_token_flip):
    """kill -9 of the process that loads the engine, mid-build: the builder (its child) dies too
    (Linux: PR_SET_PDEATHSIG) instead of writing on into <folder>.tmp; the next load rebuilds the
    half-written folder and generates the ids a normal load does."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    if not sys.platform.startswith("linux"):
        pytest.fail(f"this test checks a Linux guarantee (prctl PR_SET_PDEATHSIG); platform is {sys.platform}")
    home = tmp_path / "home"
    loader = subprocess.Popen([sys.executable, "-c", _LOADER, str(home)], stdin=subprocess.DEVNULL)
    try:
        builder, deadline = None, time.monotonic() + 300  # liveness bounds, not timings
        while builder is None:
            assert loader.poll() is None, f"the loader exited ({loader.returncode}) before its builder appeared"
            assert time.monotonic() < deadline, "no model builder appeared under the loader within 300 s"
            for p in psutil.Process(loader.pid).children():
                try:  # mid-build: the builder module's native library is mapped, so the guard has run
                    if any("onnxruntime_genai" in m.path for m in p.memory_maps()) and str(home) in " ".join(
                        p.cmdline()
                    ):
                        builder = p
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.2)
        tmp = [d for d in (home / "onnx").iterdir() if d.name.endswith(".tmp")]
        assert len(tmp) == 1 and not (tmp[0] / BUILD_RECORD).exists()  # the build is under way
        os.kill(loader.pid, signal.SIGKILL)
        t0 = time.monotonic()
        loader.wait()
        died_s = wait_gone(builder, t0)
        print(f"builder pid {builder.pid} gone {died_s:.3f} s after kill -9 of its loader")
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.wait()
    # killed mid-build: none of the builder's outputs (an orphan writes them all when it finishes;
    # measured here without the guard: gone 8 s after the kill, the files written)
    left = {f.name for f in tmp[0].iterdir()}
    assert left.isdisjoint({"model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json"}), left
    monkeypatch.setenv("LABLIB_HOME", str(home))
    e = load_engine(NAME, model, n_ctx=256)
    try:
        assert e.folder == tmp[0].with_name(tmp[0].name.rsplit(".", 2)[0]) and (e.folder / BUILD_RECORD).is_file()
        assert not tmp[0].exists() and e.folder != ort.folder
        ids = first_token_flip["prompt_token_ids"]
        cfg = GenerationConfig(max_new_tokens=8)
        assert e.generate(ids, cfg).token_ids == ort.generate(ids, cfg).token_ids
    finally:
        e.close()


def test_a_builder_whose_parent_died_before_the_guard_exits_at_once(tmp_path):
    """The guard's other half: a builder whose parent is not the process named (it died between
    the fork and the prctl, so no signal will come) exits before building anything."""
    import os
    import subprocess
    import sys

    from lablib.children import tied
    from lablib.engines.ortgenai import builder_command

    if not sys.platform.startswith("linux"):
        pytest.fail(f"this test checks a Linux guarantee (prctl PR_SET_PDEATHSIG); platform is {sys.platform}")
    cmd = tied(builder_command(tmp_path / "hf", tmp_path / "out", "fp32", tmp_path / "cache"), os.getppid())
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert p.returncode == 1, p.stderr
    assert f"the process that started this command (pid {os.getppid()}) has exited; not running {sys.executable}" in (
        p.stderr
    )
    assert not (tmp_path / "out").exists()
