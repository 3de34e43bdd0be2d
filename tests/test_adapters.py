"""LoRA adapters in the in-process engines (lab 11): transformers (PEFT), llama.cpp (a GGUF LoRA), mlx (mlx-lm).

Real engines on the real model, the lab's rank-8 adapter (lablib.model.adapters), a short chat prompt and greedy
outputs of N_OUT tokens (EOS ignored). Agreement is judged as lablib.studies.compare judges engines: the same greedy
ids, or a first difference where the reference's top-2 margin is under NEAR_TIE_NATS; teacher-forced logits within
its mean-KL bound KL_OK."""

import dataclasses
import subprocess
import sys

import pytest

from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
from lablib.errors import LabError
from lablib.measure.workload import DEFAULT_MESSAGES
from lablib.studies.compare import KL_OK, NEAR_TIE_NATS, check_generation, check_logits, first_difference
from lablib.studies.logits import last_logits, log_softmax

ENGINES = ("transformers", "llama.cpp", "mlx")
BASE_FIXTURE = {"transformers": "hf", "llama.cpp": "llama", "mlx": "mlx"}  # tests/conftest.py's session engines
N_OUT = 16  # greedy output tokens per request
N_CTX = 512
CFG = GenerationConfig(max_new_tokens=N_OUT)


@pytest.fixture(scope="module")
def adapter(model):
    from lablib.model.adapters import make_adapter

    return make_adapter(model, rank=8, forms=("peft", "gguf", "mlx"), log=lambda *_: None)


@pytest.fixture(scope="module")
def engines(model, adapter):
    """Adapter engines by (engine, merged), loaded on first use and closed at the end of the module."""
    held = {}

    def get(name: str, merged: bool = False):
        if (name, merged) not in held:
            held[name, merged] = load_engine(name, model, n_ctx=N_CTX, adapter=adapter, merge_adapter=merged)
        return held[name, merged]

    yield get
    for e in held.values():
        e.close()


@pytest.fixture(scope="module")
def prompt(hf):
    return hf.apply_chat_template(DEFAULT_MESSAGES)


@pytest.fixture(scope="module")
def peft_out(engines, prompt):
    """transformers + PEFT's greedy output: the reference of every logit comparison."""
    return engines("transformers").generate(prompt, CFG).token_ids


def same_or_near_tie(reference, ids: list[int], expected: list[int], got: list[int]) -> tuple[int | None, float]:
    """(first position where ``got`` departs from ``expected``, ``reference``'s top-2 log-prob margin there, nats;
    0.0 when they agree): compare's generation check, for outputs the test already has."""
    pos = first_difference(expected, got)
    if pos is None:
        return None, 0.0
    lp = log_softmax(last_logits(reference, list(ids) + list(expected[:pos])))
    top2 = sorted(lp, reverse=True)[:2]
    return pos, float(top2[0] - top2[1])


@pytest.mark.parametrize("name", ENGINES)
def test_unmerged_adapter_changes_the_greedy_ids(request, name, engines, adapter, prompt):
    base = request.getfixturevalue(BASE_FIXTURE[name])
    e = engines(name)
    assert e.adapter is adapter and e.adapter_merged is False
    assert 0 < e.adapter_load_s < 30
    assert e.adapter_bytes == 4 * adapter.parameters  # A and B of every target, float32 in each engine
    flags = e.info().flags
    assert (flags["adapter"], flags["adapter_rank"], flags["adapter_merged"]) == ("r8", 8, False)
    assert "adapter" not in base.info().flags and base.adapter is None and base.adapter_bytes == 0
    plain, tuned = base.generate(prompt, CFG).token_ids, e.generate(prompt, CFG).token_ids
    assert plain != tuned, f"{name}: the adapter left the greedy ids as they were"


@pytest.mark.parametrize("name", ENGINES)
def test_merged_and_unmerged_agree_up_to_a_near_tie(name, engines, prompt):
    unmerged, merged = engines(name), engines(name, merged=True)
    assert merged.adapter_merged is True and merged.adapter_load_s is None
    assert merged.info().flags["adapter_merged"] is True
    # llama-export-lora writes the merged tensors F16 (the base's are Q4_1): more bytes; PEFT and mlx-lm keep float32
    assert merged.adapter_bytes > 0 if name == "llama.cpp" else merged.adapter_bytes == 0
    c = check_generation({"unmerged": unmerged, "merged": merged}, "unmerged", prompt, N_OUT)
    assert c.ok or c.details["margin_ref"] < NEAR_TIE_NATS, c.verdict


