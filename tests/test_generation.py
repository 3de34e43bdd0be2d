"""Generation means the same in every engine and mode: the lab's GenerationConfig is all that
applies (../shared/cases, generation_config_leak), and sampling follows one definition
(lablib.engines.sampling.DEFINITION), checked on each engine's real first-token draws."""

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from lablib.engines import sampling
from lablib.engines.base import GenerationConfig
from lablib.measure.closed_loop import run_closed_loop
from lablib.studies.logits import last_logits

CASES = Path(__file__).parent / "data" / "cases"
COUNTING = [33, 28, 216, 34, 28, 216, 35, 28, 216, 33, 28, 216, 34, 28, 216, 35, 28, 216, 33, 28, 216, 34, 28]
COUNTING_TEXT = "1, 2, 3, 1, 2, 3, 1, 2,"
COUNTING_GREEDY = " 3, 1, 2, 3,"  # 12 tokens (digits and spaces are tokens of their own), transformers float32
ANIMAL = [5820, 354, 3161, 42]  # "Name an animal:": a first token of high entropy (151+ tokens in the nucleus)
TEMPERATURE, TOP_P, DRAWS = 0.8, 0.9, 300
BATCH = 32  # concurrent sequences in batched mode


def _with_generation_config(folder, out: Path) -> Path:
    """A copy of model ``folder`` (weights linked) whose generation_config.json is the case's."""
    out.mkdir(parents=True)
    for f in Path(folder).iterdir():
        if f.suffix == ".safetensors":
            (out / f.name).symlink_to(f.resolve())
        elif f.is_file():
            shutil.copy(f, out / f.name)
    shutil.copy(CASES / "generation_config_leak" / "generation_config.json", out / "generation_config.json")
    return out


@pytest.fixture(scope="module")
def llama_batched(model):
    """llama.cpp holding BATCH sequences; one thread (ggml's spinning threads crawl on a shared
    2-core machine, and threads do not change what is sampled)."""
    from lablib.engines import load_engine

    # each sequence gets n_ctx / BATCH KV cells of its own: 64 hold any prompt here plus its output
    e = load_engine("llama.cpp", model, n_ctx=64 * BATCH, n_seq_max=BATCH, threads=1)
    yield e
    e.close()


def _greedy_texts(engine, n: int = 12) -> tuple[str, str]:
    """The greedy text of the counting prompt through generate() and through batched mode."""
    cfg = GenerationConfig(max_new_tokens=n)
    single = engine.detokenize(engine.generate(COUNTING, cfg).token_ids)
    batched = run_closed_loop(engine, [COUNTING, COUNTING], 2, "batched", cfg).traces
    assert batched[0].token_ids == batched[1].token_ids
    return single, engine.detokenize(batched[0].token_ids)


def test_the_counting_prompt_is_the_cases(model):
    from lablib.measure.workload import text_ids

    assert text_ids(model, COUNTING_TEXT) == COUNTING


def test_a_folder_generation_config_changes_nothing_in_transformers(model, hf, tmp_path):
    import torch

    from lablib.engines.hf import TransformersEngine

    leak = TransformersEngine(
        dataclasses.replace(model, hf_path=str(_with_generation_config(model.hf_path, tmp_path / "hf")))
    )
    try:
        assert _greedy_texts(hf) == (COUNTING_GREEDY, COUNTING_GREEDY)
        assert _greedy_texts(leak) == (COUNTING_GREEDY, COUNTING_GREEDY)
        assert "repetition_penalty=1.3 (model folder's generation_config.json)" in leak.info().flags["settings_off"]
        assert not any("repetition_penalty" in s for s in hf.info().flags["settings_off"])
        # the case's file is potent: transformers itself, asked for the folder's penalty, changes the text
        with torch.inference_mode():
            out = leak.hf.generate(
                torch.tensor([COUNTING]),
                max_new_tokens=8,
                do_sample=False,
                repetition_penalty=1.3,
                eos_token_id=[],
                pad_token_id=2,
            )
        assert leak.detokenize(out[0, len(COUNTING) :].tolist()) != COUNTING_GREEDY
    finally:
        leak.close()


def test_a_folder_generation_config_changes_nothing_in_mlx(model, mlx, tmp_path):
    from lablib.engines.mlx import MLXEngine

    leak = MLXEngine(
        dataclasses.replace(model, mlx_path=str(_with_generation_config(model.mlx_path, tmp_path / "mlx")))
    )
    try:
        clean = _greedy_texts(mlx, 4)  # 4 tokens: MLX's CPU backend is slow
        assert clean[0] == clean[1] == " 3, "  # the first 4 tokens of transformers' (float32 weights both)
        assert _greedy_texts(leak, 4) == clean
    finally:
        leak.close()


