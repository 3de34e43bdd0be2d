"""Apple MLX through mlx-lm: MLX folders, Metal on macOS, the CPU backend on Linux.

Generation is mlx-lm's own ``generate_step`` (a fresh prompt cache per call):
it yields each token id as an int once computed, and the lab stamps it there.
``generate_step`` does not stop at EOS, so fixed-length runs are exact; the
lab stops at EOS itself when asked to. MLX's Linux CPU backend is slow (about
10 tokens/s decode on a 135M model in float32 on two cores, on OpenBLAS; far
slower on the BLAS its wheel bundles, below): expected, it is built for Apple silicon.

Prefix caching, only when asked (``generate(ids, prefix_cache=...)``, lab 08): a
:class:`~lablib.engines.base.PrefixCache` holds the per-layer key/value arrays of a prefix
(mlx-lm's prompt cache, ``make_prompt_cache``, cut to its offset); each request gets a fresh
prompt cache whose layers start from the first ``n`` positions of them (the first update
concatenates into new arrays, so the kept prefix is never written) and ``generate_step`` is
given only the uncached tokens. The lab counts the prompt positions each forward pass
receives (:meth:`MLXEngine.engine_counters`).

mlx-lm has no hard context limit; the lab enforces the trained context. The
config is read with keys that moved between transformers versions lifted back
to where mlx-lm looks (``lablib.model.formats.normalize_config``): mlx-lm 0.32 reads
``rope_theta`` only at the top level and silently uses 10000 otherwise.

The BLAS (Linux): mlx-cpu's wheel bundles netlib's reference BLAS and LAPACK, unblocked
loops (``mlx_cpu.libs/libblas-*.so``, loaded through libmlx's RPATH), and every float32 matrix
product of the CPU backend is its ``cblas_sgemm``. ``make setup`` links those two names to the
system's OpenBLAS (``python -m lablib.build.mlx --install``; Debian's ``libopenblas0-pthread``),
which only MLX then loads: torch keeps its own MKL. Measured on the 2-core EPYC: prefill of
136 tokens 18.7 s -> 0.78 s, decode 0.18 -> 0.10 s per token, the same greedy ids.
:func:`blas_info` says which library this process's MLX really calls (``info().flags["blas"]``).

Speculative decoding (lab 10), mlx-lm's own: ``load_engine("mlx", model, draft="q8", speculative=k)`` runs
``mlx_lm.generate.speculative_generate_step`` (what ``stream_generate(..., draft_model=, num_draft_tokens=)``
drives) with a draft made here from the same folder, no network (:data:`DRAFTS`): mlx-lm's own quantization
(``mlx_lm.utils.quantize_model``, affine, group 64, 8 or 4 bits) or a cast (bfloat16, float16), or another MLX
folder of the same vocabulary. Each round drafts ``min(k, tokens left)`` tokens one by one on the draft, verifies
them in one target pass of that many + 1 positions and yields the accepted run (``from_draft`` True, the flag
``GenerationResponse.from_draft`` carries) and then one token of the target's own (False), unless the budget ends
inside the run. mlx-lm counts nothing: :meth:`MLXEngine.engine_counters` reads the rounds back from the flags
exactly (:func:`draft_rounds`). Greedy only, without a prefix cache, one sequence (no batched mode).

Batched mode (:meth:`MLXEngine.batch_session`) is mlx-lm's own continuous
batching, ``mlx_lm.generate.BatchGenerator``: each ``next()`` runs one decode
step over every sequence in its generation batch, then prefills newly inserted
prompts (a separate forward pass, right-padded) and moves them into the
generation batch. Decode is pipelined: the step that returns token i has
already queued the computation of token i+1.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING

from lablib.checks import whole
from lablib.engines.base import BatchStats, Engine, EngineInfo, GenerationConfig, PrefixCache, token_ids
from lablib.engines.sampling import DEFINITION
from lablib.errors import LabError
from lablib.machine.threads import default_threads
from lablib.model.formats import normalize_config, rope_scaling_summary, trained_context
from lablib.results.trace import RequestTrace, now

if TYPE_CHECKING:
    import numpy as np

# the drafts mlx-lm makes here of the model's own folder (``draft=``), no network: mlx-lm's affine quantization
# (``mlx_lm.utils.quantize_model``, group 64) of the decoder layers at 8 or 4 bits, the tied embedding and output
# head left float32, or the float32 folder cast to a 16-bit type. On Linux's CPU backend none is cheaper than the
# float32 target (its matrix products are OpenBLAS's sgemm; quantized and 16-bit products are MLX's own loops):
# one decode step of SmolLM2-135M on the 2-core EPYC, interleaved, medians of 12: float32 126 ms, q8 199 ms,
# q4 205 ms, bfloat16 213 ms; quantizing the head too (a 49,152-row quantized product) made q8 539 ms against
# float32's 314 ms in a busier run. q8 is the default: no costlier than the others, and the one whose greedy picks
# follow the target's (whole-model copies on the prose text: q8 16 of 16 tokens, q4 and bfloat16 2 of 16; this q8
# draft has the target accept 12 of its 13 drafts there at k 3).
DRAFTS = {"q8": 8, "q4": 4, "bfloat16": None, "float16": None}
DRAFT_GROUP = 64  # mlx-lm's default group size for affine quantization
DEFAULT_DRAFT = "q8"
MLX_CACHE_STEP = 256  # mlx-lm's KVCache.step: a full-attention layer's cache grows by this many positions


def _steps(positions: int) -> int:
    """``positions`` rounded up to mlx-lm's cache step (:data:`MLX_CACHE_STEP`)."""
    return -(-max(0, positions) // MLX_CACHE_STEP) * MLX_CACHE_STEP


def _prompt_cache_bytes(cache) -> int:
    """Bytes of the key and value arrays an mlx-lm prompt cache holds, as allocated (a ``KVCache`` grows in
    steps of :data:`MLX_CACHE_STEP` positions; a ``RotatingKVCache`` keeps its window)."""
    total = 0
    for c in cache:
        for a in (getattr(c, "keys", None), getattr(c, "values", None)):
            total += int(a.nbytes) if a is not None else 0
    return total


class MLXEngine(Engine):
    """mlx-lm engine. ``n_ctx``: context the lab enforces (default: trained context).
    ``prefill_step_size``: prompt tokens per forward pass in prefill (mlx-lm default 2048).
    ``draft`` (a key of :data:`DRAFTS`, or an MLX folder of the same vocabulary) with ``speculative`` (draft tokens
    a round, default 4): mlx-lm's speculative decoding (the module docstring). ``as_draft`` (a key of
    :data:`DRAFTS`): load the model itself as that draft is made, to time the draft alone (its cost c).
    ``adapter`` (a lablib.model.adapters.Adapter of the model, lab 11): mlx-lm's adapter folder applied unmerged,
    as ``mlx_lm.load(path, adapter_path=)`` does (``load_adapters``: each target ``Linear`` becomes a ``LoRALinear``,
    then ``eval()``), in two steps so that the attach is timed alone; with ``merge_adapter`` the MLX folder of
    mlx-lm's ``fuse`` is loaded instead of the base's."""

    name = "mlx"
    format = "mlx"
    requires = "mlx_lm"
    install_hint = "pip install 'mlx[cpu]' mlx-lm (Linux) or mlx-lm (macOS)"
    kv_bytes_per_value = 4  # float32 models
    prefix_caching = True  # a fresh prompt cache per request, starting from a kept prefix's arrays
    compare_load_kwargs = {"fix_config": False}  # lablib.studies.compare shows what a plain mlx-lm user gets
    speculation_methods = ("draft model",)  # mlx-lm's speculative_generate_step (load with draft=, speculative=k)
    adapter_form = "mlx"  # mlx-lm's adapter folder, mlx_lm.utils.load_adapters (lab 11)
    merged_form = "mlx"  # mlx-lm's fuse, saved as an MLX folder
    # mlx-lm's sampling defaults the lab leaves out (mlx-lm 0.32: sample_utils, generate)
    SETTINGS_OFF = (
        "make_sampler's order (top-p, min-p, XTC, top-k on untempered log-probs, then temperature): "
        "not used, the lab composes mlx-lm's filters as temperature -> top-k -> top-p",
        "logits processors (repetition/presence/frequency penalty, logit bias): none passed",
    )

    @classmethod
    def speculation_kwargs(cls, method: str, k: int, draft=None) -> dict:
        """``draft=`` (default :data:`DEFAULT_DRAFT`, the folder quantized by mlx-lm) with ``speculative=k``."""
        if method == "draft model":
            return {"draft": draft or DEFAULT_DRAFT, "speculative": k}
        return super().speculation_kwargs(method, k, draft)

    @classmethod
    def unsupported(cls, model) -> str | None:
        """mlx-lm loads the ``model_type`` values it has a module for (``mlx_lm.models.<type>``, after its
        ``MODEL_REMAPPING``)."""
        why = super().unsupported(model)
        folder = getattr(model, "mlx_path", None) or getattr(model, "hf_path", None)
        if why or not folder:
            return why
        import importlib.util

        from lablib.model.formats import read_config

        kind = str(read_config(folder).get("model_type", ""))
        try:
            from mlx_lm.utils import MODEL_REMAPPING

            kind = MODEL_REMAPPING.get(kind, kind)
            found = importlib.util.find_spec(f"mlx_lm.models.{kind}") is not None
        except ImportError:
            return None  # mlx-lm not installed: load_engine and doctor say so
        if not found:
            return f"mlx-lm has no model for model_type {kind!r} ({model.name}); run it with transformers or llama.cpp"
        return None

    @classmethod
    def kv_cache_bytes(
        cls, model, context_tokens: int, sequences: int = 1, prompt_tokens: int | None = None, **load
    ) -> int:
        """mlx-lm's prompt cache while decoding at ``context_tokens`` positions (mlx-lm 0.32, models/cache.py): a
        full-attention layer's ``KVCache`` grows in steps of :data:`MLX_CACHE_STEP` positions; a sliding layer's
        ``RotatingKVCache(max_size=window)`` holds its window once the prompt reached it; after a shorter prompt
        (``prompt_tokens``) it holds what the prefill wrote (the prompt but its last token, which ``generate_step``
        feeds with the first sampling step) plus steps of 256 for the positions after it, at most the window
        (``_update_in_place`` grows by min(256, window - offset)); None: the window, the most it holds."""
        from lablib.model.shape import kv_cache_bytes, model_dims

        d = model_dims(model)
        window = d["sliding_window"] or 0
        steps = _steps(context_tokens)
        sliding = window
        prefilled = None if prompt_tokens is None else max(0, prompt_tokens - 1)
        if window and prefilled is not None and prefilled < window:
            sliding = min(window, prefilled + _steps(context_tokens - prefilled))
        return kv_cache_bytes(d, cls.kv_bytes_per_value, max(context_tokens, sliding), sequences, sliding, steps)

    @classmethod
    def kv_cache_note(cls, model, **load) -> str:
        from lablib.model.shape import model_dims

        d = model_dims(model)
        if "sliding" not in d["layer_types"]:
            return ""
        return (
            f"mlx-lm rotates the last {d['sliding_window']} tokens in each sliding-window layer (RotatingKVCache) and "
            f"grows the full-attention layers' cache in steps of {MLX_CACHE_STEP} positions"
        )

    @classmethod
    def draft_alone_kwargs(cls, speculation: dict) -> dict:
        """Load keywords that load the draft of ``speculation`` (:meth:`speculation`) alone, as a plain engine: its
        cost c is its plain TPOT over the target's (lablib.studies.decoding.speculative)."""
        d = speculation.get("draft")
        return {"as_draft": d} if d in DRAFTS else {}

    def __init__(
        self,
        model,
        n_ctx: int | None = None,
        threads: int | None = None,
        prefill_step_size: int = 2048,
        fix_config: bool = True,
        draft: str | None = None,
        speculative: int | None = None,
        as_draft: str | None = None,
        adapter=None,
        merge_adapter: bool = False,
    ):
        super().__init__(model)
        if adapter is not None and as_draft is not None:
            raise LabError(
                f"as_draft={as_draft!r} with adapter=: as_draft times the model made a draft, without an adapter; "
                "load it with one of them"
            )
        for key, v, folder_ok in (("draft", draft, True), ("as_draft", as_draft, False)):  # before any loading
            if v is not None and v not in DRAFTS and not (folder_ok and Path(str(v)).is_dir()):
                raise LabError(
                    f"{key}={v!r}: expected one of {', '.join(DRAFTS)} (the model's folder quantized by mlx-lm, or "
                    "cast)" + (" or an MLX folder of a model with the same vocabulary" if folder_ok else "")
                )
        if speculative is not None and draft is None:
            raise LabError(
                f"speculative={speculative!r} without draft=: expected draft={DEFAULT_DRAFT!r} (or a folder)"
            )
        merged = self._begin_adapter(adapter, merge_adapter)  # checked before any loading
        mx, mlx_lm = self._import_library("mlx.core", "mlx_lm")
        self._mx, self._mlx_lm = mx, mlx_lm
        self._path = path = merged or model.path_for("mlx", self.name)
        cfg = json.loads((Path(path) / "config.json").read_text())
        # keys mlx-lm would otherwise misread; fix_config=False reads the folder as
        # plain mlx-lm does (lablib.studies.compare uses it to show what mlx-lm users see)
        self.config_fixes = normalize_config(cfg) if fix_config else {}
        self.mlx_model, self.tok, self.config = mlx_lm.load(
            path, model_config=self.config_fixes or None, return_config=True
        )
        self.threads = threads or default_threads()  # MLX chooses its own CPU threads
        self.prefill_step_size = int(prefill_step_size)
        self.n_ctx = int(n_ctx or trained_context(self.config) or model.max_position_embeddings or 0)
        if self.n_ctx < 1:
            raise LabError(
                f"{path}: the config names no trained context length (max_position_embeddings, "
                "n_positions...) and no n_ctx was given; pass n_ctx (--n-ctx) to say how many "
                "tokens the lab should allow"
            )
        self._eos = set(self.tok.eos_token_ids)
        self.n_vocab = int(self.mlx_model.args.vocab_size)
        w = next(iter(_leaves(self.mlx_model.parameters())), None)
        self.dtype = str(w.dtype).replace("mlx.core.", "") if w is not None else "?"
        if "quantization" in self.config:
            q = self.config["quantization"]
            self.dtype = f"{q.get('bits')}-bit (group {q.get('group_size')})"
        if as_draft is not None:  # the model itself made as that draft is (timing a draft alone)
            self.mlx_model, self.dtype = self._cheaper(self.mlx_model, as_draft)
        if self.adapter_merged:
            self._count_merged()
        elif self.adapter is not None:
            self._attach_adapter()
        self._spec, self._spec_counts = self._load_speculation(path, draft, speculative), {}

    def _attach_adapter(self) -> None:
        """mlx-lm's ``load_adapters`` on the loaded model (what ``mlx_lm.load(path, adapter_path=)`` runs after
        loading the base), then ``eval()`` as it does; the LoRA arrays evaluated (MLX is lazy) before the clock
        stops (:attr:`adapter_load_s`) and counted (:attr:`adapter_bytes`: every ``lora_a`` and ``lora_b``)."""
        from mlx.utils import tree_flatten
        from mlx_lm.utils import load_adapters

        folder = self.adapter.path_for("mlx")  # made on first use: not part of the attach
        t0 = now()
        self.mlx_model = load_adapters(self.mlx_model, folder)
        self.mlx_model.eval()
        lora = [a for k, a in tree_flatten(self.mlx_model.parameters()) if k.rsplit(".", 1)[-1] in ("lora_a", "lora_b")]
        self._mx.eval(lora)
        self.adapter_load_s = now() - t0
        self.adapter_bytes = sum(int(a.nbytes) for a in lora)

    def _count_merged(self) -> None:
        """:attr:`adapter_bytes` of a merged adapter: the fused folder's weights as stored (and loaded) less the
        base folder's."""
        from lablib.model.formats import weight_tensors

        def held(path) -> int:
            return sum(b for _, _, _, b in weight_tensors(path))

        self.adapter_bytes = held(self._path) - held(self.model.path_for("mlx", self.name))

    def _cheaper(self, m, kind: str):
        """``m`` (loaded from the folder) made the draft ``kind`` of :data:`DRAFTS` is, in place: (model, dtype)."""
        if DRAFTS[kind] is None:  # a cast of every floating-point weight
            m.set_dtype(getattr(self._mx, kind))
            self._mx.eval(m.parameters())
            return m, kind
        import contextlib
        import io

        from mlx_lm.utils import quantize_model

        def layers_only(path, module):  # the (tied) embedding and output head stay float32, below
            return not path.endswith("embed_tokens") and path != "lm_head"

        with contextlib.redirect_stdout(io.StringIO()):  # it prints its bits per weight
            m, _ = quantize_model(m, self.config, DRAFT_GROUP, DRAFTS[kind], quant_predicate=layers_only)
        self._mx.eval(m.parameters())
        return m, f"{DRAFTS[kind]}-bit (group {DRAFT_GROUP}), float32 head"

    def _load_speculation(self, path: str, draft, speculative) -> dict:
        """The draft model and k for the speculation asked at load ({}: none)."""
        if draft is None:
            return {}
        from mlx_lm.utils import compute_bits_per_weight, load_model

        k = whole(
            4 if speculative is None else speculative,
            "speculative",
            "a whole number of draft tokens a round, at least 1",
        )
        folder = path if draft in DRAFTS else str(draft)
        fixes = (
            self.config_fixes
            if draft in DRAFTS
            else normalize_config(json.loads((Path(folder) / "config.json").read_text()))
        )
        m, _ = load_model(Path(folder), model_config=fixes or None)
        if int(m.args.vocab_size) != self.n_vocab:
            raise LabError(
                f"draft {folder}: vocabulary of {m.args.vocab_size} tokens, the target's has {self.n_vocab}; "
                "expected a draft of the same vocabulary (the same model family)"
            )
        if draft in DRAFTS:
            m, dtype = self._cheaper(m, draft)
        else:
            w = next(iter(_leaves(m.parameters())), None)
            dtype = str(w.dtype).replace("mlx.core.", "") if w is not None else "?"
        self._draft_desc = {
            "draft": str(draft),
            "draft_folder": folder,
            "draft_dtype": dtype,
            "draft_bits_per_weight": round(float(compute_bits_per_weight(m)), 3),
        }
        return {"draft_model": m, "k": k}

    def speculation(self) -> dict:
        """What this engine speculates with ({}: none): method, draft, tokens per round."""
        if not self._spec:
            return {}
        return {"method": "draft model (mlx-lm)", "k": self._spec["k"], **self._draft_desc}

    # --- tokenizer -------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special))

    def detokenize(self, ids) -> str:
        ids = token_ids(ids)
        self.check_ids(ids)  # the same LabError in every engine (llama.cpp's aborted the process; this one gave "")
        return self.tok.decode(ids, skip_special_tokens=False)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        """mlx-lm's own path (mlx_lm.generate): render, then add special tokens unless the
        text already starts with BOS."""
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        bos = self.tok.bos_token
        return self.tokenize(text, add_special=bos is None or not text.startswith(bos))

    @property
    def bos_id(self) -> int | None:
        return self.tok.bos_token_id

    @property
    def eos_ids(self) -> set[int]:
        return self._eos

    @property
    def rope_theta(self) -> float:
        """The RoPE base the loaded model really uses (mlx-lm's ModelArgs)."""
        return float(getattr(self.mlx_model.args, "rope_theta", float("nan")))

    def info(self) -> EngineInfo:
        mx = self._mx
        blas = blas_info(mx)
        return EngineInfo(
            name=self.name,
            version=self.library_version,
            backend=f"mlx {mx.__version__} {mx.default_device()}, BLAS: {blas['name']}",
            dtype=self.dtype,
            threads=self.threads,
            n_ctx=self.n_ctx,
            # MLX computes on its default device: the GPU (Metal) on Apple silicon, else the CPU
            device="metal" if mx.default_device().type == mx.DeviceType.gpu else "cpu",
            compute_dtype=self.compute_dtype(self.model),
            flags={
                "prefill_step_size": self.prefill_step_size,
                "blas": blas,
                "config_fixes": self.config_fixes,
                "rope_theta": self.rope_theta,
                "sampling": DEFINITION,
                "settings_off": list(self.SETTINGS_OFF),
                **({"speculative": self.speculation()} if self._spec else {}),
                **self.adapter_flags(),
            },
        )

    def effective_config(self) -> dict:
        """The config as mlx-lm uses it: its ModelArgs, the layers' kinds from the cache it makes for them
        (``make_cache``: a ``RotatingKVCache(max_size=window)`` is a sliding-window layer, a ``KVCache`` a
        full one) and the RoPE base of the module each kind of layer really calls."""
        a = self.mlx_model.args
        heads = a.num_attention_heads
        head_dim = getattr(a, "head_dim", None) or a.hidden_size // heads
        theta = getattr(a, "rope_theta", None)
        layers = getattr(getattr(self.mlx_model, "model", None), "layers", None) or getattr(
            self.mlx_model, "layers", []
        )
        make = getattr(self.mlx_model, "make_cache", None)
        caches = make() if make is not None else []
        windows = [getattr(c, "max_size", None) for c in caches] if len(caches) == len(layers) else [None] * len(layers)
        bases = {"full": [], "sliding": []}
        for layer, window in zip(layers, windows):
            base = getattr(getattr(getattr(layer, "self_attn", None), "rope", None), "base", None)
            if base is not None:
                bases["sliding" if window else "full"].append(float(base))
        sliding = [w for w in windows if w]
        eos = self.config.get("eos_token_id")
        return {
            "rope_theta": bases["full"][0] if bases["full"] else theta,
            "rope_theta_sliding": (bases["sliding"] or [getattr(a, "rope_local_base_freq", theta)])[0]
            if sliding
            else None,
            # mlx-lm 0.32 fills rope_scaling from transformers 5's rope_parameters ({"rope_type": "default", ...})
            "rope_scaling": rope_scaling_summary(getattr(a, "rope_scaling", None)),
            "rms_norm_eps": a.rms_norm_eps,
            "n_heads": heads,
            "n_kv_heads": getattr(a, "num_key_value_heads", heads) or heads,
            "head_dim": head_dim,
            "n_layers": a.num_hidden_layers,
            "sliding_window": max(sliding, default=0),
            "sliding_layers": len(sliding),
            "attn_logit_softcapping": getattr(a, "attn_logit_softcapping", None) or None,
            "final_logit_softcapping": getattr(a, "final_logit_softcapping", None) or None,
            "vocab_size": a.vocab_size,
            "context_length": self.config.get("max_position_embeddings"),
            # what it built: an output head of its own (lm_head), or the embedding read back as one (tied)
            "tie_word_embeddings": getattr(self.mlx_model, "lm_head", None) is None,
            "bos_id": self.config.get("bos_token_id"),
            "eos_id": eos[0] if isinstance(eos, list) else eos,
        }

    # --- generation -------------------------------------------------------
    def _sampler(self, cfg: GenerationConfig):
        """mlx-lm sampler for ``cfg`` (:data:`lablib.engines.sampling.DEFINITION`), seeding MLX's random
        stream with ``cfg.seed``: greedy, or mlx-lm's own filters composed in the lab's order,
        logprobs / temperature -> ``apply_top_k`` -> ``apply_top_p`` -> categorical draw.
        Not ``make_sampler``: it applies top-p (then min-p, XTC, top-k) to the *untempered*
        log-probs and divides by the temperature only when it draws, a different distribution.
        Works on one row [vocab] or a batch [B, vocab]."""
        from mlx_lm.sample_utils import apply_top_k, apply_top_p, categorical_sampling, greedy_sampler

        if cfg.greedy:
            return greedy_sampler
        self._mx.random.seed(cfg.seed)
        inv_t, top_k, top_p = 1.0 / cfg.temperature, cfg.top_k, cfg.top_p
        top_k = top_k if 0 < top_k < self.n_vocab else 0  # k >= vocabulary keeps everything

        def sampler(logprobs):
            x = logprobs * inv_t
            if top_k:
                x = apply_top_k(x, top_k)
            if top_p < 1.0:
                x = apply_top_p(x, top_p)
            return categorical_sampling(x, 1.0)

        return sampler

    _prefill_tokens = 0  # prompt positions the last request's forward passes received
    _last_cache = None  # the last request's prompt cache when it ran with a prefix cache

    def engine_counters(self) -> dict:
        """Counted at the model's forward for the last request: ``n_p_eval``, the prompt positions
        its forward passes received (the uncached part of the prompt); speculating, also the rounds read from
        its tokens' ``from_draft`` flags (:func:`draft_rounds`)."""
        return {"n_p_eval": self._prefill_tokens, **self._spec_counts}

    def _new_cache(self):
        """A fresh mlx-lm prompt cache for this model; LabError unless it is trimmable (plain KV
        layers: prefix caching copies and cuts them)."""
        from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

        cache = make_prompt_cache(self.mlx_model)
        if not can_trim_prompt_cache(cache):
            raise LabError(f"mlx-lm's prompt cache for {self.model.name} cannot be cut to a prefix (not trimmable)")
        return cache

    def _kept(self, cache, ids) -> PrefixCache:
        """A PrefixCache of ``cache``'s per-layer (keys, values) cut to ``len(ids)`` positions."""
        mx, n = self._mx, len(ids)
        kv = [(c.keys[..., :n, :], c.values[..., :n, :]) for c in cache]
        mx.eval(kv)
        return PrefixCache(self.name, list(ids), state=kv, nbytes=sum(k.nbytes + v.nbytes for k, v in kv))

    def _cache_prefix(self, ids) -> PrefixCache:
        mx = self._mx
        cache = self._new_cache()
        for at in range(0, len(ids), self.prefill_step_size):
            self.mlx_model(mx.array([ids[at : at + self.prefill_step_size]]), cache=cache)
            mx.eval([c.state for c in cache])
        return self._kept(cache, ids)

    def _keep_request(self, prefix_cache: PrefixCache, ids, trace: RequestTrace) -> None:
        cache = self._last_cache
        kept = self._kept(cache, (list(ids) + trace.token_ids)[: cache[0].offset])
        prefix_cache.ids, prefix_cache.state, prefix_cache.nbytes = kept.ids, kept.state, kept.nbytes
        self._last_cache = None

    def _counting_model(self, n_prompt: int, cache):
        """The model, wrapped to add up the prompt positions (below ``n_prompt``) each forward
        pass receives, read from the cache offset before the call."""
        model, engine = self.mlx_model, self

        def forward(inputs, cache=cache, **kw):
            at = cache[0].offset
            engine._prefill_tokens += max(0, min(at + inputs.shape[-1], n_prompt) - at)
            return model(inputs, cache=cache, **kw)

        forward.layers = model.layers  # speculative_generate_step splits its prompt cache by len(model.layers)
        return forward

    def _generate(self, ids, cfg: GenerationConfig, trace: RequestTrace, prefix_cache=None) -> None:
        from mlx_lm.generate import generate_step
        from mlx_lm.models.cache import make_prompt_cache

        if self._spec:
            return self._generate_speculative(ids, cfg, trace, prefix_cache)
        mx = self._mx
        self._prefill_tokens, self._last_cache = 0, None
        cached = 0
        if prefix_cache is None:
            cache = make_prompt_cache(self.mlx_model)  # fresh: no reuse across requests
            trace.start()
        else:
            trace.start()  # the copy of the kept prefix is this request's work
            cache = self._last_cache = self._new_cache()
            cached = prefix_cache.reusable(ids)
            if cached:  # each layer starts from the kept prefix's first `cached` positions
                for c, (k, v) in zip(cache, prefix_cache.state):
                    c.keys, c.values, c.offset = k[..., :cached, :], v[..., :cached, :], cached
            trace.cached_tokens = cached
        steps = generate_step(
            mx.array(ids[cached:]),
            self._counting_model(len(ids), cache),
            max_tokens=cfg.max_new_tokens,
            sampler=self._sampler(cfg),
            prompt_cache=cache,
            prefill_step_size=self.prefill_step_size,
        )
        trace.finish_reason = "length"
        for tok, _logprobs in steps:
            trace.token(tok)
            if not cfg.ignore_eos and tok in self._eos:
                trace.finish_reason = "stop"
                break
        steps.close()
        self.last_kv_bytes = _prompt_cache_bytes(cache)

    def _generate_speculative(self, ids, cfg: GenerationConfig, trace: RequestTrace, prefix_cache=None) -> None:
        """Greedy decode through mlx-lm's ``speculative_generate_step`` (a fresh prompt cache for the target and
        one for the draft): each token stamped as the generator yields it, so a verified run arrives at once (its
        stamps microseconds apart); the rounds are read back from the ``from_draft`` flags."""
        from mlx_lm.generate import speculative_generate_step
        from mlx_lm.models.cache import make_prompt_cache

        if not cfg.greedy or prefix_cache is not None:
            raise LabError(
                "mlx with draft= (mlx-lm's speculative decoding) runs greedy requests without a prefix cache; "
                "expected temperature=0 and no prefix_cache (load it without draft= for those)"
            )
        mx, draft, k = self._mx, self._spec["draft_model"], self._spec["k"]
        self._prefill_tokens, self._last_cache, self._spec_counts = 0, None, {}
        trace.start()
        cache = make_prompt_cache(self.mlx_model)  # the target's layers first, then the draft's
        steps = speculative_generate_step(
            mx.array(ids),
            self._counting_model(len(ids), cache),
            draft,
            num_draft_tokens=k,
            max_tokens=cfg.max_new_tokens,
            sampler=self._sampler(cfg),
            prompt_cache=cache + make_prompt_cache(draft),
            prefill_step_size=self.prefill_step_size,
        )
        flags: list[bool] = []
        trace.finish_reason = "length"
        try:
            for tok, _logprobs, from_draft in steps:
                trace.token(tok)
                flags.append(bool(from_draft))
                if not cfg.ignore_eos and tok in self._eos:
                    trace.finish_reason = "stop"
                    break
        finally:
            steps.close()
        self._spec_counts = draft_rounds(flags, k, cfg.max_new_tokens)

    def batch_session(self, cfg: GenerationConfig, max_sequences: int, max_seq_tokens: int) -> MLXBatchSession:
        """A continuous-batching session: up to ``max_sequences`` requests decoded together.
        ``max_seq_tokens`` (longest prompt + output, tokens) is checked against ``n_ctx``."""
        if self._spec:
            raise LabError(
                "mlx loaded with draft= decodes one sequence (mlx-lm's speculative decoding); load it without for batched mode"
            )
        self.check_context(max_seq_tokens, 0)
        self.check_adapter_request(cfg)
        return MLXBatchSession(self, cfg, max_sequences)

    def logits(self, ids) -> np.ndarray:
        """Teacher-forced logits for ``ids``: float32 numpy array [len(ids), vocab]."""
        import numpy as np

        self.check_ids(list(ids))
        mx = self._mx
        out = self.mlx_model(mx.array([list(ids)]))
        return np.array(out[0].astype(mx.float32))

    def iter_logits(self, ids, chunk: int = 64):
        """Teacher-forced logits, ``chunk`` positions per forward pass over one prompt cache:
        yields float32 numpy arrays [<= chunk, vocab] (see :meth:`Engine.iter_logits`)."""
        import numpy as np
        from mlx_lm.models.cache import make_prompt_cache

        ids = token_ids(ids)
        self.check_ids(ids)
        mx = self._mx
        cache = make_prompt_cache(self.mlx_model)
        for at in range(0, len(ids), chunk):
            out = self.mlx_model(mx.array([ids[at : at + chunk]]), cache=cache)
            yield np.array(out[0].astype(mx.float32))

    def close(self) -> None:
        self.mlx_model = None
        self._spec = {}


def draft_rounds(from_draft: list[bool], k: int, max_tokens: int) -> dict:
    """The rounds of mlx-lm's ``speculative_generate_step`` (0.32) read back from its tokens' ``from_draft`` flags.

    A round drafts ``min(k, max_tokens - tokens so far)`` tokens (never 0: it stops at the budget), verifies them in
    one target pass and yields its accepted run (True: a draft token the target's pick matched, the run stops at the
    first mismatch) and then the target's own token (False), unless the budget ends inside a fully accepted run. So
    each False closes a round, and a round also closes once it accepted all it drafted. Per round:
    ``drafted_per_pass`` and ``accepted_per_pass``; ``draft_n``, ``draft_n_accepted`` (= the True flags),
    ``target_passes`` (verification passes: rounds; the prefill yields no token), ``tokens_per_pass`` (tokens /
    rounds: not tokens / (tokens - accepted), which counts a last round ended at the budget as no pass), ``from_draft``
    (the flags).
    A request stopped early (EOS) counts its last round's drafts only up to the positions it reached, as
    llama.cpp's lookup counters do. LabError where the flags do not follow that pattern (another mlx-lm)."""
    k, max_tokens = int(k), int(max_tokens)
    drafted, accepted, done, i, n = [], [], 0, 0, len(from_draft)
    while i < n:
        d, a, start = min(k, max_tokens - done), 0, i
        if d < 1:
            raise LabError(f"mlx-lm yielded {n} tokens for a budget of {max_tokens}: not the rounds this lab reads")
        while i < n and from_draft[i] and a < d:
            a, i = a + 1, i + 1
        own = i < n and not from_draft[i]
        i += own
        if not own and i < n:  # a full run must be closed by the target's own token
            raise LabError(
                f"mlx-lm's from_draft flags {from_draft}: a round accepted all its {d} drafts and then another "
                "draft token came; not the rounds of speculative_generate_step this lab reads"
            )
        done += a + own
        drafted.append(d if i < n or done >= max_tokens else min(d, i - start))
        accepted.append(a)
    return {
        "draft_n": sum(drafted),
        "draft_n_accepted": sum(accepted),
        "target_passes": len(drafted),
        "tokens_per_pass": n / len(drafted) if drafted else None,
        "drafted_per_pass": drafted,
        "accepted_per_pass": accepted,
        "from_draft": list(from_draft),
    }


@functools.lru_cache(maxsize=1)
def _stamping_batch_generator():
    """mlx-lm's BatchGenerator, recording when each request leaves its queue for prefill."""
    from mlx_lm.generate import BatchGenerator

    class StampingBatchGenerator(BatchGenerator):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.started_at: dict[int, float] = {}  # uid -> lab clock, seconds

        def _make_batch(self, n):
            # mlx-lm 0.32: pops the first n queued sequences (uid first) to prefill them
            t = now()
            for seq in list(self._unprocessed_sequences)[:n]:
                self.started_at[seq[0]] = t
            return super()._make_batch(n)

    return StampingBatchGenerator


class MLXBatchSession:
    """mlx-lm's BatchGenerator behind the lab's session interface.

    :meth:`submit` inserts a request (fresh KV cache, its own token budget and
    stop set); :meth:`step` is one ``BatchGenerator.next()`` and returns the
    traces that finished in it. A token's timestamp is when ``next()`` handed
    it back (all tokens of one step share it). ``t_start`` is stamped when the
    generator takes the request out of its queue to prefill it.
    ``stats``: ``steps`` (next() calls that ran a decode step),
    ``max_sequences_per_step`` (most sequences in one decode forward pass),
    ``max_prefill_sequences_per_step`` (most prompts prefilled in one call),
    ``prompt_tokens`` and ``generated_tokens`` (mlx-lm's own counters; the last
    prompt token of each request counts as decode input, not prompt). Sampling
    draws every sequence from one random stream seeded with ``cfg.seed``.
    """

    def __init__(self, engine: MLXEngine, cfg: GenerationConfig, max_sequences: int):
        self.engine, self.cfg = engine, cfg
        # one sampler for the batch (mlx-lm samples it in one call, from one random stream)
        sampler = engine._sampler(cfg)
        self.gen = _stamping_batch_generator()(
            engine.mlx_model,
            max_tokens=cfg.max_new_tokens,
            sampler=sampler,
            completion_batch_size=max_sequences,
            prefill_batch_size=max_sequences,
            prefill_step_size=engine.prefill_step_size,
        )
        self._stop = None  # ignore_eos: no stop set; EOS is generated like any token
        if not cfg.ignore_eos:
            from mlx_lm.generate import StopSequences

            self._stop = StopSequences([(t,) for t in sorted(engine.eos_ids)])
        self._traces: dict[int, RequestTrace] = {}
        self.stats = BatchStats.counters(engine, "mlx_lm BatchGenerator", "max_prefill_sequences_per_step")

    @property
    def pending(self) -> int:
        """Requests submitted and not yet finished."""
        return len(self._traces)

    def submit(self, ids: list[int], trace: RequestTrace) -> None:
        """Insert prompt ``ids``; ``trace`` receives t_start and the token events."""
        stop = None if self._stop is None else [self._stop]
        (uid,) = self.gen.insert([list(ids)], max_tokens=[self.cfg.max_new_tokens], stop_sequences=stop)
        self._traces[uid] = trace

    def step(self) -> list[RequestTrace]:
        """One BatchGenerator.next(); the traces finished in it, in order."""
        t0 = now()
        prompt_resps, gen_resps = self.gen.next()
        t = now()
        for uid, ts in self.gen.started_at.items():
            self._traces[uid].start(ts)
        self.gen.started_at.clear()
        for r in prompt_resps:  # fallback should the hook above ever stop firing
            if self._traces[r.uid].t_start is None:
                self._traces[r.uid].start(t0)
        st = self.stats
        if gen_resps:
            st["steps"] += 1
            st["max_sequences_per_step"] = max(st["max_sequences_per_step"], len(gen_resps))
        prefilling = {r.uid for r in prompt_resps if not r.end_of_prompt}
        st["max_prefill_sequences_per_step"] = max(st["max_prefill_sequences_per_step"], len(prefilling))
        finished = []
        for r in gen_resps:
            trace = self._traces[r.uid]
            trace.token(r.token, t)
            if r.finish_reason is not None:
                trace.finish_reason = r.finish_reason  # "length" or "stop" (EOS kept in the output)
                finished.append(self._traces.pop(r.uid))
        c = self.gen._counters
        st["prompt_tokens"], st["generated_tokens"] = c.prompt_tokens, c.generation_tokens
        return finished

    def close(self) -> None:
        """Drop unfinished requests and release the generator."""
        if self._traces:
            self.gen.remove(list(self._traces))
            self._traces.clear()
        self.gen.close()


def blas_info(mx) -> dict:
    """The BLAS behind MLX's CPU matrix products in this process, as the dynamic linker bound it.

    The library that defines the ``cblas_sgemm`` libmlx calls (the process's global scope first,
    then libmlx's own dependencies, the linker's order), found with ``dladdr``:
    ``{"name", "path", "file"}`` (``path``: as loaded, ``file``: that path with links resolved),
    and for OpenBLAS ``version`` (``openblas_get_config()``), ``core`` (the kernels it chose for
    this CPU) and ``threads``. ``name``: ``"OpenBLAS <version>"``, ``"reference BLAS (netlib,
    bundled with mlx-cpu)"`` for the wheel's own, else the library's file name. Never raises:
    ``{"name": "unknown", "why": ...}`` where it cannot tell (no libmlx, no dladdr)."""
    import ctypes
    import os

    try:
        folder = Path(mx.__file__).parent / "lib"
        libmlx = next((p for p in (folder / "libmlx.so", folder / "libmlx.dylib") if p.exists()), None)
        if libmlx is None:
            return {"name": "unknown", "why": f"no libmlx in {folder}"}
        mode = getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL
        scopes = (ctypes.CDLL(None), ctypes.CDLL(str(libmlx), mode=mode))
        fn = next((lib.cblas_sgemm for lib in scopes if hasattr(lib, "cblas_sgemm")), None)
        if fn is None:
            return {"name": "unknown", "why": f"{libmlx.name} finds no cblas_sgemm"}

        class DlInfo(ctypes.Structure):
            _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p)]
            _fields_ += [("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]

        where = DlInfo()
        if not ctypes.CDLL(None).dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(where)):
            return {"name": "unknown", "why": "dladdr does not place cblas_sgemm"}
        path = os.fsdecode(where.fname)
        out = {"name": Path(path).name, "path": path, "file": os.path.realpath(path)}
        provider = ctypes.CDLL(path, mode=mode)
        if hasattr(provider, "openblas_get_config"):
            for fn_name, key, restype in (
                ("openblas_get_config", "version", ctypes.c_char_p),
                ("openblas_get_corename", "core", ctypes.c_char_p),
                ("openblas_get_num_threads", "threads", ctypes.c_int),
            ):
                if hasattr(provider, fn_name):
                    f = getattr(provider, fn_name)
                    f.restype = restype
                    v = f()
                    out[key] = v.decode() if isinstance(v, bytes) else v
            version = out.get("version", "OpenBLAS").split()
            out["name"] = " ".join(version[:2]) if version[0] == "OpenBLAS" else "OpenBLAS"
        elif "mlx_cpu.libs" in path and Path(path).name.startswith("libblas-"):
            out["name"] = "reference BLAS (netlib, bundled with mlx-cpu)"
        elif "Accelerate.framework" in out["file"]:
            out["name"] = "Accelerate"
        return out
    except (OSError, AttributeError, ValueError, StopIteration) as e:
        return {"name": "unknown", "why": f"{type(e).__name__}: {e}"}


def _leaves(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _leaves(v)
    else:
        yield tree