@pytest.mark.parametrize("name", ENGINES)
def test_adapter_logits_agree_with_transformers_and_peft(name, engines, prompt, peft_out):
    """Teacher-forced on the prompt and PEFT's own greedy output: each engine's adapter, unmerged and merged (for
    transformers: merged only, unmerged is the reference), within compare's mean-KL bound of transformers + PEFT."""
    ids = list(prompt) + list(peft_out)
    loaded = {f"{name} merged": engines(name, merged=True)}
    if name != "transformers":
        loaded[f"{name} unmerged"] = engines(name)
    c = check_logits({"transformers+peft": engines("transformers"), **loaded}, "transformers+peft", ids)
    print(c.table[["engine", "mean_kl", "max_abs_dlogp", "argmax_agreement"]].to_string())
    assert c.ok, c.verdict
    assert (c.table["mean_kl"] < KL_OK).all()


@pytest.mark.parametrize("name", ENGINES)
def test_batched_mode_runs_the_adapter(request, name, model, adapter, engines, prompt):
    """Two requests decoded together (each engine's own continuous batching) give the unmerged adapter's serial
    greedy ids, up to a near tie, not the base model's."""
    from lablib.measure.closed_loop import run_closed_loop

    serial = engines(name)
    prompts = [prompt, prompt[:-3]]
    want = [serial.generate(p, CFG).token_ids for p in prompts]
    e = serial
    if name == "llama.cpp":  # one KV sequence per request in flight
        e = load_engine(name, model, n_ctx=2 * N_CTX, n_seq_max=2, adapter=adapter)
    try:
        run = run_closed_loop(e, prompts, 2, "batched", CFG)
    finally:
        if e is not serial:
            e.close()
    assert run.stats.max_sequences_per_step == 2
    for p, w, tr in zip(prompts, want, run.traces):
        pos, margin = same_or_near_tie(serial, p, w, tr.token_ids)
        assert pos is None or margin < NEAR_TIE_NATS, (name, pos, margin, w, tr.token_ids)
    base = request.getfixturevalue(BASE_FIXTURE[name])
    assert run.traces[0].token_ids != base.generate(prompt, CFG).token_ids


def test_a_request_for_another_adapter_is_refused(engines, hf, prompt):
    e = engines("transformers")
    assert e.generate(prompt, GenerationConfig(max_new_tokens=1, adapter="r8")).output_tokens == 1
    with pytest.raises(LabError, match=r"request for adapter 'r64', but engine transformers carries adapter r8"):
        e.generate(prompt, GenerationConfig(max_new_tokens=1, adapter="r64"))
    with pytest.raises(LabError, match="carries adapter r8"):
        e.batch_session(GenerationConfig(max_new_tokens=1, adapter="r64"), 2, 64)
    with pytest.raises(LabError, match="was loaded without an adapter"):
        hf.generate(prompt, GenerationConfig(max_new_tokens=1, adapter="r8"))


@pytest.mark.parametrize("name", ENGINES)
def test_an_adapter_of_another_model_is_refused_before_loading(name, model, adapter):
    other = dataclasses.replace(adapter, model_sha256="0" * 64, model_name="another model")
    for merged in (False, True):
        with pytest.raises(LabError) as e:
            load_engine(name, model, adapter=other, merge_adapter=merged)
        msg = str(e.value)
        assert msg.startswith("adapter r8 was made for another model (sha256 000000000000)"), msg
        assert "expected an adapter of the same base model" in msg


def test_engines_without_adapters_refuse_one(model, adapter):
    for name in ("openvino", "onnxruntime-genai"):
        with pytest.raises(LabError) as e:
            load_engine(name, model, adapter=adapter)
        msg = str(e.value)
        assert msg.startswith(f"engine {name} takes no LoRA adapter"), msg
        assert "the engines that do: transformers, llama.cpp, mlx" in msg
    with pytest.raises(LabError, match="merge_adapter=True without adapter="):
        load_engine("transformers", model, merge_adapter=True)
    with pytest.raises(LabError, match="expected a LoRA adapter made by lablib.model.adapters.make_adapter"):
        load_engine("mlx", model, adapter="r8")


def test_import_lablib_stays_light():
    code = (
        "import sys, lablib, lablib.engines, lablib.model.adapters; "
        "print(sorted(m for m in ('torch', 'peft', 'mlx', 'llama_cpp') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
