"""LoRA adapters on the servers the lab starts (lab 11, multi-LoRA serving): llama-server and vLLM started with two
adapters of the lab's model (r8 and r8-s1, lablib.model.adapters), one adapter per request
(GenerationConfig.adapter), against the same adapter in process (llama.cpp with its GGUF LoRA; transformers with
PEFT). Real servers on the real model, small budgets: 16 greedy tokens, fixed length.

The llama-server tests are this file's own xdist group; the vLLM test is in the "vllm" group (conftest.py), so no
two vLLMs start at once (this file sorts first in that group: its vLLM is stopped before the session's starts).
"""

import dataclasses

import pytest

from lablib.engines.base import GenerationConfig
from lablib.engines.servers import start_server
from lablib.errors import LabError
from lablib.measure.load import run_load
from lablib.studies.compare import NEAR_TIE_NATS, first_difference
from lablib.studies.logits import log_softmax

pytestmark = pytest.mark.engine

N = 16  # greedy tokens per request, fixed length
QUESTION = "The three primary colors of light are"


@pytest.fixture(scope="module")
def adapters(model):
    from lablib.model.adapters import make_adapter

    return [make_adapter(model, rank=8, seed=0), make_adapter(model, rank=8, seed=1)]  # r8, r8-s1


def _ids(engine, adapter=None, ids=None) -> list[int]:
    ids = ids or engine.tokenize(QUESTION)
    return engine.generate(ids, GenerationConfig(max_new_tokens=N, adapter=adapter)).token_ids


def _same_or_near_tie(got: list[int], want: list[int], logits_of) -> None:
    """``got`` equals ``want``, or at their first difference both tokens are within NEAR_TIE_NATS of each other in
    the reference's own log-probs there (``logits_of(prefix)``: the next-token logits after the prompt and
    ``got[:k]``): the same computation, two orders of additions."""
    k = first_difference(got, want)
    if k is None:
        return
    logp = log_softmax(logits_of(got[:k]))
    gap = abs(float(logp[got[k]] - logp[want[k]]))
    assert gap < NEAR_TIE_NATS, f"first difference at {k}: {got[k]} vs {want[k]}, {gap:.3f} nats apart ({got}, {want})"


def test_servers_refuse_adapters_they_cannot_serve(model, adapters):
    """One LabError before anything is built or started: a server without adapter support, an adapter of another
    model, a rank above vLLM's largest --max-lora-rank (512), a name twice, something not an Adapter."""
    from lablib.engines.servers import server_command

    r8 = adapters[0]
    for name in ("llama-cpp-python", "mlx", "transformers"):
        with pytest.raises(LabError, match="serves no LoRA adapters"):
            start_server(name, model, options={"adapters": [r8]})
    other = dataclasses.replace(r8, model_sha256="0" * 64, model_name="another model")
    with pytest.raises(LabError, match="was made for another model"):
        server_command("llama-server", model, 8080, options={"adapters": [other]})
    with pytest.raises(LabError, match="rank 1024, above the 512 vllm takes"):
        server_command("vllm", model, 8080, options={"adapters": [dataclasses.replace(r8, rank=1024)]})
    with pytest.raises(LabError, match="more than once"):
        server_command("llama-server", model, 8080, options={"adapters": [r8, r8]})
    with pytest.raises(LabError, match="expected a list of Adapters"):
        server_command("llama-server", model, 8080, options={"adapters": r8})


# --- llama-server -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lora_server(model, adapters):
    srv = start_server("llama-server", model, parallel=2, threads=1, n_ctx=512, options={"adapters": adapters})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def server_ids(lora_server, model):
    """Greedy ids of the question on the llama-server, per adapter (None: the base model), one request at a time."""
    e = lora_server.engine(model)
    try:
        return {a: _ids(e, a) for a in (None, "r8", "r8-s1")}
    finally:
        e.close()