def test_llama_cpp_greedy_is_the_same_in_both_modes(llama_batched):
    single, batched = _greedy_texts(llama_batched)
    assert single == batched and single.startswith(" 3,")


def test_every_engine_records_the_definition_and_what_it_switched_off(engine):
    flags = engine.info().flags
    assert flags["sampling"] == sampling.DEFINITION
    assert flags["settings_off"] and all(isinstance(s, str) for s in flags["settings_off"])


# --- one meaning for sampling -------------------------------------------------------------------
def test_the_definition_by_hand():
    lg = np.log([0.5, 0.2, 0.15, 0.1, 0.05])
    assert sampling.probabilities(lg, 0.0) == pytest.approx([1, 0, 0, 0, 0])
    assert sampling.probabilities(lg, 1.0) == pytest.approx([0.5, 0.2, 0.15, 0.1, 0.05])
    # top-p 0.7: 0.5 + 0.2 reach 0.7, so the third token (0.7 above it) is out
    assert sampling.probabilities(lg, 1.0, top_p=0.7) == pytest.approx([5 / 7, 2 / 7, 0, 0, 0])
    assert sampling.probabilities(lg, 1.0, top_p=0.71) == pytest.approx([0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0])
    # temperature first: at T = 0.5 the probabilities go as p^2 (0.25, 0.04, ...) and top-p sees those
    sq = np.array([0.25, 0.04, 0.0225, 0.01, 0.0025])
    assert sampling.probabilities(lg, 0.5) == pytest.approx(sq / sq.sum())
    assert sampling.probabilities(lg, 0.5, top_p=0.75) == pytest.approx([1, 0, 0, 0, 0])  # 0.25/0.325 = 0.77
    assert sampling.probabilities(lg, 0.5, top_p=0.8) == pytest.approx([0.25 / 0.29, 0.04 / 0.29, 0, 0, 0])
    # (top-p before the temperature would keep 3 tokens at 0.8: 0.5 + 0.2 < 0.8)
    assert sampling.probabilities(lg, 1.0, top_k=2) == pytest.approx([5 / 7, 2 / 7, 0, 0, 0])
    # top-k before top-p: top-p sees the top-2 renormalized (5/7 < 0.75, so both stay)
    assert sampling.probabilities(lg, 1.0, top_k=2, top_p=0.75) == pytest.approx([5 / 7, 2 / 7, 0, 0, 0])


@pytest.fixture(scope="module")
def hf_animal(hf):
    return last_logits(hf, ANIMAL).astype(np.float64)


def _faults(lg):
    """Distributions a hidden default or another filter order gives, from the same logits."""
    untempered = sampling.probabilities(lg, 1.0, 0, TOP_P) > 0  # top-p before temperature (mlx-lm, old llama chain)
    x = np.where(untempered, lg / TEMPERATURE, -np.inf)
    swapped = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    return {
        "hidden top-k 50": sampling.probabilities(lg, TEMPERATURE, 50, TOP_P),
        "top-p before temperature": swapped,
        "no top-p": sampling.probabilities(lg, TEMPERATURE, 0, 1.0),
        "no temperature": sampling.probabilities(lg, 1.0, 0, TOP_P),
        "temperature twice": sampling.probabilities(lg, TEMPERATURE**2, 0, TOP_P),
    }


def test_the_draw_check_rejects_the_known_faults(hf_animal):
    """The check below can fail: draws (numpy, fixed seed) from each faulty distribution are
    rejected, draws from the right one are not (simulated power at 300 draws: >= 0.99 each)."""
    expected = sampling.probabilities(hf_animal, TEMPERATURE, 0, TOP_P)
    allowed = sampling.probabilities(hf_animal, TEMPERATURE, 0, TOP_P + 0.02) > 0
    rng = np.random.default_rng(11)
    assert sampling.check_draws(rng.choice(expected.size, DRAWS, p=expected), expected, allowed)["ok"]
    for name, q in _faults(hf_animal).items():
        assert not sampling.check_draws(rng.choice(q.size, DRAWS, p=q), expected, allowed)["ok"], name


