"""llama.cpp through llama-cpp-python: GGUF models, quantized CPU kernels.

The ``Llama`` object loads the model, owns the context and the tokenizer; the
generation loop is llama.cpp's own C API (``llama_decode`` on a batch, a
``llama_sampler`` chain), so each token id gets its timestamp the moment the
sampler returns it, with no Python text processing in between. The KV cache
is cleared before every request (``llama_memory_clear``): ``Llama.generate``
would otherwise reuse the longest common prefix of the previous prompt and
show a near-zero prefill (../shared/cases, "cached prefill").

The context is sized explicitly (``n_ctx``, default: the model's trained
context), not llama-cpp-python's default of 512 tokens.
"""
from __future__ import annotations

from ..errors import EngineUnavailable, LabError
from ..trace import RequestTrace
from .base import Engine, EngineInfo, GenerationConfig, default_threads


class LlamaCppEngine(Engine):
    """llama.cpp engine.

    ``n_ctx``: context window in tokens (default: the model's trained context).
    ``threads``: CPU threads for decode and prefill (default: physical cores).
    ``n_batch``: prompt tokens per ``llama_decode`` call in prefill (default 512).
    ``n_seq_max``: parallel sequences the context holds (for batched decode).
    """

    name = "llama.cpp"

    def __init__(self, model, n_ctx: int | None = None, threads: int | None = None,
                 n_batch: int = 512, n_seq_max: int = 1, verbose: bool = False):
        super().__init__(model)
        try:
            import llama_cpp
            from llama_cpp import Llama
        except ImportError as e:  # pragma: no cover - reported by doctor
            raise EngineUnavailable(f"llama-cpp-python cannot be imported ({e}); run `make setup`") from e
        self._lib = llama_cpp
        path = model.path_for("gguf", self.name)
        self.threads = threads or default_threads()
        trained = model.max_position_embeddings or 4096
        self._n_ctx_req = int(n_ctx or trained)
        if self._n_ctx_req < 1:
            raise LabError(f"n_ctx={n_ctx}: expected a positive number of tokens")
        self.n_batch = int(n_batch)
        self.llm = Llama(model_path=path, n_ctx=self._n_ctx_req, n_batch=self.n_batch,
                         n_ubatch=self.n_batch, n_threads=self.threads,
                         n_threads_batch=self.threads, n_seq_max=n_seq_max,
                         kv_unified=True, verbose=verbose)
        self.ctx = self.llm._ctx.ctx
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm._model.model)
        self._batch = llama_cpp.llama_batch_init(max(self.n_batch, n_seq_max), 0, max(1, n_seq_max))
        self.n_ctx = llama_cpp.llama_n_ctx(self.ctx)
        self._eos = {t for t in range(self.llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(self.vocab, t)}

    # --- tokenizer -------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=True)

    def detokenize(self, ids: list[int]) -> str:
        return self.llm.detokenize(list(ids), special=True).decode("utf-8", errors="replace")

    def chat_template(self) -> str:
        """The chat template embedded in the GGUF (``tokenizer.chat_template``)."""
        tmpl = self.llm.metadata.get("tokenizer.chat_template")
        if not tmpl:
            raise LabError(f"{self.model.source} has no chat template in its GGUF metadata")
        return tmpl

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        bos = self.llm.detokenize([self.llm.token_bos()], special=True).decode(errors="replace")
        eos = self.llm.detokenize([self.llm.token_eos()], special=True).decode(errors="replace")
        fmt = Jinja2ChatFormatter(self.chat_template(), eos_token=eos, bos_token=bos,
                                  add_generation_prompt=add_generation_prompt)
        text = fmt(messages=messages).prompt
        return self.tokenize(text, add_special=False)

    @property
    def eos_ids(self) -> set[int]:
        """End-of-generation ids as llama.cpp's vocabulary marks them."""
        return self._eos

    # --- description -------------------------------------------------------
    def info(self) -> EngineInfo:
        sysinfo = self._lib.llama_print_system_info().decode(errors="replace")
        return EngineInfo(
            name=self.name, version=self._lib.__version__, backend="cpu (ggml)",
            dtype=self.model.quantization or "gguf", threads=self.threads,
            n_ctx=self.n_ctx,
            flags={"n_batch": self.n_batch, "n_seq_max": self._lib.llama_n_seq_max(self.ctx),
                   "system_info": sysinfo.strip()})

    # --- generation -------------------------------------------------------
    def _sampler(self, cfg: GenerationConfig):
        lib = self._lib
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if cfg.greedy:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        else:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(cfg.top_p, 1))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(cfg.temperature))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(cfg.seed))
        return chain

    def _fill(self, tokens, pos0: int, seq: int = 0, logits_last: bool = True) -> None:
        b = self._batch
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 0
        if logits_last:
            b.logits[len(tokens) - 1] = 1
        b.n_tokens = len(tokens)

    def _decode(self) -> None:
        rc = self._lib.llama_decode(self.ctx, self._batch)
        if rc != 0:
            raise LabError(f"llama_decode failed with code {rc} (1: no KV slot for the batch; "
                           "raise n_ctx or lower the prompt)")

    def clear_kv_cache(self) -> None:
        """Forget every sequence in the KV cache (no reuse across requests)."""
        self._lib.llama_memory_clear(self._lib.llama_get_memory(self.ctx), True)
        self.llm.n_tokens = 0  # keep the high-level object's prefix bookkeeping honest

    def _generate(self, ids, cfg: GenerationConfig, trace: RequestTrace) -> None:
        lib = self._lib
        smpl = self._sampler(cfg)
        eos = self.eos_ids
        try:
            self.clear_kv_cache()
            lib.llama_perf_context_reset(self.ctx)
            trace.start()
            for at in range(0, len(ids), self.n_batch):  # prefill, n_batch tokens per call
                chunk = ids[at:at + self.n_batch]
                self._fill(chunk, at, logits_last=at + len(chunk) == len(ids))
                self._decode()
            pos = len(ids)
            while True:
                tok = lib.llama_sampler_sample(smpl, self.ctx, -1)
                trace.token(tok)
                if not cfg.ignore_eos and tok in eos:
                    trace.finish_reason = "stop"
                    break
                if trace.output_tokens >= cfg.max_new_tokens:
                    trace.finish_reason = "length"
                    break
                self._fill([tok], pos)
                self._decode()
                pos += 1
        finally:
            lib.llama_sampler_free(smpl)

    def engine_counters(self) -> dict:
        """llama.cpp's own perf counters for the last request (since the reset):
        prompt tokens evaluated and their ms, decoded tokens and their ms."""
        d = self._lib.llama_perf_context(self.ctx)
        return {"n_p_eval": d.n_p_eval, "t_p_eval_ms": d.t_p_eval_ms,
                "n_eval": d.n_eval, "t_eval_ms": d.t_eval_ms}

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "llm", None) is not None:
            self.llm.close()
            self.llm = None

