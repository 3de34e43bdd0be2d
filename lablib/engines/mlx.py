"""Apple MLX through mlx-lm: MLX folders, Metal on macOS, the CPU backend on Linux.

Generation is mlx-lm's own ``generate_step`` (a fresh prompt cache per call):
it yields each token id as an int once computed, and the lab stamps it there.
``generate_step`` does not stop at EOS, so fixed-length runs are exact; the
lab stops at EOS itself when asked to. MLX's Linux CPU backend is slow (a few
tokens/s on a 135M model in float32 on two cores): expected, it is built for
Apple silicon.

mlx-lm has no hard context limit; the lab enforces the trained context. The
config is read with keys that moved between transformers versions lifted back
to where mlx-lm looks (``lablib.models.normalize_config``): mlx-lm 0.32 reads
``rope_theta`` only at the top level and silently uses 10000 otherwise.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import EngineUnavailable, LabError
from ..trace import RequestTrace
from .base import Engine, EngineInfo, GenerationConfig, default_threads


class MLXEngine(Engine):
    """mlx-lm engine. ``n_ctx``: context the lab enforces (default: trained context).
    ``prefill_step_size``: prompt tokens per forward pass in prefill (mlx-lm default 2048)."""

    name = "mlx"

    def __init__(self, model, n_ctx: int | None = None, threads: int | None = None,
                 prefill_step_size: int = 2048):
        super().__init__(model)
        try:
            import mlx.core as mx
            import mlx_lm
            from mlx_lm import load
        except ImportError as e:  # pragma: no cover - reported by doctor
            raise EngineUnavailable(f"mlx-lm cannot be imported ({e}); install mlx[cpu] and mlx-lm") from e
        from ..models import normalize_config

        self._mx, self._mlx_lm = mx, mlx_lm
        path = model.path_for("mlx", self.name)
        cfg = json.loads((Path(path) / "config.json").read_text())
        self.config_fixes = normalize_config(cfg)  # keys mlx-lm would otherwise misread
        self.mlx_model, self.tok, self.config = load(path, model_config=self.config_fixes or None,
                                                     return_config=True)
        self.threads = threads or default_threads()  # MLX chooses its own CPU threads
        self.prefill_step_size = int(prefill_step_size)
        trained = int(self.config.get("max_position_embeddings") or model.max_position_embeddings or 0)
        self.n_ctx = int(n_ctx or trained)
        if self.n_ctx < 1:
            raise LabError(f"n_ctx={n_ctx}: expected a positive number of tokens")
        self._eos = set(self.tok.eos_token_ids)
        w = next(iter(_leaves(self.mlx_model.parameters())), None)
        self.dtype = str(w.dtype).replace("mlx.core.", "") if w is not None else "?"
        if "quantization" in self.config:
            q = self.config["quantization"]
            self.dtype = f"{q.get('bits')}-bit (group {q.get('group_size')})"

    # --- tokenizer -------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special))

    def detokenize(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        text = self.tok.apply_chat_template(messages, tokenize=False,
                                            add_generation_prompt=add_generation_prompt)
        return self.tokenize(text, add_special=False)

    @property
    def eos_ids(self) -> set[int]:
        return self._eos

    @property
    def rope_theta(self) -> float:
        """The RoPE base the loaded model really uses (mlx-lm's ModelArgs)."""
        return float(getattr(self.mlx_model.args, "rope_theta", float("nan")))

    def info(self) -> EngineInfo:
        mx = self._mx
        return EngineInfo(
            name=self.name, version=self._mlx_lm.__version__,
            backend=f"mlx {mx.__version__} {mx.default_device()}", dtype=self.dtype,
            threads=self.threads, n_ctx=self.n_ctx,
            flags={"prefill_step_size": self.prefill_step_size,
                   "config_fixes": self.config_fixes, "rope_theta": self.rope_theta})

    # --- generation -------------------------------------------------------
    def _sampler(self, cfg: GenerationConfig):
        from mlx_lm.sample_utils import make_sampler

        if cfg.greedy:
            return make_sampler(temp=0.0)
        self._mx.random.seed(cfg.seed)
        return make_sampler(temp=cfg.temperature, top_p=cfg.top_p)

    def _generate(self, ids, cfg: GenerationConfig, trace: RequestTrace) -> None:
        from mlx_lm.generate import generate_step
        from mlx_lm.models.cache import make_prompt_cache

        mx = self._mx
        prompt = mx.array(ids)
        cache = make_prompt_cache(self.mlx_model)  # fresh: no reuse across requests
        trace.start()
        steps = generate_step(prompt, self.mlx_model, max_tokens=cfg.max_new_tokens,
                              sampler=self._sampler(cfg), prompt_cache=cache,
                              prefill_step_size=self.prefill_step_size)
        trace.finish_reason = "length"
        for tok, _logprobs in steps:
            trace.token(tok)
            if not cfg.ignore_eos and tok in self._eos:
                trace.finish_reason = "stop"
                break
        steps.close()

    def logits(self, ids):
        """Teacher-forced logits for ``ids``: float32 numpy array [len(ids), vocab]."""
        import numpy as np

        mx = self._mx
        out = self.mlx_model(mx.array([list(ids)]))
        return np.array(out[0].astype(mx.float32))

    def close(self) -> None:
        self.mlx_model = None


def _leaves(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _leaves(v)
    else:
        yield tree