def _first_tokens(engine, mode: str, cfg: GenerationConfig, n: int) -> list[int]:
    """``n`` first tokens of ANIMAL drawn by ``engine`` in ``mode`` with ``cfg``.

    llama.cpp: ``n`` real requests (generate with seeds 0..n-1, or one batched run).
    transformers: batched, ``n`` real requests through continuous batching; one request,
    ``generate`` itself with the engine's generation config and ``num_return_sequences=n``
    (one prefill, its logits sampled n times: the same merge of settings and warpers as one
    request). MLX (its CPU backend takes seconds per forward pass on a shared 2-core machine):
    the engine's own sampler, the function generate_step and BatchGenerator call, on the
    log-probs of the engine's own prefill, one row at a time (as generate_step) or n rows at
    once (as BatchGenerator); real requests are checked below (test_mlx_requests_...).
    """
    if engine.name == "mlx":
        mx = engine._mx
        logits = engine.mlx_model(mx.array([ANIMAL]))[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, keepdims=True)  # as mlx_lm.generate.generate_step
        sampler = engine._sampler(cfg)
        if mode == "single":
            return [int(sampler(logprobs).item()) for _ in range(n)]
        return [int(t) for t in sampler(mx.repeat(logprobs, n, axis=0)).tolist()]
    if engine.name == "transformers" and mode == "single":
        import torch

        gen = engine._generation_config(cfg)
        gen.num_return_sequences = n
        torch.manual_seed(cfg.seed)
        x = torch.tensor([ANIMAL])
        with torch.inference_mode():
            out = engine.hf.generate(x, attention_mask=torch.ones_like(x), generation_config=gen)
        return out[:, len(ANIMAL)].tolist()
    if mode == "single":  # one request at a time, each with its own seed
        return [engine.generate(ANIMAL, dataclasses.replace(cfg, seed=i)).token_ids[0] for i in range(n)]
    traces = run_closed_loop(engine, [ANIMAL] * n, BATCH, "batched", cfg).traces
    return [t.token_ids[0] for t in traces]


def _engine(name, request):
    return request.getfixturevalue("llama_batched" if name == "llama" else name)


@pytest.mark.parametrize("mode", ["single", "batched"])
@pytest.mark.parametrize("name", ["llama", "hf", "mlx"])
def test_first_token_draws_follow_the_definition(name, mode, request):
    """300 first tokens at temperature 0.8, top-p 0.9 against the distribution the definition
    gives on the engine's *own* logits (so Q4_1 vs float32 rounding is no fault), by Pearson's
    chi-square (lablib.engines.sampling.check_draws): false-alarm rate about 0.1 % per engine and mode
    (the seeds are fixed, so a pass stays a pass); a hidden top-k of 50, top-p before the
    temperature, a missing filter or temperature fail it (test above). Tokens the definition
    cuts may not be drawn at all (a margin of 0.02 in top-p for tokens at the boundary)."""
    engine = _engine(name, request)
    lg = last_logits(engine, ANIMAL).astype(np.float64)
    expected = sampling.probabilities(lg, TEMPERATURE, 0, TOP_P)
    allowed = sampling.probabilities(lg, TEMPERATURE, 0, TOP_P + 0.02) > 0
    cfg = GenerationConfig(max_new_tokens=1, temperature=TEMPERATURE, top_p=TOP_P, seed=5)
    result = sampling.check_draws(_first_tokens(engine, mode, cfg, DRAWS), expected, allowed)
    assert result["ok"], result


@pytest.mark.parametrize("mode", ["single", "batched"])
@pytest.mark.parametrize("name", ["llama", "hf", "mlx"])
def test_top_k_keeps_the_k_most_probable(name, mode, request):
    """top_k 3 at temperature 1.5: only the engine's own 3 most probable first tokens, in the
    definition's proportions (chi-square as above; 60 draws, each token expected >= 5 times)."""
    engine = _engine(name, request)
    lg = last_logits(engine, ANIMAL).astype(np.float64)
    expected = sampling.probabilities(lg, 1.5, 3, 1.0)
    cfg = GenerationConfig(max_new_tokens=1, temperature=1.5, top_k=3, seed=9)
    draws = _first_tokens(engine, mode, cfg, 60)
    assert set(draws) <= set(np.argsort(-lg)[:3].tolist())
    result = sampling.check_draws(draws, expected)
    assert result["ok"] and result["bins"] == 3, result


def test_mlx_requests_draw_inside_the_definitions_support(mlx):
    """Real MLX requests, one at a time and batched, at temperature 0.8 and top-p 0.9: every
    first token is one the definition may draw (few requests: MLX's CPU backend is slow)."""
    lg = last_logits(mlx, ANIMAL).astype(np.float64)
    allowed = sampling.probabilities(lg, TEMPERATURE, 0, TOP_P + 0.02) > 0
    cfg = GenerationConfig(max_new_tokens=1, temperature=TEMPERATURE, top_p=TOP_P)
    single = [mlx.generate(ANIMAL, dataclasses.replace(cfg, seed=i)).token_ids[0] for i in range(4)]
    batched = [t.token_ids[0] for t in run_closed_loop(mlx, [ANIMAL] * 8, 8, "batched", cfg).traces]
    assert all(allowed[t] for t in single + batched), (single, batched)
    assert len(set(batched)) > 1  # one random stream for the batch: the rows draw independently
