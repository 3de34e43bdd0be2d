"""Hugging Face transformers: safetensors folders, PyTorch kernels, the reference.

Generation is ``model.generate`` itself (the library's own loop, a fresh KV
cache per call) with a streamer that receives token *ids*: each call to
``put`` is one generated token, stamped with the lab's clock at once. A text
streamer would emit words, not tokens, and distort TTFT and ITL
(tests/data/cases/README.md, "words, not tokens").

Prefix caching, only when asked (``generate(ids, prefix_cache=...)``, lab 08): a
:class:`~lablib.engines.base.PrefixCache` holds the per-layer key/value tensors of a prefix;
each request gets its own ``DynamicCache`` built from the first ``n`` positions of them (a
copy: ``DynamicLayer.update`` concatenates), and ``generate`` is given the whole prompt with
that cache, so its prefill forward receives only the uncached tokens. A forward pre-hook
counts the tokens the prefill forward received (:meth:`TransformersEngine.engine_counters`).

Compiled decoding, when asked (``load_engine("transformers", model, compile=True)``): transformers' own faster
path, a static KV cache (``StaticCache``) and the decode step's forward compiled by ``torch.compile`` (mode
"reduce-overhead" on CUDA: CUDA graphs, one launch a step in place of hundreds; "default" elsewhere), which
``generate`` runs when given a compile config and a compileable cache (``_valid_auto_compile_criteria``; the
prefill stays eager: ``get_compiled_call``). The compile happens before a request's clock starts
(:meth:`TransformersEngine.generate`), once per static cache length, and its seconds are counted apart
(``compile_s`` in :meth:`TransformersEngine.engine_counters` and ``info().flags["compile"]``), not in TTFT.

transformers has no hard context limit (past its trained length it runs with a
warning); the lab enforces ``max_position_embeddings`` (or ``n_ctx``).

Batched mode (:meth:`TransformersEngine.batch_session`) is transformers' own
continuous-batching generation (``model.init_continuous_batching()``, a
``ContinuousBatchingManager``): a paged KV cache, a FIFO scheduler that packs
decode tokens and prompt chunks of several requests into one forward pass, run
by the manager's background thread. Requests stream their outputs (one output
per step per request); the calling thread stamps each new token id as it
receives it. Only the manager's thread touches the model during a session.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import TYPE_CHECKING

from lablib.checks import whole
from lablib.engines.base import BatchStats, Engine, EngineInfo, GenerationConfig, PrefixCache, token_ids
from lablib.engines.sampling import DEFINITION
from lablib.errors import LabError, first_line
from lablib.machine.devices import torch_device, torch_dtype
from lablib.model.formats import FLOAT_TYPES
from lablib.results.trace import RequestTrace, now

# compile=True: the static cache lengths the decode step is compiled for are powers of two from this (tokens), up to
# n_ctx (TransformersEngine.static_length says why)
COMPILE_MIN_LEN = 256
# decode forwards of the warm-up that compiles a length: torch's CUDA graph trees run a new graph's first call as a
# warm-up, record it on the second and replay it from the third (torch/_inductor/cudagraph_trees.py); one spare
COMPILE_WARM_STEPS = 4

# a torch dtype name -> (its safetensors name, bytes per element)
TORCH_DTYPES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2), "float16": ("F16", 2)}

if TYPE_CHECKING:
    import numpy as np


def rope_base_from_inv_freq(inv_freq, head_dim: int) -> float:
    """inv_freq[i] = base^(-2i/d)  =>  base = inv_freq[1]^(-d/2) (RoFormer, Su et al. 2021); from the ratio
    (inv_freq[0] / inv_freq[1])^(d/2) when inv_freq[0] is known, which a linear RoPE scaling (every frequency
    divided by its factor: Gemma 3 4B's full layers, x8) leaves unchanged."""
    first, second = float(inv_freq[0]), float(inv_freq[1])
    return (first / second) ** (head_dim / 2) if first > 0 else second ** (-head_dim / 2)


def _cache_bytes(cache) -> int | None:
    """Bytes of the key and value tensors a transformers cache holds (each layer's ``keys`` and ``values``:
    ``DynamicLayer`` keeps every position, ``DynamicSlidingWindowLayer`` its window - 1); None without one."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    total = 0
    for layer in layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None and hasattr(t, "numel"):
                total += t.numel() * t.element_size()
    return total


def power_of_two_length(tokens: int, n_ctx: int) -> int:
    """The smallest power of two from :data:`COMPILE_MIN_LEN` that holds ``tokens``, at most ``n_ctx`` (tokens):
    the static cache length of a compiled request (:meth:`TransformersEngine.static_length` says why)."""
    length = COMPILE_MIN_LEN
    while length < tokens:
        length *= 2
    return min(length, n_ctx)


class _TokenIdStreamer:
    """A transformers streamer (BaseStreamer protocol) that stamps token ids."""

    def __init__(self, trace: RequestTrace):
        self.trace = trace
        self._prompt_seen = False
        self.puts: list[int] = []  # tokens per put after the prompt: one target forward pass each

    def put(self, value) -> None:
        if not self._prompt_seen:  # generate() first puts the prompt
            self._prompt_seen = True
            return
        toks = value.reshape(-1).tolist()
        self.puts.append(len(toks))
        for tok in toks:
            self.trace.token(tok)

    def end(self) -> None:
        pass


class _GuidanceMask:
    """A transformers logits processor: before each step, the token sampled last goes into the llguidance matcher
    and the logits of every token the grammar forbids become -inf. The bitmask (32 tokens a word) is filled by
    llguidance.numpy and unpacked with numpy, not llguidance.torch's kernel: that one is ``torch.compile``d, which
    cost the first constrained request 30 s here (inductor building C++ on a CPU)."""

    def __init__(self, matcher, prompt_len: int, n_vocab: int):
        import llguidance.numpy as lln
        import numpy as np
        import torch

        self.matcher, self.prompt_len, self.n_vocab = matcher, prompt_len, n_vocab
        self._lln, self._np, self._torch = lln, np, torch
        self.mask = lln.allocate_token_bitmask(1, n_vocab)

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] > self.prompt_len:
            self.matcher.consume_token(int(input_ids[0, -1]))
        self._lln.fill_next_token_bitmask(self.matcher, self.mask, 0)
        allowed = self._np.unpackbits(self.mask[0].view(self._np.uint8), bitorder="little")[: scores.shape[-1]]
        forbid = self._torch.from_numpy(allowed == 0).to(scores.device)
        return scores.masked_fill(forbid, float("-inf"))


class TransformersEngine(Engine):
    """transformers engine.

    ``device``: "auto" (CUDA, then Apple's MPS, then the CPU), "cpu", "cuda" or "mps".
    ``dtype``: torch dtype name for the weights (default: float32 on the CPU, the faithful
    reference; bfloat16 on CUDA where supported, else float16; float16 on MPS: see
    :func:`lablib.machine.devices.torch_dtype`). ``threads``: torch intra-op threads (default: automatic, see ``Engine.adapt_threads``).
    ``n_ctx``: context the lab enforces (default: the model's trained context).
    Speculation, transformers' own (greedy): ``draft`` (a dtype name of the same folder, e.g. "bfloat16", or an
    HF folder of the same vocabulary) runs assisted generation (``assistant_model=``, ``speculative`` tokens a
    step, default 4, a constant schedule and no confidence threshold, so every step drafts that many);
    ``prompt_lookup`` (tokens) runs prompt-lookup decoding (``prompt_lookup_num_tokens=``). transformers counts
    no accepted tokens: :meth:`engine_counters` derives them from the streamer, whose every put after the
    prompt is one target forward pass carrying the accepted drafts plus one token of the target's own.
    ``adapter`` (a lablib.model.adapters.Adapter of the model, lab 11): PEFT's ``PeftModel.from_pretrained`` on the
    loaded model, unmerged (PEFT puts its LoRA layers into the model in place: generation, logits, prefix caching
    and continuous batching all run through them); with ``merge_adapter`` the Hugging Face folder of PEFT's
    ``merge_and_unload`` is loaded instead of the base's.

    ``compile=True``: transformers' compiled decoding, a static KV cache with the decode step compiled by
    ``torch.compile`` (``CompileConfig(mode="reduce-overhead", dynamic=False)`` on CUDA: inductor's kernels
    captured in CUDA graphs; mode "default" on the CPU and MPS, where transformers would not compile by itself).
    Why it matters on a GPU: a 135M model on an H200 decodes at the speed of 16 CPU threads (18 ms a token, issue
    37) because each eager step launches hundreds of small kernels from Python; a captured graph launches them at
    once. What it costs: a compile per static cache length, before the first request that needs it (2-core EPYC,
    SmolLM2 float32, a busy machine: 66-74 s from a cold inductor cache, 12-15 s once its disk cache holds the
    kernels; decode then 55 ms a token against 66 ms eager, benchmarks/compiled_decode.py), timed apart from TTFT
    (:meth:`generate`) into :attr:`compile_s`; and a KV cache of the whole static length, kept per length compiled
    (CUDA graphs read the cache at fixed addresses), which every decode step attends over (masked).
    ``static_cache_len`` (tokens): one length for every request (a request needing more is refused); default, the
    power of two from :data:`COMPILE_MIN_LEN` that holds prompt + output, at most ``n_ctx`` (:meth:`static_length`).
    Threads are fixed at load (torch.compile guards on torch's thread count: a change would recompile inside a
    request's clock). Greedy output equals the eager engine's, with an unmerged adapter too (PEFT's LoRA layers
    compile with the rest). It runs sampling and constraints (a logits processor, outside the compiled forward);
    it refuses a model with sliding-window layers (their static cache layer keeps its position as a Python int that
    torch.compile guards on: Gemma 3 recompiled at every step), a prefix cache (a kept prefix is a DynamicCache), speculation (``draft=``/``prompt_lookup=``:
    assisted generation runs its own caches) and batched mode (transformers' continuous batching has its own paged
    cache), each with a LabError.
    """

    name = "transformers"
    format = "hf"
    requires = "transformers"
    install_hint = "make setup, or pip install 'torch==2.13.0' transformers accelerate"
    kv_bytes_per_value = 4  # float32 models
    dtypes = ("float32", "bfloat16", "float16")
    weights_option = "dtype"  # the folder's weights, cast to this dtype at load
    weights_choices = dtypes
    # lablib.studies.compare's reference: float32 on every device (on a GPU the default dtype is half precision)
    compare_load_kwargs = {"dtype": "float32"}
    prefix_caching = True  # a DynamicCache built from a kept prefix's key/value tensors, per request
    speculation_methods = ("prompt lookup", "draft model")  # prompt_lookup_num_tokens=, assistant_model=
    adapter_form = "peft"  # a PEFT folder, PeftModel.from_pretrained (lab 11)
    merged_form = "hf"  # PEFT's merge_and_unload, saved as a Hugging Face folder

    @classmethod
    def speculation_kwargs(cls, method: str, k: int, draft=None) -> dict:
        """``prompt_lookup=k``, or ``draft=`` (default: the model's folder in bfloat16) with ``speculative=k``."""
        if method == "prompt lookup":
            return {"prompt_lookup": k}
        if method == "draft model":
            return {"draft": draft or "bfloat16", "speculative": k}
        return super().speculation_kwargs(method, k, draft)

    # llguidance (a logits processor masking what the grammar forbids each step: _GuidanceMask); chosen over
    # outlines-core (a 2.5 s index per schema here), lm-format-enforcer (0.11.3 does not import with transformers 5)
    # and xgrammar (pulls triton): lablib/studies/decoding/structured.py's docstring has the measurement
    constraints = ("json_schema", "regex")

    @classmethod
    def weight_tensors(cls, model, weights: str | None = None) -> tuple:
        """The Hugging Face folder's tensors as torch holds them after loading with ``dtype=weights``
        (float32 by default): floating-point tensors in that dtype (2 bytes a weight in bfloat16 or
        float16), others as stored."""
        kind, size = TORCH_DTYPES[cls.check_weights(weights)]
        return tuple(
            (name, kind, n, n * size) if t in FLOAT_TYPES else (name, t, n, b)
            for name, t, n, b in super().weight_tensors(model, weights)
        )

    @classmethod
    def compute_dtype(cls, model, weights: str | None = None) -> str:
        """The dtype it loaded the weights in (float32 by default): torch multiplies in the weights' dtype."""
        return cls.check_weights(weights)

    @classmethod
    def kv_cache_bytes(cls, model, context_tokens: int, sequences: int = 1, **load) -> int:
        """transformers' ``DynamicCache``: a full-attention layer keeps every position, a sliding-window layer
        its last ``sliding_window - 1`` (``DynamicSlidingWindowLayer``: the token being computed is the
        window's last), at the weights' dtype (``dtype`` in ``load``; float32 by default). With ``compile=True`` in
        ``load``: the ``StaticCache`` of the request's static length (``static_cache_len``, or the power of two that
        holds ``context_tokens``: :func:`power_of_two_length`), a sliding layer ``min(window, length)``."""
        from lablib.model.shape import kv_cache_bytes, model_dims

        d = model_dims(model)
        size = TORCH_DTYPES[cls.check_weights(load.get("dtype"))][1]
        if load.get("compile"):
            n_ctx = load.get("n_ctx") or model.max_position_embeddings
            length = load.get("static_cache_len") or power_of_two_length(context_tokens, n_ctx)
            return kv_cache_bytes(d, size, length, sequences, sliding_tokens=d["sliding_window"] or None)
        return kv_cache_bytes(d, size, context_tokens, sequences, sliding_tokens=max(0, (d["sliding_window"] or 1) - 1))

    @classmethod
    def kv_cache_note(cls, model, **load) -> str:
        from lablib.model.shape import model_dims

        d = model_dims(model)
        if load.get("compile"):
            return (
                "transformers with compile=True holds a StaticCache of the whole static length (a power of two from "
                f"{COMPILE_MIN_LEN}, or static_cache_len), whatever the request uses"
            )
        if "sliding" not in d["layer_types"]:
            return ""
        return f"transformers keeps the last {d['sliding_window'] - 1} tokens (window - 1) in each sliding-window layer"

    def __init__(
        self,
        model,
        dtype: str | None = None,
        threads: int | None = None,
        n_ctx: int | None = None,
        attn_implementation: str = "sdpa",
        device: str = "auto",
        draft: str | None = None,
        speculative: int | None = None,
        prompt_lookup: int | None = None,
        adapter=None,
        merge_adapter: bool = False,
        compile: bool = False,
        static_cache_len: int | None = None,
    ):
        super().__init__(model)
        if draft is not None and draft not in TORCH_DTYPES and not Path(str(draft)).is_dir():  # before any loading
            raise LabError(
                f"draft={draft!r}: expected a dtype of the model's folder ({', '.join(TORCH_DTYPES)}) or a Hugging "
                "Face folder of a model with the same vocabulary"
            )
        static_cache_len = self._check_compile(compile, static_cache_len, draft, prompt_lookup)  # before loading
        if compile:
            from lablib.model.shape import model_dims

            if "sliding" in model_dims(model)["layer_types"]:
                # transformers' static cache keeps a sliding layer's position as a Python int, and torch.compile
                # guards on it: every decode step compiled a new graph until the recompile limit (8), then the step
                # ran eagerly, unseen (Gemma 3 270M, transformers 5.25, torch 2.13)
                raise LabError(
                    f"compile=True on {model.name}: its sliding-window layers recompile the decode step at every "
                    "position (transformers' static cache keeps their position as a Python int, which torch.compile "
                    "guards on), and past torch's recompile limit the step runs eagerly; compile=True runs models "
                    "whose every layer attends fully. Load it without compile="
                )
        merged = self._begin_adapter(adapter, merge_adapter)  # checked before any loading
        torch, transformers = self._import_library("torch", "transformers")
        self._torch, self._transformers = torch, transformers
        transformers.utils.logging.disable_progress_bar()
        self._path = path = merged or model.path_for("hf", self.name)
        torch.set_num_threads(self._init_threads(threads))
        self.device = torch_device(torch, device)
        self.dtype = dtype = torch_dtype(torch, self.device, dtype)
        try:  # a folder transformers cannot read (an architecture it does not know): its words, in one line
            self.tok = transformers.AutoTokenizer.from_pretrained(path)
            self.hf = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=getattr(torch, dtype), attn_implementation=attn_implementation
            )
        except (ValueError, KeyError, OSError) as e:
            raise LabError(
                f"transformers {transformers.__version__} cannot load {path} ({type(e).__name__}: {first_line(e)}); "
                "expected a causal language model folder of an architecture this transformers knows: check its "
                "config.json's model_type, or upgrade transformers"
            ) from None
        self.hf = self.hf.to(self.device).eval()
        self.peft = None  # the PeftModel around self.hf when an unmerged adapter is attached
        if self.adapter_merged:
            self._count_merged()
        elif self.adapter is not None:
            self._attach_adapter()
        trained = int(getattr(self.hf.config, "max_position_embeddings", 0) or model.max_position_embeddings)
        self.n_ctx = int(n_ctx or trained)
        self.n_vocab = int(self.hf.config.vocab_size)
        eos = self.hf.generation_config.eos_token_id
        if eos is None:
            eos = self.hf.config.eos_token_id
        self._eos = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self._pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else next(iter(self._eos), 0)
        self.settings_off = self._clean_generation_config()
        # the forward's KV-cache keyword: "cache" from transformers 5.24 on, "past_key_values" before (5.24+ still
        # takes it, with a deprecation warning, until 5.40); an unknown keyword is silently swallowed by the
        # forward's **kwargs, so a wrong name would run every chunk and prefix without its cache
        self._cache_kw = "cache" if "cache" in inspect.signature(self.hf.forward).parameters else "past_key_values"
        self._prefill_tokens: int | None = None  # tokens the last request's first forward pass received
        self._last_cache = None  # the last request's DynamicCache when it ran with a prefix cache
        self.hf.register_forward_pre_hook(self._count_prefill, with_kwargs=True)
        self._spec, self._spec_counts = self._load_speculation(draft, speculative, prompt_lookup), {}
        self._setup_compile(compile, static_cache_len)

    @staticmethod
    def _check_compile(compile: bool, static_cache_len, draft, prompt_lookup) -> int | None:
        """The compile options checked before any loading: ``static_cache_len`` (a positive whole number of tokens,
        only with ``compile=True``), and no speculation beside it. Returns ``static_cache_len`` as an int."""
        if compile not in (True, False):
            raise LabError(f"compile={compile!r}: expected True (a compiled decode step) or False (eager)")
        if static_cache_len is not None and not compile:
            raise LabError(
                f"static_cache_len={static_cache_len!r} without compile=True: the static cache length is what the "
                "compiled decode step is compiled for; add compile=True, or leave static_cache_len out"
            )
        if compile and (draft is not None or prompt_lookup is not None):
            raise LabError(
                "compile=True with draft=/prompt_lookup=: transformers' assisted generation runs on its own "
                "dynamic caches, not the compiled static-cache decode step; load one or the other"
            )
        if static_cache_len is None:
            return None
        return whole(
            static_cache_len,
            "static_cache_len",
            "a positive whole number of tokens (or leave it out: powers of two from 256 to n_ctx)",
        )

    def _setup_compile(self, compile: bool, static_cache_len: int | None) -> None:
        """transformers' ``CompileConfig`` for ``compile=True`` (None: eager), and the counters of what it
        compiled: :attr:`compile_s` (seconds, all warm-ups), :attr:`compiled_lengths` (tokens, in order)."""
        self.compile_config = None
        self.static_cache_len = static_cache_len
        self._static_caches: dict = {}  # static cache length -> the StaticCache every request of that length uses
        self.compiled_lengths: list[int] = []
        self.compile_s = 0.0
        self._request_compile_s, self._request_len, self._request_graphs = 0.0, None, None
        if not compile:
            return
        if static_cache_len is not None and static_cache_len > self.n_ctx:
            raise LabError(
                f"static_cache_len={static_cache_len} tokens is more than the context the lab enforces, n_ctx="
                f"{self.n_ctx}; give at most {self.n_ctx}, or a larger n_ctx"
            )
        # transformers' defaults (inductor, fullgraph=False), its mode on CUDA (CUDA graphs), "default" elsewhere
        # (no CUDA graphs to capture); dynamic=False: one static graph per cache length, as CUDA graphs need
        try:  # torch.compile's inductor imports setuptools (torch.utils.cpp_extension) at its first compile: now,
            # before later imports can leave setuptools' distutils shim falling back to the standard library's (seen
            # once in a test worker: AssertionError in _distutils_hack at the first compile)
            import torch.utils.cpp_extension  # noqa: F401
        except Exception as e:  # noqa: BLE001 - one message, not setuptools' assertion
            raise LabError(
                f"compile=True: torch.compile's backend could not import setuptools ({type(e).__name__}: "
                f"{str(e)[:200]}); import setuptools before anything imports distutils, or load without compile="
            ) from None
        mode = "reduce-overhead" if self.device == "cuda" else "default"
        cc = self._transformers.CompileConfig(mode=mode, dynamic=False)
        cc._compile_all_devices = True  # generate compiles by itself only on cuda, xpu, mps, tpu, neuron
        self.compile_config = cc
        # torch.compile guards on torch's thread count (GLOBAL_STATE: num_threads): a request after a change
        # recompiles inside its clock (seen here: 2 -> 1 thread, a new graph). So a compiled engine keeps the threads
        # it loaded with (automatic ones are those other processes left free then) and sets them before each request
        self.auto_threads, self._busy = False, None

    def _attach_adapter(self) -> None:
        """PEFT's ``PeftModel.from_pretrained`` on the loaded model, unmerged: its LoRA layers replace the target
        ``nn.Linear`` modules of ``self.hf`` in place (``self.hf`` stays the transformers model, now computing
        ``W x + scale * B (A x)`` in each target). Times the read and the attach (:attr:`adapter_load_s`; PEFT's
        import before the clock) and counts the LoRA tensors' bytes (:attr:`adapter_bytes`)."""
        import warnings

        from peft import PeftModel

        folder = self.adapter.path_for("peft")  # made on first use: not part of the attach
        with warnings.catch_warnings():  # PEFT 0.21 asks transformers 5 a deprecated is_gradient_checkpointing
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            t0 = now()
            peft = PeftModel.from_pretrained(self.hf, folder, is_trainable=False).to(self.device).eval()
            self.adapter_load_s = now() - t0
        if peft.get_base_model() is not self.hf:  # pragma: no cover - PEFT injects in place
            raise LabError("PEFT did not attach the adapter to the loaded model in place")
        self.peft = peft
        self.adapter_bytes = sum(p.numel() * p.element_size() for n, p in self.hf.named_parameters() if ".lora_" in n)

    def _count_merged(self) -> None:
        """:attr:`adapter_bytes` of a merged adapter: the merged folder's weights as this engine holds them (at
        its dtype) less the base folder's."""
        from lablib.model.formats import weight_tensors

        size = TORCH_DTYPES[self.dtype][1]

        def held(path) -> int:
            return sum(n * size if t in FLOAT_TYPES else b for _, t, n, b in weight_tensors(path))

        self.adapter_bytes = held(self._path) - held(self.model.path_for("hf", self.name))

    def _count_prefill(self, module, args, kwargs):
        """Forward pre-hook: the first forward pass of a request (its prefill) records how many
        token positions it received; later passes cost one comparison."""
        if self._prefill_tokens is None:
            x = kwargs.get("input_ids")
            if x is None and args:
                x = args[0]
            self._prefill_tokens = int(x.shape[-1]) if x is not None else 0

    def _clean_generation_config(self) -> list[str]:
        """Replace the model's generation config (the folder's generation_config.json) by one that
        holds only token ids; returns what the folder asked for that is now switched off.

        ``generate`` fills every setting the lab leaves unset (None) from the model's generation
        config, then from transformers' global defaults (transformers 5.24,
        ``GenerationMixin._prepare_generation_config``): a folder's ``repetition_penalty`` 1.3,
        ``min_length``, ``suppress_tokens``... would apply. With this clean config the only default
        left that changes sampling is ``top_k`` 50, which :meth:`_generation_config` sets itself.
        """
        gc_cls = self._transformers.GenerationConfig
        defaults = gc_cls._get_default_generation_params()
        token_keys = {"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"}
        asked = self.hf.generation_config.to_diff_dict() if self.hf.generation_config is not None else {}
        off = [
            f"{k}={v!r} (model folder's generation_config.json)"
            for k, v in sorted(asked.items())
            if k not in token_keys
            and not k.startswith("_")
            and k != "transformers_version"
            and v is not None
            and v is not False
            and v != defaults.get(k)
        ]
        self.hf.generation_config = gc_cls(
            bos_token_id=self.bos_id, eos_token_id=sorted(self._eos) or None, pad_token_id=self._pad
        )
        return off + [f"top_k={defaults['top_k']} (transformers' default when sampling; one-request path only)"]

    def _load_speculation(self, draft, speculative, prompt_lookup) -> dict:
        """The keywords ``generate`` takes for the speculation asked at load ({}: none); loads the draft."""
        if draft is None and prompt_lookup is None:
            if speculative is not None:
                raise LabError(f"speculative={speculative!r} without draft=: expected draft='bfloat16' (or a folder)")
            return {}
        if draft is not None and prompt_lookup is not None:
            raise LabError("draft= and prompt_lookup= together: transformers runs one candidate generator; pick one")
        if prompt_lookup is not None:
            k = whole(prompt_lookup, "prompt_lookup", "a whole number of tokens looked up per step, at least 1")
            return {"prompt_lookup_num_tokens": k}
        k = whole(
            4 if speculative is None else speculative,
            "speculative",
            "a whole number of draft tokens per step, at least 1",
        )
        torch, transformers = self._torch, self._transformers
        if draft in TORCH_DTYPES:  # the folder the target was loaded from (a merged adapter's, with one)
            folder, dtype = self._path, draft
        else:  # a folder (checked before loading)
            folder, dtype = str(draft), self.dtype
        asst = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(self.device)
        if int(asst.config.vocab_size) != self.n_vocab:
            raise LabError(
                f"draft {folder}: vocabulary of {asst.config.vocab_size} tokens, the target's has {self.n_vocab}; "
                "expected a draft of the same vocabulary (the same model family)"
            )
        asst.generation_config = transformers.GenerationConfig(
            bos_token_id=self.bos_id,
            eos_token_id=sorted(self._eos) or None,
            pad_token_id=self._pad,
            num_assistant_tokens=k,
            num_assistant_tokens_schedule="constant",
            assistant_confidence_threshold=0.0,
        )
        self._draft_desc = {"draft": str(draft), "draft_folder": folder, "draft_dtype": dtype}
        return {"assistant_model": asst.eval()}

    def speculation(self) -> dict:
        """What this engine speculates with ({}: none): method, draft, tokens per step."""
        if "prompt_lookup_num_tokens" in self._spec:
            return {"method": "prompt lookup (transformers)", "k": self._spec["prompt_lookup_num_tokens"]}
        if self._spec:
            k = self._spec["assistant_model"].generation_config.num_assistant_tokens
            return {"method": "assisted generation (transformers)", "k": k, **self._draft_desc}
        return {}

    def _apply_threads(self, n: int) -> None:
        self._torch.set_num_threads(n)

    # --- tokenizer -------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return list(self.tok(text, add_special_tokens=add_special)["input_ids"])

    def detokenize(self, ids) -> str:
        ids = token_ids(ids)
        self.check_ids(ids)  # the same LabError in every engine (llama.cpp's aborted the process; this one gave "")
        return self.tok.decode(ids, skip_special_tokens=False)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        """transformers' own path: ``apply_chat_template(tokenize=True)`` (adds no
        special tokens beyond what the template writes)."""
        out = self.tok.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=True
        )
        return list(out["input_ids"])

    @property
    def bos_id(self) -> int | None:
        return self.tok.bos_token_id if self.tok.bos_token_id is not None else self.hf.config.bos_token_id

    @property
    def eos_ids(self) -> set[int]:
        return self._eos

    def info(self) -> EngineInfo:
        torch = self._torch
        return EngineInfo(
            name=self.name,
            version=self.library_version,
            backend=f"torch {torch.__version__} {self.device}",
            device=self.device,
            dtype=self.dtype,
            threads=self.threads,
            n_ctx=self.n_ctx,
            weights=self.dtype,
            compute_dtype=self.dtype,
            flags={
                "attn_implementation": self.hf.config._attn_implementation,
                "torch_threads": torch.get_num_threads(),
                "threads_auto": self.auto_threads,
                "max_threads": self.max_threads,
                "sampling": DEFINITION,
                "settings_off": list(self.settings_off),
                **({"speculative": self.speculation()} if self._spec else {}),
                **({"compile": self.compile_flags()} if self.compile_config is not None else {}),
                **self.adapter_flags(),
            },
        )

    def effective_config(self) -> dict:
        """The config as transformers uses it: what its config object holds (:func:`config_settings`), with the
        RoPE bases read back from the rotary embeddings the model built (each ``inv_freq`` buffer: one, or one
        per layer type, ``full_attention_inv_freq`` and ``sliding_attention_inv_freq`` in Gemma 3) and the
        sliding layers counted from the attention modules that hold a ``sliding_window``."""
        from lablib.model.formats import config_settings

        c = self.hf.config
        out = config_settings(c.to_dict())
        windows = [
            getattr(m, "sliding_window", None)
            for n, m in self.hf.named_modules()
            if n.endswith("self_attn") and hasattr(m, "sliding_window")
        ]
        if windows:  # what the attention modules were built with (a window of any length counts)
            out["sliding_layers"] = sum(bool(w) for w in windows)
            out["sliding_window"] = max((w for w in windows if w), default=0)
        bases = {}
        for name, buf in self.hf.named_buffers():  # model.rotary_emb.inv_freq, ...sliding_attention_inv_freq
            leaf = name.rsplit(".", 1)[-1]
            if leaf.endswith("inv_freq") and "original" not in leaf and buf.numel() > 1:
                kind = leaf[: -len("inv_freq")].rstrip("_") or "default"
                rot_dim = 2 * buf.numel()  # partial rotary: fewer frequencies than head_dim / 2
                bases.setdefault(kind, float(f"{rope_base_from_inv_freq(buf, rot_dim):.5g}"))  # float32 round-off
        if bases:
            out["rope_theta"] = bases.get("full_attention", bases.get("default", out["rope_theta"]))
            if out["sliding_layers"]:
                out["rope_theta_sliding"] = bases.get("sliding_attention", bases.get("default", out["rope_theta"]))
        eos = c.eos_token_id
        out["eos_id"] = eos[0] if isinstance(eos, list) else eos
        out["bos_id"] = c.bos_token_id
        return out

    # --- generation -------------------------------------------------------
    def engine_counters(self) -> dict:
        """Counted at the model's forward for the last request: ``n_p_eval``, the prompt tokens its
        prefill forward pass received (the uncached part of the prompt). With ``compile=True`` also
        ``static_cache_len`` (tokens: the static cache the request ran on), ``compile_s_request`` (seconds the
        request's own warm-up compiled for before its clock started; 0.0 when its length was compiled already),
        ``compile_s`` (seconds, every compile of this engine so far), ``compiled_lengths`` and ``graphs_in_request``
        (graphs torch.compile made while the request's clock ran, torch._dynamo's own count: 0 unless something
        changed what the graph is guarded on; a compile inside a measured request, not hidden)."""
        out = {"n_p_eval": self._prefill_tokens or 0, **self._spec_counts}
        if self.compile_config is not None:
            out.update(
                static_cache_len=self._request_len,
                compile_s_request=self._request_compile_s,
                compile_s=self.compile_s,
                compiled_lengths=list(self.compiled_lengths),
                graphs_in_request=self._request_graphs,
            )
        return out

    def compile_flags(self) -> dict:
        """What ``compile=True`` loaded (``info().flags["compile"]``, each row's manifest): transformers'
        CompileConfig (mode, backend, dynamic), the static cache lengths it compiles for, those compiled so far
        and their seconds."""
        cc = self.compile_config
        return {
            "mode": cc.mode,
            "backend": str(cc.backend),
            "dynamic": cc.dynamic,
            "static_cache_len": self.static_cache_len or f"powers of two from {COMPILE_MIN_LEN} to n_ctx {self.n_ctx}",
            "compiled_lengths": list(self.compiled_lengths),
            "compile_s": round(self.compile_s, 3),
        }

    def static_length(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """The static cache length (tokens) a request of ``prompt_tokens`` + ``max_new_tokens`` runs on with
        ``compile=True``: ``static_cache_len`` when loaded with one (LabError for a request that needs more), else
        the smallest power of two from :data:`COMPILE_MIN_LEN` that holds it, at most ``n_ctx``.

        Why powers of two: the compiled decode step has static shapes (``dynamic=False``, what CUDA graphs need),
        so every length is a compile of its own (66-74 s on 2 CPU cores from a cold inductor cache) and a graph
        torch keeps (``torch._dynamo.config.recompile_limit``, 8 by default); powers of two give 6 lengths from
        256 to SmolLM2's 8,192, where an exact length per request would compile in every sweep step. The price
        is attention over at most twice the positions a request needs (the step attends over the whole static
        cache, the positions past the request masked). From 256: the lab's short requests (its question and up
        to a couple of hundred new tokens) share one length."""
        need = prompt_tokens + max_new_tokens
        if self.static_cache_len is not None:
            if need > self.static_cache_len:
                raise LabError(
                    f"prompt {prompt_tokens} + output {max_new_tokens} = {need} tokens, more than the static cache "
                    f"this engine compiles for (static_cache_len={self.static_cache_len}); load it with a larger "
                    "static_cache_len, or without one (powers of two up to n_ctx)"
                )
            return self.static_cache_len
        return power_of_two_length(need, self.n_ctx)

    def generate(self, ids, cfg: GenerationConfig | None = None, t_submit=None, prefix_cache=None, keep=False):
        """:meth:`Engine.generate`; with ``compile=True``, first, before the request's clock starts (``t_submit``
        when not given, so TTFT and the queue wait leave it out), the decode step is compiled for the static cache
        length the request needs when no request needed it before (:meth:`_warm_up`). A request refused (a
        prefix cache, a context overflow, settings the engine cannot run) compiles nothing."""
        self.check_open()
        self._request_compile_s, self._request_len, self._request_graphs = 0.0, None, None
        if self.compile_config is None:
            return super().generate(ids, cfg, t_submit=t_submit, prefix_cache=prefix_cache, keep=keep)
        from torch._dynamo.utils import counters

        if prefix_cache is not None:
            raise LabError(
                "transformers loaded with compile=True runs no prefix cache: its compiled decode step runs on a "
                "static cache, a kept prefix is a DynamicCache; load the engine without compile= for prefix caching"
            )
        if self._torch.get_num_threads() != self.threads:  # set by another engine in this process
            self._torch.set_num_threads(self.threads)
        cfg = cfg or GenerationConfig()
        self.check_generation(cfg)
        self.check_constraint(cfg)
        self.check_adapter_request(cfg)
        ids = token_ids(ids)
        if ids:  # an empty prompt: Engine.generate says so
            self.check_ids(ids)
            self.check_context(len(ids), cfg.max_new_tokens)
            self._request_len = self.static_length(len(ids), cfg.max_new_tokens)
            self._warm_up(ids, self._request_len)

        made = counters["stats"]["unique_graphs"]
        trace = super().generate(ids, cfg, t_submit=t_submit, prefix_cache=prefix_cache, keep=keep)
        self._request_graphs = counters["stats"]["unique_graphs"] - made
        return trace

    def static_cache(self, length: int):
        """The ``StaticCache`` of ``length`` tokens the compiled requests of that length run on (empty between
        requests), for a bare timing of the same compiled ``generate`` (benchmarks/compiled_decode.py); LabError
        for a length not compiled yet."""
        if length not in self._static_caches:
            raise LabError(
                f"static_cache({length}): this engine has compiled {self.compiled_lengths or 'no length'} "
                "(compile=True compiles a length at the first request that needs it)"
            )
        return self._static_caches[length]

    def _warm_up(self, ids, length: int) -> None:
        """Compile the decode step for a static cache of ``length`` tokens, once: a greedy ``generate`` of
        :data:`COMPILE_WARM_STEPS` + 1 tokens on the request's own prompt (cut to fit) with the StaticCache that
        every later request of this length reuses (reset after each), so that on CUDA its graphs are recorded
        at the addresses the measured requests use. Its seconds go to :attr:`compile_s` and the request's
        ``compile_s_request``. Raises LabError when torch would keep no more graphs (its recompile limit: it would
        run the step eagerly, unseen) or when transformers did not compile (its criteria unmet)."""
        if length in self._static_caches:
            return
        torch, transformers = self._torch, self._transformers
        limit = int(getattr(torch._dynamo.config, "recompile_limit", 8))
        if len(self.compiled_lengths) >= limit:
            raise LabError(
                f"transformers with compile=True has compiled {len(self.compiled_lengths)} static cache lengths "
                f"({', '.join(map(str, self.compiled_lengths))} tokens), torch's recompile_limit; a new length "
                f"({length}) would run eagerly. Load it with static_cache_len= (one length), or a smaller n_ctx"
            )
        cache = transformers.StaticCache(config=self.hf.config, max_cache_len=length)
        n_new = max(1, min(COMPILE_WARM_STEPS + 1, length - 1))
        x = torch.tensor([list(ids)[: max(1, length - n_new)]], dtype=torch.long, device=self.device)
        gen = transformers.GenerationConfig(
            max_new_tokens=n_new,
            do_sample=False,
            eos_token_id=[],
            pad_token_id=self._pad,
            compile_config=self.compile_config,
        )
        t0 = now()
        with torch.inference_mode():
            try:
                self.hf.generate(x, attention_mask=torch.ones_like(x), generation_config=gen, **{self._cache_kw: cache})
            finally:
                cache.reset()  # in inference mode: the cache's tensors are inference tensors
        seconds = now() - t0
        if getattr(self.hf, "_compiled_call", None) is None:
            raise LabError(
                f"transformers {transformers.__version__} did not compile the decode step of {self.model.name} "
                "(its auto-compile criteria, GenerationMixin._valid_auto_compile_criteria, were not met); load the "
                "engine without compile="
            )
        self._static_caches[length] = cache
        self.compiled_lengths.append(length)
        self.compile_s += seconds
        self._request_compile_s = seconds

    def _cache_prefix(self, ids) -> PrefixCache:
        from transformers import DynamicCache

        torch = self._torch
        cache = DynamicCache(config=self.hf.config)
        with torch.inference_mode():
            self.hf(
                torch.tensor([ids], dtype=torch.long, device=self.device),
                **{self._cache_kw: cache},
                use_cache=True,
                logits_to_keep=1,
            )
        return self._kept(cache, ids)

    def _kept(self, cache, ids) -> PrefixCache:
        """A PrefixCache of ``cache``'s per-layer (keys, values), positions 0..len(ids)-1."""
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        n = kv[0][0].shape[-2]
        if n != len(ids):
            raise LabError(f"transformers' cache holds {n} positions, expected {len(ids)}")
        return PrefixCache(self.name, list(ids), state=kv, nbytes=sum(k.nbytes + v.nbytes for k, v in kv))

    def _keep_request(self, prefix_cache: PrefixCache, ids, trace: RequestTrace) -> None:
        kept = self._kept(self._last_cache, (list(ids) + trace.token_ids)[: self._last_cache.get_seq_length()])
        prefix_cache.ids, prefix_cache.state, prefix_cache.nbytes = kept.ids, kept.state, kept.nbytes
        self._last_cache = None

    def _generate(self, ids, cfg: GenerationConfig, trace: RequestTrace, prefix_cache=None) -> None:
        torch = self._torch
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        gen = self._generation_config(cfg)
        gen.prompt_lookup_num_tokens = self._spec.get("prompt_lookup_num_tokens")
        gen.return_dict_in_generate = True  # the request's cache comes back with its ids (last_kv_bytes)
        if not cfg.greedy:
            torch.manual_seed(cfg.seed)
        kw = {}
        self._last_cache = None
        with torch.inference_mode():
            trace.start()
            self._prefill_tokens = None  # the next forward pass is this request's prefill
            cached = prefix_cache.reusable(ids) if prefix_cache is not None else 0
            if prefix_cache is not None:
                from transformers import DynamicCache

                # the request's own cache: the first `cached` positions of each layer, copied in
                # as the first update (a concatenation); the kept prefix is never written
                data = [(k[..., :cached, :], v[..., :cached, :]) for k, v in prefix_cache.state] if cached else None
                kw[self._cache_kw] = self._last_cache = DynamicCache(data, config=self.hf.config)
                trace.cached_tokens = cached
            if self.compile_config is not None:  # the StaticCache of its length, compiled by generate()
                cache = self._static_caches[self._request_len]
                kw[self._cache_kw] = cache
                gen.compile_config = self.compile_config
            if self._spec and (prefix_cache is not None or not cfg.greedy):
                raise LabError("transformers with draft=/prompt_lookup= runs greedy requests without a prefix cache")
            if cfg.constraint is not None:
                if self._spec:
                    raise LabError("transformers with draft=/prompt_lookup= runs no constraint; load it without them")
                kw["logits_processor"] = self._transformers.LogitsProcessorList([self._guidance(cfg.constraint, ids)])
            else:
                self.constraint_stats = {}
            streamer = _TokenIdStreamer(trace)
            try:
                out = self.hf.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    generation_config=gen,
                    streamer=streamer,
                    **kw,
                    **{k: v for k, v in self._spec.items() if k == "assistant_model"},
                )
            finally:
                if self.compile_config is not None:  # after the last token: empty for the next request
                    cache.reset()
        # the cache comes back with the ids (return_dict_in_generate): what the request held, last_kv_bytes; its
        # key is "cache" from transformers 5.2x on, "past_key_values" before
        keys = set(out.keys()) if hasattr(out, "keys") else set()  # (reading past_key_values on 5.2x warns)
        key = "cache" if "cache" in keys else "past_key_values" if "past_key_values" in keys else None
        self.last_kv_bytes = _cache_bytes(out[key]) if key else None
        self._spec_counts = self._spec_counters(streamer.puts, len(ids), cfg.max_new_tokens) if self._spec else {}
        last = trace.token_ids[-1] if trace.token_ids else None
        trace.finish_reason = "stop" if (not cfg.ignore_eos and last in self._eos) else "length"

    def _spec_counters(self, puts: list[int], prompt: int, max_new: int) -> dict:
        """Counters of a speculative request from the streamer's puts (tokens per target pass):
        ``accepted_per_pass`` (a put's tokens less the target's own one), ``draft_n_accepted``,
        ``target_passes``; with a draft model also ``drafted_per_pass`` and ``draft_n``: the constant schedule's
        k, cut where the output budget ends (transformers drafts ``min(k, max_length - length - 1)``).
        Prompt lookup drafts as many tokens as its match gives: transformers does not say, so no ``draft_n``."""
        accepted = [n - 1 for n in puts]
        out = {"target_passes": len(puts), "accepted_per_pass": accepted, "draft_n_accepted": sum(accepted)}
        if "assistant_model" in self._spec:
            k, done, drafted = self.speculation()["k"], 0, []
            for n in puts:
                drafted.append(max(0, min(k, max_new - done - 1)))
                done += n
            out.update(drafted_per_pass=drafted, draft_n=sum(drafted))
        return out

    def _generation_config(self, cfg: GenerationConfig):
        """transformers' GenerationConfig for ``cfg``, the same for ``generate`` and continuous
        batching: greedy, or transformers' warpers in the lab's order (temperature, top-k, top-p:
        :data:`lablib.engines.sampling.DEFINITION`) with ``top_k`` always explicit (0 = off; left unset,
        ``generate`` would add its default 50 and continuous batching would not). The model's
        own generation config holds token ids only (:meth:`_clean_generation_config`).
        ignore_eos: an empty EOS list, so EOS is generated like any token and generation goes
        on (as vLLM's ignore_eos), not masked."""
        sampling = {} if cfg.greedy else {"temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p}
        return self._transformers.GenerationConfig(
            max_new_tokens=cfg.max_new_tokens,
            do_sample=not cfg.greedy,
            **sampling,
            eos_token_id=[] if cfg.ignore_eos else sorted(self._eos),
            pad_token_id=self._pad,
        )

    def batch_session(self, cfg: GenerationConfig, max_sequences: int, max_seq_tokens: int) -> TransformersBatchSession:
        """A continuous-batching session: up to ``max_sequences`` requests per forward pass.
        ``max_seq_tokens`` (longest prompt + output, tokens) sizes the paged KV cache and is
        checked against ``n_ctx``."""
        self.check_context(max_seq_tokens, 0)
        self.check_adapter_request(cfg)
        if self.compile_config is not None:
            raise LabError(
                "transformers loaded with compile=True has no batched mode in the lab: continuous batching runs its "
                "own paged cache, not the compiled static-cache decode step; use mode='serial', or load the engine "
                "without compile= for batched mode"
            )
        if cfg.constraint is not None:
            raise LabError(
                "transformers' continuous batching runs no constraint (no logits processor); use mode='serial'"
            )
        return TransformersBatchSession(self, cfg, max_sequences, max_seq_tokens)

    def _guidance(self, constraint, ids) -> _GuidanceMask:
        """A logits processor enforcing ``constraint`` with llguidance: the engine's LLTokenizer (made once, from
        this tokenizer) and a matcher per schema compiled once and deep-copied per request; the time this request
        paid for both goes to :attr:`constraint_stats`. Raises ConstraintError for a grammar llguidance rejects or
        compiles only with a warning (it would drop the part it warns about)."""
        import json

        import llguidance
        import llguidance.hf

        from lablib.engines.base import ConstraintError, schema_part

        t0 = now()
        cached = constraint.key in self.__dict__.setdefault("_matchers", {})
        if getattr(self, "_lltok", None) is None:
            self._lltok = llguidance.hf.from_tokenizer(self.tok, n_vocab=self.n_vocab, eos_token=sorted(self._eos))

        def grammar(kind, spec):
            text = json.dumps(spec) if kind == "json_schema" else spec
            return llguidance.grammar_from(kind, text)

        def problems(kind, spec) -> list[str]:
            # (is_error, the error or warning messages); a warning means a part would be dropped: refused too
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar(kind, spec), self._lltok)
            return list(messages) or (["llguidance rejected the grammar"] if is_error else [])

        if not cached:
            found = problems(constraint.kind, constraint.spec)
            if found:
                part = None
                if constraint.kind == "json_schema":
                    part = schema_part(constraint.spec, lambda sub: bool(problems("json_schema", sub)))
                raise ConstraintError(self.name, constraint, "llguidance: " + "; ".join(found), part)
            self._matchers[constraint.key] = llguidance.LLMatcher(
                self._lltok, grammar(constraint.kind, constraint.spec)
            )
        matcher = self._matchers[constraint.key].deep_copy()
        self.constraint_stats = {"compile_s": now() - t0, "compile_cached": cached}
        return _GuidanceMask(matcher, len(ids), self.n_vocab)

    def logits(self, ids) -> np.ndarray:
        """Teacher-forced logits for ``ids``: a float32 numpy array [len(ids), vocab]."""
        self.check_ids(list(ids))
        torch = self._torch
        with torch.inference_mode():
            out = self.hf(torch.tensor([list(ids)], dtype=torch.long, device=self.device))
        return out.logits[0].float().cpu().numpy()

    def iter_logits(self, ids, chunk: int = 64):
        """Teacher-forced logits, ``chunk`` positions per forward pass over one DynamicCache:
        yields float32 numpy arrays [<= chunk, vocab] (see :meth:`Engine.iter_logits`)."""
        from transformers import DynamicCache

        ids = token_ids(ids)
        self.check_ids(ids)
        torch = self._torch
        cache = DynamicCache(config=self.hf.config)
        for at in range(0, len(ids), chunk):
            with torch.inference_mode():  # per chunk: the mode must not leak to the caller between yields
                out = self.hf(
                    torch.tensor([ids[at : at + chunk]], dtype=torch.long, device=self.device),
                    **{self._cache_kw: cache},
                    use_cache=True,
                )
                block = out.logits[0].float().cpu().numpy()
            del out
            yield block

    def close(self) -> None:
        self.hf = self.peft = None


# the oldest transformers whose continuous batching the lab drives (pyproject's floor): the first whose
# ContinuousBatchingConfig takes max_requests_per_batch and safety_margin (5.11.0), with the manager's warmup (5.7),
# background_thread_status, stop(hard_stop=) and destroy (5.10)
CB_MIN_TRANSFORMERS = "5.11.0"


def continuous_batching_config(cls, page_size: int, **settings):
    """transformers' ``ContinuousBatchingConfig`` (``cls``, a dataclass) with the lab's settings, under the names
    this transformers gives them (read from the class's fields, not from a version string):

    - the page size (tokens of one layer in one page) is ``page_size`` from transformers 5.18 and ``block_size``
      from 5.4 (where the class appeared) to 5.17; 5.18+ still takes ``block_size`` but warns;
    - ``auto_switch_to_flash`` (5.19+) is dropped where the class has no such field (see
      :class:`TransformersBatchSession` for what the lab does there instead).

    Any other setting the class lacks raises :class:`LabError` naming it and the lab's floor
    (:data:`CB_MIN_TRANSFORMERS`), rather than running with transformers' default in its place."""
    fields = {f.name for f in dataclasses.fields(cls)}
    kw = {"page_size" if "page_size" in fields else "block_size": page_size}
    missing = sorted(k for k in settings if k not in fields and k != "auto_switch_to_flash")
    if missing:
        import transformers

        raise LabError(
            f"transformers {transformers.__version__}: its ContinuousBatchingConfig has no {', '.join(missing)}; "
            f"the lab's batched mode needs transformers >= {CB_MIN_TRANSFORMERS}"
        )
    kw.update((k, v) for k, v in settings.items() if k in fields)
    return cls(**kw)


class TransformersBatchSession:
    """transformers' ContinuousBatchingManager behind the lab's session interface.

    The paged cache holds ``max_sequences`` requests of ``max_seq_tokens`` (pages
    of ``page_size`` tokens, one spare page each), so no safety margin is kept
    back (with transformers' default of 15% free pages, new arrivals would wait
    while a full cache decodes); prefix sharing is off (no request reuses
    another's KV cache); ``max_batch_tokens`` bounds the tokens of one forward
    pass (as llama.cpp's n_batch). :meth:`step` waits for the next outputs of
    the manager's thread, stamps each new token id with the lab's clock as it
    arrives here, and returns the traces that finished. ``t_start`` is the
    manager's own stamp of the moment the scheduler took the request out of its
    waiting queue (``lifespan[0]``, ``time.perf_counter`` in this process: the
    lab's clock). ``stats``, counted in the scheduler: ``steps`` (forward
    passes), ``max_sequences_per_step`` (most requests in one forward pass),
    ``max_decode_sequences_per_step`` (of those, most already decoding),
    ``max_tokens_per_step`` (most query tokens in one pass). Sampling draws every
    sequence from one torch generator seeded with ``cfg.seed``.

    Across transformers 5.11-5.25 (:func:`continuous_batching_config` maps the settings): transformers 5.15 to
    5.18 switch a model that supports flash attention to it whenever flash-attn is installed (a CUDA machine),
    and only 5.19 added ``auto_switch_to_flash=False``; there the session puts the model on the paged form of
    its own attention (``paged|sdpa``, what those versions run on CPU anyway) before the manager starts, so
    that they keep it, and gives it back its own at :meth:`close`. The attention the session ran is in
    ``stats``' engine description.
    """

    timeout_s = 600.0  # longest wait for one step's outputs before giving up

    def __init__(
        self,
        engine: TransformersEngine,
        cfg: GenerationConfig,
        max_sequences: int,
        max_seq_tokens: int,
        page_size: int = 32,
        max_batch_tokens: int = 512,
    ):
        try:
            from transformers import ContinuousBatchingConfig
        except ImportError:  # before 5.4: settings in the GenerationConfig, another manager API
            raise LabError(
                f"transformers {engine._transformers.__version__} has no ContinuousBatchingConfig; the lab's batched "
                f"mode needs transformers >= {CB_MIN_TRANSFORMERS}"
            ) from None

        torch = engine._torch
        self.engine, self.cfg = engine, cfg
        self.manager = None
        pages = -(-max_seq_tokens // page_size) + 1  # ceil, plus one spare page per request
        cb = continuous_batching_config(
            ContinuousBatchingConfig,
            page_size=page_size,
            num_blocks=max_sequences * pages,
            safety_margin=0.0,
            max_batch_tokens=max(max_batch_tokens, max_sequences),
            max_requests_per_batch=max_sequences,
            max_blocks_per_request=0,
            allow_block_sharing=False,
            use_async_batching=False,
            use_cuda_graph=False,
            auto_switch_to_flash=False,
            seed=cfg.seed,
        )
        # 5.15-5.18 (no auto_switch_to_flash): the paged form of the model's own attention keeps them off flash
        attn = engine.hf.config._attn_implementation
        self._attn_restore = None
        if not hasattr(cb, "auto_switch_to_flash") and not attn.startswith("paged|") and "flash" not in attn:
            engine.hf.set_attn_implementation(f"paged|{attn}")
            self._attn_restore = attn
        if not cfg.greedy:
            torch.manual_seed(cfg.seed)
        self._traces: dict[str, RequestTrace] = {}
        self._n = 0
        try:
            manager = engine.hf.init_continuous_batching(
                generation_config=engine._generation_config(cfg), continuous_batching_config=cb
            )
            manager.warmup()  # builds the cache, scheduler and batch processor in this thread
            self.stats = BatchStats.counters(
                engine,
                f"transformers ContinuousBatchingManager (paged cache, attn {engine.hf.config._attn_implementation})",
                "max_decode_sequences_per_step",
                "max_tokens_per_step",
            )
            self._count_schedule(manager.batch_processor.scheduler)
        except BaseException:
            self.close()  # the model's own attention back
            raise
        self.manager = manager
        self.manager.start()

    def _count_schedule(self, scheduler) -> None:
        """Count, per forward pass, the requests the scheduler put in it (engine state, not clocks)."""
        schedule, st = scheduler.schedule_batch, self.stats

        def counted(*args, **kw):
            out = schedule(*args, **kw)
            reqs = out[0]
            if reqs:  # a request with generated tokens is decoding; the others are prefilling
                decoding = sum(1 for r in reqs if r.state.generated_len() > 0)
                st["steps"] += 1
                st["max_sequences_per_step"] = max(st["max_sequences_per_step"], len(reqs))
                st["max_decode_sequences_per_step"] = max(st["max_decode_sequences_per_step"], decoding)
                st["max_tokens_per_step"] = max(st["max_tokens_per_step"], out[2])
                st["prompt_tokens"] += sum(r.query_length for r in reqs if r.state.generated_len() == 0)
                st["generated_tokens"] += sum(1 for r in reqs if r.has_new_token)
            return out

        scheduler.schedule_batch = counted

    @property
    def pending(self) -> int:
        """Requests submitted and not yet finished."""
        return len(self._traces)

    def submit(self, ids: list[int], trace: RequestTrace) -> None:
        """Queue prompt ``ids`` with the manager; ``trace`` receives t_start and the token events."""
        rid = f"lab_{self._n}"
        self._n += 1
        eos = [] if self.cfg.ignore_eos else sorted(self.engine.eos_ids)
        got = self.manager.add_request(
            list(ids), request_id=rid, max_new_tokens=self.cfg.max_new_tokens, streaming=True, eos_token_id=eos
        )
        if got is None:
            status = self.manager.background_thread_status
            why = status.can_accept_new_requests() if hasattr(status, "can_accept_new_requests") else None  # 5.17+
            raise LabError(
                "transformers' continuous-batching manager refused the request "
                f"(state: {why or f'thread status {status.local_status}'})"
            )
        self._traces[rid] = trace

    def step(self) -> list[RequestTrace]:
        """Wait for the next outputs of the manager's thread; the traces finished, in order."""
        if not self._traces:
            return []
        out = self.manager.get_result(timeout=self.timeout_s)
        if out is None:
            err = self.manager.background_thread_status.fatal_error
            state = (
                f"its thread stopped ({err})"
                if not self.manager.is_running()
                else f"no output for {self.timeout_s:.0f} s"
            )
            raise LabError(f"transformers' continuous batching gave up: {state}")
        finished = []
        while out is not None:
            t = now()
            trace = self._traces.get(out.request_id)
            if out.error is not None:
                raise LabError(f"transformers continuous batching failed on a request: {out.error}")
            if trace is not None:
                if trace.t_start is None:
                    trace.start(out.lifespan[0])
                for tok in out.generated_tokens[trace.output_tokens :]:
                    trace.token(tok, t)
                if out.is_finished():
                    last = trace.token_ids[-1] if trace.token_ids else None
                    eos = not self.cfg.ignore_eos and last in self.engine.eos_ids
                    trace.finish_reason = "stop" if eos else "length"
                    finished.append(self._traces.pop(out.request_id))
            out = self.manager.get_result(timeout=0)  # whatever else is already there, no wait
        return finished

    def close(self) -> None:
        """Stop the manager's thread (unfinished requests are dropped) and free its cache."""
        if self.manager is not None:
            self.manager.stop(block=True, hard_stop=bool(self._traces))
            self.manager.destroy()
            self.manager = None
            self._traces.clear()
        if self._attn_restore is not None:
            self.engine.hf.set_attn_implementation(self._attn_restore)
            self._attn_restore = None