def test_llama_server_runs_the_adapter_each_request_names(lora_server, server_ids, model, adapters, llama):
    """--lora per adapter, all at scale 0 (--lora-init-without-apply); each request's "lora" list sets its own:
    the base model without one (the in-process engine's ids), each adapter's ids those of llama.cpp in process with
    that GGUF LoRA (or the first difference a near tie there)."""
    from lablib.engines import load_engine

    s = lora_server.settings
    assert s["adapters"] == [{"name": "r8", "rank": 8}, {"name": "r8-s1", "rank": 8}]
    assert "--lora-init-without-apply" in lora_server.argv and lora_server.argv.count("--lora") == 2
    base, r8, r8s1 = server_ids[None], server_ids["r8"], server_ids["r8-s1"]
    assert len({tuple(base), tuple(r8), tuple(r8s1)}) == 3, server_ids  # each adapter changes the output
    assert base == _ids(llama)
    for ad in adapters:
        e = load_engine("llama.cpp", model, adapter=ad, n_ctx=512, threads=1)
        try:
            ids = e.tokenize(QUESTION)
            _same_or_near_tie(
                server_ids[ad.name], _ids(e, ad.name), lambda more, e=e, ids=ids: e.logits(ids + more)[-1]
            )
        finally:
            e.close()
    # a llama-server the lab did not start (no settings): its adapters from GET /lora-adapters, named by folder
    plain = load_engine("http", model, base_url=lora_server.base_url, server_settings={})
    try:
        assert plain.adapters == {"r8": 0, "r8-s1": 1}
        assert _ids(plain, "r8") == r8
    finally:
        plain.close()


def test_an_adapter_the_server_does_not_serve_is_refused_before_sending(lora_server, model):
    e = lora_server.engine(model)
    rows = []
    try:
        with pytest.raises(LabError, match="serves the adapters r8, r8-s1"):
            e.generate(e.tokenize(QUESTION), GenerationConfig(max_new_tokens=2, adapter="r64"))
        with pytest.raises(LabError, match="r64"):  # checked for every prompt before the first request
            run_load(e, [[1, 2, 3]] * 2, concurrency=2, adapters=["r8", "r64"], on_row=rows.append)
        with pytest.raises(LabError, match="one adapter name"):
            run_load(e, [[1, 2, 3]] * 2, concurrency=2, adapters=["r8"])
    finally:
        e.close()
    assert rows == []


def test_a_closed_loop_with_an_adapter_per_request(lora_server, server_ids, model):
    """run_load(adapters=[...]): one adapter (or None) per prompt; every row says its request's adapter. Two clients,
    each in flight with another adapter: llama-server never puts them in one decode step (a slot batches only with
    slots whose lora list equals its own), so each request computes as it did alone: the same ids."""
    e = lora_server.engine(model)
    names = ["r8", "r8-s1", None, "r8"]
    try:
        ids = e.tokenize(QUESTION)
        rows = run_load(
            e, [ids] * 4, concurrency=2, adapters=names, cfg=GenerationConfig(max_new_tokens=N), max_duration_s=120
        )
    finally:
        e.close()
    assert not any(r["error"] for r in rows)
    assert sorted(r["request_index"] for r in rows) == [0, 1, 2, 3]
    for r in rows:
        assert r["adapter"] == names[r["request_index"]]
        assert r["token_ids"] == server_ids[r["adapter"]], r["adapter"]


# --- vLLM -----------------------------------------------------------------------------------------------------------
def _base_logits(model):
    """transformers in float32 on the HF folder vLLM serves, no adapter: the next-token logits of a prefix."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model.path_for("hf", "a test"), dtype=torch.float32).eval()

    def logits(ids):
        with torch.no_grad():
            return m(torch.tensor([list(ids)])).logits[0].numpy()

    return logits


def _peft(model, adapter):
    """transformers + PEFT in float32 on the HF folder vLLM serves, with ``adapter``: (greedy ids, logits)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model.path_for("hf", "a test"), dtype=torch.float32)
    m = PeftModel.from_pretrained(base, adapter.path_for("peft")).eval()

    def logits(ids):
        with torch.no_grad():
            return m(torch.tensor([list(ids)])).logits[0].numpy()

    def greedy(ids, n):  # argmax n times, EOS not special (fixed length)
        out = list(ids)
        for _ in range(n):
            out.append(int(logits(out)[-1].argmax()))
        return out[len(ids) :]

    return greedy, logits


