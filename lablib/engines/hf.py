"""Hugging Face transformers: safetensors folders, PyTorch kernels, the reference.

Generation is ``model.generate`` itself (the library's own loop, a fresh KV
cache per call) with a streamer that receives token *ids*: each call to
``put`` is one generated token, stamped with the lab's clock at once. A text
streamer would emit words, not tokens, and distort TTFT and ITL
(../shared/cases, "words, not tokens").

transformers has no hard context limit (past its trained length it runs with a
warning); the lab enforces ``max_position_embeddings`` (or ``n_ctx``).
"""
from __future__ import annotations

from ..errors import EngineUnavailable, LabError
from ..trace import RequestTrace
from .base import Engine, EngineInfo, GenerationConfig, default_threads


class _TokenIdStreamer:
    """A transformers streamer (BaseStreamer protocol) that stamps token ids."""

    def __init__(self, trace: RequestTrace):
        self.trace = trace
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:  # generate() first puts the prompt
            self._prompt_seen = True
            return
        for tok in value.reshape(-1).tolist():
            self.trace.token(tok)

    def end(self) -> None:
        pass


class TransformersEngine(Engine):
    """transformers engine.

    ``dtype``: torch dtype name for the weights (default float32, the faithful
    reference). ``threads``: torch intra-op threads (default: physical cores).
    ``n_ctx``: context the lab enforces (default: the model's trained context).
    """

    name = "transformers"

    def __init__(self, model, dtype: str = "float32", threads: int | None = None,
                 n_ctx: int | None = None, attn_implementation: str = "sdpa"):
        super().__init__(model)
        try:
            import torch
            import transformers
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as e:  # pragma: no cover - reported by doctor
            raise EngineUnavailable(f"transformers/torch cannot be imported ({e}); run `make setup`") from e
        self._torch, self._transformers = torch, transformers
        transformers.utils.logging.disable_progress_bar()
        path = model.path_for("hf", self.name)
        self.threads = threads or default_threads()
        torch.set_num_threads(self.threads)
        if not hasattr(torch, dtype):
            raise LabError(f"dtype={dtype!r}: expected a torch dtype name such as float32, bfloat16, float16")
        self.dtype = dtype
        self.tok = AutoTokenizer.from_pretrained(path)
        self.hf = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), attn_implementation=attn_implementation).eval()
        trained = int(getattr(self.hf.config, "max_position_embeddings", 0) or model.max_position_embeddings)
        self.n_ctx = int(n_ctx or trained)
        eos = self.hf.generation_config.eos_token_id
        if eos is None:
            eos = self.hf.config.eos_token_id
        self._eos = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self._pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else next(iter(self._eos), 0)

    # --- tokenizer -------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return list(self.tok(text, add_special_tokens=add_special)["input_ids"])

    def detokenize(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        text = self.tok.apply_chat_template(messages, tokenize=False,
                                            add_generation_prompt=add_generation_prompt)
        return self.tokenize(text, add_special=False)

    @property
    def eos_ids(self) -> set[int]:
        return self._eos

    def info(self) -> EngineInfo:
        torch = self._torch
        return EngineInfo(
            name=self.name, version=self._transformers.__version__,
            backend=f"torch {torch.__version__} cpu", dtype=self.dtype, threads=self.threads,
            n_ctx=self.n_ctx,
            flags={"attn_implementation": self.hf.config._attn_implementation,
                   "torch_threads": torch.get_num_threads()})

    # --- generation -------------------------------------------------------
    def _generate(self, ids, cfg: GenerationConfig, trace: RequestTrace) -> None:
        torch = self._torch
        input_ids = torch.tensor([ids], dtype=torch.long)
        # Explicit, complete settings (nothing inherited from the model's defaults).
        # ignore_eos: an empty EOS list, so EOS is generated like any token and
        # generation goes on (as vLLM's ignore_eos), rather than masked.
        gen = self._transformers.GenerationConfig(
            max_new_tokens=cfg.max_new_tokens, do_sample=not cfg.greedy,
            temperature=None if cfg.greedy else cfg.temperature,
            top_p=None if cfg.greedy else cfg.top_p, top_k=None,
            eos_token_id=[] if cfg.ignore_eos else sorted(self._eos), pad_token_id=self._pad)
        if not cfg.greedy:
            torch.manual_seed(cfg.seed)
        with torch.inference_mode():
            trace.start()
            self.hf.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                             generation_config=gen, streamer=_TokenIdStreamer(trace))
        last = trace.token_ids[-1] if trace.token_ids else None
        trace.finish_reason = "stop" if (not cfg.ignore_eos and last in self._eos) else "length"

    def logits(self, ids) -> "object":
        """Teacher-forced logits for ``ids``: a float32 numpy array [len(ids), vocab]."""
        torch = self._torch
        with torch.inference_mode():
            out = self.hf(torch.tensor([list(ids)], dtype=torch.long))
        return out.logits[0].float().numpy()

    def close(self) -> None:
        self.hf = None