@pytest.mark.xdist_group("vllm")
def test_vllm_serves_each_request_its_adapter(model, adapters, hf):
    """vLLM started with --enable-lora and both adapters (--lora-modules; --max-loras 3 on the CPU build: one slot
    always empty, see lablib.engines.servers.vllm.vllm_lora_args): a request's "model" names its adapter. The
    adapter's ids equal transformers + PEFT's (float32; bfloat16: each vLLM token within a near tie of PEFT's top-1);
    a base request beside an adapter's in one step keeps the base model's ids (vLLM's CPU LoRA ops took the last
    slot's adapter for it when every slot held one), up to a near tie in bfloat16."""
    import asyncio

    srv = start_server("vllm", model, parallel=2, n_ctx=512, options={"adapters": adapters}, log=print)
    try:
        s = srv.settings
        print(f"vLLM with 2 adapters started in {s['startup_s']} s")
        assert s["adapters"] == [{"name": "r8", "rank": 8}, {"name": "r8-s1", "rank": 8}]
        assert (s["max_lora_rank"], s["max_loras"], s["max_cpu_loras"]) == (8, 3, 3) and "--enable-lora" in srv.argv
        e = srv.engine(model)
        try:
            assert e.adapters == {"r8": 0, "r8-s1": 1} and e.server_info["adapters"] == ["r8", "r8-s1"]
            ids = e.tokenize(QUESTION)
            got = {a: _ids(e, a, ids) for a in (None, "r8", "r8-s1")}
            assert len({tuple(v) for v in got.values()}) == 3, got
            base = _ids(hf, None, ids)  # the base model: the in-process twin's ids (float32)
            if s["dtype"] == "float32":
                assert got[None] == base
            else:  # bfloat16 (a CPU with AVX512-BF16 or AMX): a near tie may flip, as for the adapters below
                _same_or_near_tie(got[None], base, lambda more: _base_logits(model)(ids + more)[-1])

            async def together(names):
                return await asyncio.gather(
                    *[e.agenerate(ids, GenerationConfig(max_new_tokens=N, adapter=a)) for a in names]
                )

            by_name = {ad.name: ad for ad in adapters}

            def reference(a):  # float32 next-token logits of request a's own model: the base, or base + adapter
                return _base_logits(model) if a is None else _peft(model, by_name[a])[1]

            for pair in (("r8", None), (None, "r8-s1")):  # both adapters loaded by now: every adapter slot in use
                for a, t in zip(pair, e.run(together(pair))):
                    if s["dtype"] == "float32":
                        assert t.token_ids == got[a], (pair, a)
                    else:  # bfloat16: a step of two sequences adds in another order than a step of one, and a near
                        # tie may flip (base beside r8-s1 on the Xeon with AMX: token 4, once in two runs); a base
                        # request given an adapter's weights differs by more than a near tie
                        _same_or_near_tie(t.token_ids, got[a], lambda more, f=reference(a): f(ids + more)[-1])
            with pytest.raises(LabError, match="serves the adapters r8, r8-s1"):
                _ids(e, "r64", ids)
        finally:
            e.close()
        for ad in adapters:
            greedy, logits = _peft(model, ad)
            want = greedy(ids, N)
            if s["dtype"] == "float32":  # the same weights in the same type: exact
                assert got[ad.name] == want, (ad.name, got[ad.name], want)
            else:  # bfloat16's 8-bit mantissa may flip a near tie (as tests/test_vllm.py allows)
                _same_or_near_tie(got[ad.name], want, lambda more, f=logits: f(ids + more)[-1])
    finally:
        srv.stop()
    assert srv.group_alive() == []
