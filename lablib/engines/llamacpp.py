"""llama.cpp through llama-cpp-python: GGUF models, quantized CPU kernels.

The ``Llama`` object loads the model, owns the context and the tokenizer; the
generation loop is llama.cpp's own C API (``llama_decode`` on a batch, a
``llama_sampler`` chain), so each token id gets its timestamp the moment the
sampler returns it, with no Python text processing in between. The KV cache
is cleared before every request (``llama_memory_clear``): ``Llama.generate``
would otherwise reuse the longest common prefix of the previous prompt and
show a near-zero prefill (tests/data/cases/README.md, "cached prefill").

Prefix caching, only when asked (``generate(ids, prefix_cache=...)``, lab 08): a
:class:`~lablib.engines.base.PrefixCache` holds a sequence's state as llama.cpp saves it
(``llama_state_seq_get_data``: its KV cells, in host memory, as llama-server's slot save and
prompt cache keep them); a request restores it into its emptied sequence
(``llama_state_seq_set_data``), drops the cells past the common prefix
(``llama_memory_seq_rm``) and prefills the rest. llama.cpp's perf counter ``n_p_eval`` then
counts only the uncached tokens.

The context is sized explicitly (``n_ctx``, default: the model's trained
context up to 8192 tokens, since the KV cache is reserved for all of it), not
llama-cpp-python's default of 512 tokens.

Batched mode (:meth:`LlamaCppEngine.batch_session`) is llama.cpp's own
multi-sequence decode, as llama-server runs its slots: one ``llama_batch``
carries one decode token for every running sequence plus prompt chunks of
newly admitted ones (each token tagged with its ``seq_id``), one
``llama_decode`` advances them all, each sequence samples from its own
``llama_sampler`` chain at its batch index, and a finished sequence's KV cells
are freed with ``llama_memory_seq_rm``. Everything runs in the calling thread:
a ``Llama`` object must never be used from two threads.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from lablib.checks import whole
from lablib.children import swallowed_interrupts_sent_again
from lablib.engines.base import BatchStats, Engine, EngineInfo, GenerationConfig, PrefixCache, token_ids
from lablib.engines.sampling import DEFINITION
from lablib.errors import ContextOverflowError, LabError
from lablib.model.formats import FLOAT_TYPES, gguf_config
from lablib.model.shape import model_shape
from lablib.results.trace import RequestTrace, now

if TYPE_CHECKING:
    import numpy as np

DEFAULT_N_CTX = 8192  # SmolLM2's trained context; pass n_ctx for longer prompts
GRAPH_RESERVE = 32 * 2**20  # bytes of llama.cpp's compute graph for a small model
KV_PAD = 256  # llama.cpp pads a context, a sequence's cells and its sliding-window cache to 256 cells


def _pad(n: int, to: int = KV_PAD) -> int:
    return -(-int(n) // to) * to


def llama_kv_cells(
    model, n_ctx: int, n_seq: int = 1, n_ubatch: int = 512, swa_full: bool = True, unified: bool = False
) -> dict:
    """The KV cells llama.cpp allocates per layer kind, and their bytes (f16 K and V), for a context of
    ``n_ctx`` tokens shared by ``n_seq`` sequences: {"full": cells of each full-attention layer, "sliding":
    cells of each sliding-window layer (0: none), "bytes": all layers, "layers": {kind: count}}.

    llama.cpp (llama-context.cpp, llama-kv-cache-iswa.cpp, the version llama-cpp-python 0.3.36 vendors): the
    context is padded to 256; without a unified cache each sequence gets a stream of pad(n_ctx / n_seq) cells;
    a sliding-window layer gets pad(min(stream, window x (n_seq if unified else 1) + n_ubatch)) cells per
    stream, or the whole stream with ``swa_full`` ("using full-size SWA cache"), which llama-cpp-python's
    context defaults to (``llama_context_default_params``: swa_full true) and llama-server does not
    (``common_params``: swa_full false)."""
    from lablib.model.shape import kv_cache_bytes, model_dims

    d = model_dims(model)
    ctx = _pad(n_ctx)
    streams = 1 if unified else n_seq
    stream = ctx if unified else _pad(ctx // n_seq)
    types = tuple(d["layer_types"])
    window = d.get("sliding_window") or 0
    swa = 0
    if "sliding" in types and window:
        swa = stream if swa_full else _pad(min(stream, window * (n_seq if unified else 1) + n_ubatch))
    nbytes = kv_cache_bytes(d, LlamaCppEngine.kv_bytes_per_value, stream, streams, sliding_tokens=swa)
    layers = {"full": len(types) - types.count("sliding"), "sliding": types.count("sliding")}
    return {"full": stream * streams, "sliding": swa * streams, "bytes": nbytes, "layers": layers}


def _offload_device(llama_cpp) -> str:
    """The GPU backend a build offloads to, from ``llama_print_system_info`` (each backend the
    library was built with names itself there: "CUDA : ...", "Metal : ..."): cuda, metal or gpu."""
    sysinfo = llama_cpp.llama_print_system_info().decode(errors="replace").lower()
    for backend in ("cuda", "metal", "vulkan", "hip", "sycl"):
        if f"{backend} :" in sysinfo or f"{backend}:" in sysinfo:
            return backend
    return "gpu"


LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # what pyproject.toml pins and the lab builds


@functools.lru_cache(maxsize=1)
def llama_architectures() -> tuple:
    """The GGUF architecture names the built llama.cpp loads (``{ LLM_ARCH_..., "name" }`` in its
    ``src/llama-arch.cpp``); () when its source is not on this machine (then nothing is refused early)."""
    import re

    from lablib.build.llama import BuildError, source_tree

    try:
        text = (source_tree() / "src" / "llama-arch.cpp").read_text(encoding="utf-8", errors="replace")
    except (BuildError, OSError):
        return ()
    return tuple(sorted(set(re.findall(r'\{\s*LLM_ARCH_\w+,\s*"([\w.-]+)"\s*\}', text))))


class _LoadLog:
    """llama.cpp's log while a model and context load, kept as text (``llama_log_set``; llama-cpp-python's own
    callback, which prints only when verbose, is put back after): what llama.cpp says it built, its
    hyperparameters (``print_info: n_swa = 512``...) and KV caches (``llama_kv_cache: size = ...``)."""

    def __init__(self, llama_cpp, echo: bool = False):
        self._lib, self._echo, self._lines = llama_cpp, echo, []

    def __enter__(self):
        import ctypes
        import sys

        def keep(level, text, user_data):
            line = text.decode("utf-8", errors="replace") if text else ""
            self._lines.append(line)
            if self._echo:
                print(line, end="", file=sys.stderr, flush=True)

        self._callback = self._lib.llama_log_callback(keep)  # referenced while llama.cpp may call it
        self._lib.llama_log_set(self._callback, ctypes.c_void_p(0))
        return self

    def __exit__(self, *exc):
        import ctypes

        from llama_cpp import _logger

        self._lib.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))

    @property
    def text(self) -> str:
        return "".join(self._lines)


def read_load_log(text: str) -> dict:
    """What llama.cpp's load log says it built: ``hparams`` ({name: value} of its ``print_info:`` lines, numbers
    as numbers) and ``kv_caches`` (one {kind "full"/"sliding", cells, layers, mib, k_type, v_type, bytes} per
    ``llama_kv_cache: size =`` line, ``cells`` of each of its ``streams``, the kind from the ``creating non-SWA`` / ``SWA KV cache`` line before it; a
    model without sliding layers has one, "full"), ``kv_bytes`` (their bytes together) and ``swa_full``
    (whether it said "using full-size SWA cache"). A cache's bytes are its cells x layers x the K and V widths
    it printed (``n_embd_k_gqa``, ``n_embd_v_gqa``) at the K and V types it printed (gguf's block sizes): the
    MiB it prints have two decimals, too coarse for a small model."""
    import re

    hp = {}
    for name, value in re.findall(r"print_info: (\w+)\s+= (.+)", text):
        value = value.strip()
        try:
            hp[name] = int(value)
        except ValueError:
            try:
                hp[name] = float(value)
            except ValueError:
                hp[name] = value
    caches, kind = [], "full"
    pattern = (
        r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +\d+/(\d+) seqs\), "
        r"K \((\w+)\): +[\d.]+ MiB, V \((\w+)\)"
    )
    for line in text.splitlines():
        m = re.search(r"creating\s+(non-SWA|SWA) KV cache", line)
        if m:
            kind = "full" if m.group(1) == "non-SWA" else "sliding"
        m = re.search(pattern, line)
        if m:  # cells of one stream; a stream per sequence without a unified cache ("2/2 seqs")
            cells, layers, streams = int(m.group(2)), int(m.group(3)), int(m.group(4))
            c = {"kind": kind, "mib": float(m.group(1)), "cells": cells, "layers": layers, "streams": streams}
            c.update(k_type=m.group(5), v_type=m.group(6))
            c["bytes"] = _cache_bytes(cells * layers * streams, hp, c) or int(round(c["mib"] * 2**20))
            caches.append(c)
    # a context opened again (n_seq_max > 1) logs its caches again: the last ones are the context's
    last = caches[-2:] if len(caches) >= 2 and caches[-1]["kind"] == "sliding" else caches[-1:]
    return {
        "hparams": hp,
        "kv_caches": last,
        "kv_bytes": sum(c["bytes"] for c in last),
        "swa_full": "using full-size SWA cache" in text,
    }


def _cache_bytes(cell_layers: int, hp: dict, cache: dict) -> int | None:
    """Bytes of ``cell_layers`` cells x layers at the K and V widths (``n_embd_k_gqa``, ``n_embd_v_gqa``: one
    number when every layer has it) and types llama.cpp printed; None when it printed a width per layer or a
    type gguf does not know."""
    import gguf

    total = 0
    for width, kind in ((hp.get("n_embd_k_gqa"), cache["k_type"]), (hp.get("n_embd_v_gqa"), cache["v_type"])):
        try:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind.upper()]]
        except KeyError:
            return None
        if not isinstance(width, int):
            return None
        total += cell_layers * width * size // block
    return total


def _load_or_say_why(log: _LoadLog, path: str, make, **kw):
    """``make(**kw)`` (a ``Llama``), or, when llama.cpp refuses the file (llama-cpp-python raises "Failed to load
    model from file"), a LabError with the reason llama.cpp logged ("error loading model: ...")."""
    try:
        return make(**kw)
    except ValueError as e:
        said = [ln.strip() for ln in log.text.splitlines() if "error" in ln.lower() or "failed" in ln.lower()]
        raise LabError(
            f"llama.cpp could not load {path}: {said[0] if said else e}; expected a GGUF file this llama.cpp "
            f"(llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}) reads"
        ) from None


class LlamaCppEngine(Engine):
    """llama.cpp engine.

    ``n_ctx``: context window in tokens (default: the trained context, at most 8192).
    ``threads``: CPU threads for decode and prefill (default: automatic, the CPUs this process may
    use less those other processes keep busy, checked before every request: ``Engine.adapt_threads``).
    ``n_batch``: prompt tokens per ``llama_decode`` call in prefill (default 512).
    ``n_seq_max``: parallel sequences the context holds (for batched decode); each gets
    ``n_ctx / n_seq_max`` KV cells.
    ``swa_full``: keep the whole context for sliding-window layers too (llama-cpp-python's default, True: a
    sequence can then be rolled back, which prefix caching and speculative decoding do); False keeps their
    window plus one micro-batch, as llama-server does (:func:`llama_kv_cells`).
    ``flash_attn``: llama.cpp's fused attention kernel (``ggml_flash_attn_ext``) instead of its products of K, the
    softmax and V; False is llama-cpp-python's default (``Llama(flash_attn=False)``); llama-server and llama.cpp's
    own tools default to "auto", which turns it on for the CPU. It changes the arithmetic, not only the speed: lab 04,
    worked example 5 (with it off, a prompt's greedy text here changed with what shared its batch; on, it did not).
    ``speculative``: draft tokens per step for llama-cpp-python's own prompt-lookup decoding
    (``Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k))``, its ``Llama.generate`` loop; greedy,
    one sequence, no prefix cache); :meth:`engine_counters` then has ``draft_n`` and ``draft_n_accepted``.
    ``adapter`` (a lablib.model.adapters.Adapter of the model, lab 11): its GGUF LoRA read with llama.cpp's
    ``llama_adapter_lora_init`` and set on the context (``llama_set_adapters_lora``, scale 1.0: llama.cpp multiplies
    it by the file's ``adapter.lora.alpha`` / rank, PEFT's ``lora_alpha / r``), applied on the fly in every
    request, logits and batched mode; with ``merge_adapter`` the GGUF ``llama-export-lora`` wrote is loaded instead
    of the base's (its merged tensors F16).
    """

    name = "llama.cpp"
    format = "gguf"
    requires = "llama_cpp"
    install_hint = "make setup (builds llama-cpp-python for this CPU)"
    kv_bytes_per_value = 2  # f16 KV cache
    reserves_kv_at_load = True  # the KV cache for all of n_ctx is allocated when the context opens
    prefix_caching = True  # a sequence's state saved and restored (llama_state_seq_get_data / set_data)
    quantizes_gguf = True  # llama_model_quantize makes the ladder's GGUF rungs (lablib.studies.quant); measured here
    speculation_methods = ("prompt lookup",)  # llama-cpp-python's LlamaPromptLookupDecoding (load with speculative=k)
    adapter_form = "gguf"  # a GGUF LoRA, llama_adapter_lora_init + llama_set_adapters_lora (lab 11)
    merged_form = "gguf"  # llama-export-lora's GGUF
    # the scale given to llama_set_adapters_lora: llama.cpp applies scale * alpha / rank when the GGUF LoRA states
    # its alpha (llama_adapter_lora_weight::get_scale), which convert_lora_to_gguf.py writes from PEFT's lora_alpha:
    # 1.0 gives PEFT's lora_alpha / r
    ADAPTER_SCALE = 1.0

    @classmethod
    def speculation_kwargs(cls, method: str, k: int, draft=None) -> dict:
        """``speculative=k``: llama-cpp-python's prompt lookup (its one draft model that needs no second model)."""
        if method not in cls.speculation_methods or draft is not None:
            return super().speculation_kwargs(f"{method} (draft={draft})" if draft else method, k)
        return {"speculative": k}

    # a GBNF grammar sampler first in the chain (llama_sampler_init_grammar): a JSON schema or a regex made GBNF by
    # llama-cpp-python's port of llama.cpp's json_schema_to_grammar.py (the regex with --raw-pattern)
    constraints = ("json_schema", "regex")

    @classmethod
    def unsupported(cls, model) -> str | None:
        """llama.cpp loads the GGUF architectures its source names (``src/llama-arch.cpp``, read from the
        source tree this environment's library was built from: :func:`llama_architectures`)."""
        why = super().unsupported(model)
        if why or not getattr(model, "gguf_path", None):
            return why
        from lablib.model.formats import gguf_facts

        arch = gguf_facts(model.gguf_path)["architecture"]
        known = llama_architectures()
        if known and arch not in known:
            return (
                f"this llama.cpp (llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}) does not know the GGUF architecture "
                f"{arch!r} of {model.name}; run it with transformers, or a newer llama.cpp"
            )
        return None

    @classmethod
    def default_n_ctx(cls, model) -> int:
        """The context when none is given, tokens: the trained context, at most 8192.

        llama.cpp reserves its KV cache for the whole context: a long-context model's trained
        length (128k, 1M tokens) would reserve gigabytes for prompts of a few hundred tokens.
        """
        return min(model.max_position_embeddings or DEFAULT_N_CTX, DEFAULT_N_CTX)

    @classmethod
    def default_load_kwargs(cls, model, concurrency: int = 1) -> dict:
        """``n_ctx`` (:meth:`default_n_ctx`) and one KV sequence per concurrent request (``n_seq_max``)."""
        return {"n_ctx": cls.default_n_ctx(model), "n_seq_max": concurrency}

    @classmethod
    def compute_dtype(cls, model, weights: str | None = None) -> str:
        """int8 when the GGUF's largest tensors (by bytes) are quantized: ggml-cpu multiplies them by
        activations quantized to int8 (Q4_1 x Q8_1 dot products, ``vec_dot_q4_1_q8_1``; VNNI where
        present); float32 for F32/F16/BF16 files."""
        biggest: dict[str, int] = {}
        for _, kind, _, nbytes in cls.weight_tensors(model, weights):
            biggest[kind] = biggest.get(kind, 0) + nbytes
        return "float32" if max(biggest, key=biggest.get) in FLOAT_TYPES else "int8"

    @classmethod
    def kv_cache_bytes(cls, model, context_tokens: int, sequences: int = 1, **load) -> int:
        """What llama.cpp allocates at load for a context of ``context_tokens`` x ``sequences``
        (:func:`llama_kv_cells`; ``swa_full`` from ``load``, default llama-cpp-python's True)."""
        return llama_kv_cells(
            model, context_tokens * sequences, sequences, load.get("n_batch", 512), load.get("swa_full", True)
        )["bytes"]

    @classmethod
    def kv_cache_note(cls, model, **load) -> str:
        from lablib.model.shape import model_dims

        d = model_dims(model)
        if "sliding" not in d["layer_types"]:
            return ""
        if load.get("swa_full", True):
            return (
                f"llama.cpp in process keeps the whole context for the {d['layer_types'].count('sliding')} sliding-window "
                f"layers too, not only their {d['sliding_window']} tokens: llama-cpp-python opens its context with "
                "swa_full=true (a full-size SWA cache, so that a sequence can be rolled back and restored: prefix "
                "caching, speculative decoding); llama-server keeps the window plus one micro-batch (swa_full=false)"
            )
        return (
            f"llama.cpp keeps {d['sliding_window']} tokens plus one micro-batch (n_ubatch), padded to {KV_PAD} cells, "
            "for each sliding-window layer (swa_full=false)"
        )

    @classmethod
    def runtime_bytes(cls, model, n_batch: int = 512, context_tokens: int = 0) -> int:
        """Logits for a whole micro-batch (n_batch x vocabulary x 4 bytes; llama.cpp caps n_batch at
        the context it was given) plus the compute graph (:data:`GRAPH_RESERVE`, about 32 MiB for
        small models): 128 MiB for SmolLM2-135M at n_batch 512."""
        n_batch = min(n_batch, context_tokens) if context_tokens else n_batch
        return n_batch * model_shape(model)["vocab"] * 4 + GRAPH_RESERVE

    # llama-cpp-python's and llama.cpp's sampling defaults the lab's own sampler chain leaves out
    SETTINGS_OFF = (
        "Llama.generate/__call__ defaults (top_k=40, top_p=0.95, min_p=0.05, typical_p=1, "
        "repeat_penalty=1.0; filters before temperature): not used, the lab builds its own chain",
        "Llama.detokenize's 32-byte piece buffer and its strip of a space after BOS: not used",
    )

    def __init__(
        self,
        model,
        n_ctx: int | None = None,
        threads: int | None = None,
        n_batch: int = 512,
        n_seq_max: int = 1,
        verbose: bool = False,
        n_gpu_layers: int | None = None,
        speculative: int | None = None,
        swa_full: bool = True,
        flash_attn: bool = False,
        adapter=None,
        merge_adapter: bool = False,
    ):
        super().__init__(model)
        merged = self._begin_adapter(adapter, merge_adapter)  # checked before any loading
        llama_cpp, np = self._import_library("llama_cpp", "numpy")
        self._draft = _lookup_draft(speculative, n_seq_max) if speculative is not None else None
        self._lib, self._np = llama_cpp, np  # numpy: greedy takes the argmax of the logits in place (_sample)
        self._path = path = merged or model.path_for("gguf", self.name)
        self._init_threads(threads)
        self._n_ctx_req = whole(n_ctx or self.default_n_ctx(model), "n_ctx", "a positive number of tokens")
        if self._draft is not None:
            _check_draft_scores(model, self._n_ctx_req)
        self.n_batch = int(n_batch)
        n_seq_max = int(n_seq_max)
        if not 1 <= n_seq_max <= llama_cpp.llama_max_parallel_sequences():
            raise LabError(
                f"n_seq_max={n_seq_max} (one KV sequence per concurrent request): llama.cpp holds "
                f"1 to {llama_cpp.llama_max_parallel_sequences()} parallel sequences; use a "
                f"concurrency of at most {llama_cpp.llama_max_parallel_sequences()}"
            )
        # a CUDA or Metal build offloads every layer unless told otherwise; a CPU build has no GPU
        offload = bool(llama_cpp.llama_supports_gpu_offload())
        self.n_gpu_layers = (-1 if offload else 0) if n_gpu_layers is None else int(n_gpu_layers)
        self.device = _offload_device(llama_cpp) if offload and self.n_gpu_layers != 0 else "cpu"
        self.swa_full = bool(swa_full)
        if not isinstance(flash_attn, bool):
            raise LabError(f"flash_attn={flash_attn!r}: expected True (llama-server's choice on the CPU) or False")
        # what llama.cpp says it built (effective_config, kv_report); a Ctrl-C raised in its log callback, sent again
        with swallowed_interrupts_sent_again(), _LoadLog(llama_cpp, echo=verbose) as log:
            self.llm = _load_or_say_why(
                log,
                path,
                llama_cpp.Llama,
                model_path=path,
                n_gpu_layers=self.n_gpu_layers,
                n_ctx=self._n_ctx_req,
                n_batch=self.n_batch,
                n_ubatch=self.n_batch,
                n_threads=self.threads,
                n_threads_batch=self.threads,
                verbose=verbose,
                draft_model=self._draft,
                swa_full=self.swa_full,
                flash_attn=flash_attn,
            )
            if n_seq_max > 1:
                self._reopen_context(n_seq_max, verbose)
            self.ctx = self.llm._ctx.ctx
            if self.adapter is not None and not self.adapter_merged:
                self._attach_adapter(log)  # on the context the engine runs (after any reopen)
        self.load_log = log.text
        # a merged adapter's GGUF: its largest tensors' type (F16, as llama-export-lora writes them), what info() says
        self._merged_type = None
        if self.adapter_merged:
            self.adapter_bytes = _tensor_bytes(path) - _tensor_bytes(model.path_for("gguf", self.name))
            self._merged_type = _largest_type(path)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm._model.model)
        self._batch = llama_cpp.llama_batch_init(max(self.n_batch, n_seq_max), 0, max(1, n_seq_max))
        # llama.cpp rounds the context up (to 256) and caps its batch at the requested
        # n_ctx: enforce what was asked for, and prefill in batches it accepts
        self.n_ctx = min(self._n_ctx_req, llama_cpp.llama_n_ctx(self.ctx))
        self.n_batch = min(self.n_batch, llama_cpp.llama_n_batch(self.ctx))
        self.n_vocab = self.llm.n_vocab()
        self._eos = {t for t in range(self.llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(self.vocab, t)}

    def _attach_adapter(self, log: _LoadLog) -> None:
        """Read the adapter's GGUF LoRA into llama.cpp (``llama_adapter_lora_init``: its tensors copied into a
        buffer of the model's backend, as stored: f32) and set it on the context (``llama_set_adapters_lora``,
        :data:`ADAPTER_SCALE`); the adapter lives as long as the model (llama.cpp frees it with the model).
        Times both (:attr:`adapter_load_s`) and counts the tensors' bytes (:attr:`adapter_bytes`). LabError with
        what llama.cpp logged when it refuses the file."""
        import ctypes

        lib, path = self._lib, self.adapter.path_for("gguf")  # made on first use: not part of the attach
        t0 = now()
        lora = lib.llama_adapter_lora_init(self.llm._model.model, path.encode("utf-8"))
        if not lora:
            said = [ln.strip() for ln in log.text.splitlines() if "error" in ln.lower() or "failed" in ln.lower()]
            raise LabError(
                f"llama.cpp could not read the LoRA adapter {self.adapter.name} ({path}): "
                f"{said[-1] if said else 'llama_adapter_lora_init returned NULL'}; expected a GGUF LoRA of this model"
            )
        adapters = (lib.llama_adapter_lora_p_ctypes * 1)(lora)
        scales = (ctypes.c_float * 1)(self.ADAPTER_SCALE)
        if lib.llama_set_adapters_lora(self.ctx, adapters, 1, scales) != 0:
            raise LabError(f"llama.cpp could not set the LoRA adapter {self.adapter.name} on its context")
        self.adapter_load_s = now() - t0
        self._lora = lora
        self.adapter_bytes = _tensor_bytes(path)

    def _reopen_context(self, n_seq_max: int, verbose: bool) -> None:
        """Replace the Llama object's context by one holding ``n_seq_max`` sequences.

        llama-cpp-python 0.3's ``Llama()`` has no ``n_seq_max``/``kv_unified``
        parameters: passed as keywords they fall silently into ``**kwargs`` and
        the context holds one sequence. So the context is reopened with them set:
        ``n_seq_max`` sequences, each with ``n_ctx / n_seq_max`` KV cells of its own.
        """
        import contextlib

        from llama_cpp._internals import LlamaContext

        params = self.llm.context_params
        # one KV stream per sequence (kv_unified off, llama.cpp's default): attention of a sequence
        # reads only its own cells; a unified buffer made every token attend over all sequences'
        # cells (masked), which cost 13% of batched decode at 4-8 sequences here
        params.n_seq_max, params.kv_unified = n_seq_max, False
        # llama.cpp gives each sequence GGML_PAD(n_ctx / n_seq_max, 256) cells and, when n_ctx is not that times
        # n_seq_max, takes that and prints "n_ctx is not divisible by n_seq_max - rounding down to N" on stderr
        # (src/llama-context.cpp), a red box in a notebook: ask for exactly what it allocates (the lab still enforces
        # the n_ctx asked for, self.n_ctx)
        if params.n_ctx // n_seq_max:
            params.n_ctx = -(-(params.n_ctx // n_seq_max) // 256) * 256 * n_seq_max
        old = self.llm._ctx
        old.close()  # free its KV buffer first (idempotent: the Llama's exit stack closes it again)
        self.llm._ctx = self.llm._stack.enter_context(
            contextlib.closing(LlamaContext(model=self.llm._model, params=params, verbose=verbose))
        )

    # --- tokenizer -------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        self.check_open()
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=True)

    def detokenize(self, ids: list[int]) -> str:
        """Token ids -> text: each token's piece in full (special tokens rendered), the bytes
        joined, then decoded as UTF-8 (a split multi-byte character shows as U+FFFD).

        Not ``Llama.detokenize``: llama-cpp-python 0.3.36 copies each piece through a 32-byte
        buffer and drops longer ones (47 pieces of SmolLM2's vocabulary, mostly a newline and
        indentation, came back empty), and it strips a leading space after BOS. LabError for an id outside the
        vocabulary (llama.cpp's std::out_of_range aborted the process).
        """
        ids = token_ids(ids)
        self.check_ids(ids)
        return b"".join(self.piece_bytes(t) for t in ids).decode("utf-8", errors="replace")

    def piece_bytes(self, token: int) -> bytes:
        """The bytes of one token's piece (``llama_token_to_piece``, special tokens rendered, no
        left strip), with a buffer as long as llama.cpp says the piece needs."""
        import ctypes

        self.check_open()
        size = 64
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = self._lib.llama_token_to_piece(self.vocab, int(token), buf, size, 0, True)
            if n >= 0:
                return buf.raw[:n]
            size = -n  # too small: llama.cpp returns minus the length it needs
        raise LabError(f"llama.cpp could not render token {token} (llama_token_to_piece returned {n})")

    def chat_template(self) -> str:
        """The chat template embedded in the GGUF (``tokenizer.chat_template``)."""
        tmpl = self.llm.metadata.get("tokenizer.chat_template")
        if not tmpl:
            raise LabError(f"{self.model.source} has no chat template in its GGUF metadata")
        return tmpl

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        bos = self.detokenize([self.llm.token_bos()])
        eos = self.detokenize([self.llm.token_eos()])
        fmt = Jinja2ChatFormatter(
            self.chat_template(), eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt
        )
        text = fmt(messages=messages).prompt
        # llama.cpp's own rule: BOS added when the vocabulary asks for it
        # (tokenizer.ggml.add_bos_token), even if the template wrote one already
        return self.tokenize(text, add_special=self.adds_bos)

    @property
    def adds_bos(self) -> bool:
        """Whether the model's vocabulary asks for a BOS token before a text (llama.cpp's
        ``llama_vocab_get_add_bos``; llama-perplexity tokenizes its text so)."""
        return bool(self._lib.llama_vocab_get_add_bos(self.vocab))

    @property
    def bos_id(self) -> int:
        return self._lib.llama_vocab_bos(self.vocab)

    @property
    def eos_ids(self) -> set[int]:
        """End-of-generation ids as llama.cpp's vocabulary marks them."""
        return self._eos

    # --- description -------------------------------------------------------
    def info(self) -> EngineInfo:
        from lablib.build import llama as llama_build

        sysinfo = self._lib.llama_print_system_info().decode(errors="replace")
        return EngineInfo(
            name=self.name,
            version=self.library_version,
            backend="cpu (ggml)" if self.device == "cpu" else f"ggml, {self.device} offload",
            dtype=self._merged_type or self.model.quantization or "gguf",
            threads=self.threads,
            n_ctx=self.n_ctx,
            device=self.device,
            compute_dtype=(
                self.compute_dtype(self.model)
                if self._merged_type is None
                else "float32"
                if self._merged_type in FLOAT_TYPES
                else "int8"
            ),
            flags={
                "n_gpu_layers": self.n_gpu_layers,
                "threads_auto": self.auto_threads,
                "max_threads": self.max_threads,
                "n_batch": self.n_batch,
                "n_seq_max": self._lib.llama_n_seq_max(self.ctx),
                "swa_full": self.swa_full,
                "flash_attn": {-1: "auto", 0: "off", 1: "on"}.get(self.llm.context_params.flash_attn_type),
                "system_info": sysinfo.strip(),
                "sampling": DEFINITION,
                "settings_off": list(self.SETTINGS_OFF),
                "build": llama_build.describe(sysinfo, llama_build.build_report()),
                "matmul_kernels": self.matmul_kernels,
                **({"speculative": self._draft.describe()} if self._draft is not None else {}),
                **self.adapter_flags(),
            },
        )

    def _apply_threads(self, n: int) -> None:
        self._lib.llama_set_n_threads(self.ctx, n, n)

    @functools.cached_property
    def matmul_kernels(self) -> str | None:
        """The kernel prefill multiplies each type of the layers' weights with on the CPU, as one line
        (:func:`lablib.engines.ggml_kernels.matmul_kernels`: 'Q4_1 row by row', 'Q4_0 repacked q4_0_8x8');
        None when the layers run on a GPU. Read once: the file, its load log and the library are the engine's."""
        if self.device != "cpu":
            return None
        from lablib.engines import ggml_kernels

        system_info = self._lib.llama_print_system_info().decode(errors="replace")
        found = ggml_kernels.matmul_kernels(ggml_kernels.layer_matrices(self._path), self.load_log, system_info)
        return ggml_kernels.kernels_summary(found) or None

    def effective_config(self) -> dict:
        """The settings llama.cpp computes with, as it printed them while loading (:func:`read_load_log`: its
        RoPE bases, sliding window, norm epsilon, head counts; the sliding layers counted in the KV cache it
        built for them), the rest as the GGUF states them (soft-caps, scaling) and from the loaded vocabulary;
        the context's RoPE base where it overrides the file's."""
        lib, m = self._lib, self.llm._model.model
        cfg = gguf_config(self.model.gguf_path)  # llama.cpp uses the file's values as stated
        built = read_load_log(self.load_log)
        hp = built["hparams"]
        sliding = next((c["layers"] for c in built["kv_caches"] if c["kind"] == "sliding"), 0)
        cfg.update(
            n_heads=lib.llama_model_n_head(m),
            n_kv_heads=lib.llama_model_n_head_kv(m),
            n_layers=lib.llama_model_n_layer(m),
            context_length=lib.llama_model_n_ctx_train(m),
            vocab_size=lib.llama_vocab_n_tokens(self.vocab),
            bos_id=lib.llama_vocab_bos(self.vocab),
            eos_id=lib.llama_vocab_eos(self.vocab),
        )
        if hp:  # what it built (a log that could not be read leaves the file's values)
            cfg.update(
                rope_theta=float(hp.get("freq_base_train", cfg["rope_theta"])),
                rope_theta_sliding=float(hp["freq_base_swa"]) if hp.get("is_swa_any") else None,
                sliding_window=int(hp.get("n_swa", 0)) if hp.get("is_swa_any") else 0,
                sliding_layers=sliding,
                rms_norm_eps=float(hp.get("f_norm_rms_eps", cfg["rms_norm_eps"])),
                head_dim=int(hp.get("n_embd_head_k", cfg["head_dim"])),
            )
        ctx_base = self.llm.context_params.rope_freq_base  # 0 means "from the model"
        if ctx_base:
            cfg["rope_theta"] = float(ctx_base)
        return cfg

    def kv_report(self) -> dict:
        """The KV cache llama.cpp allocated at load, as it reported it (:func:`read_load_log`): ``caches`` (kind,
        cells, layers, MiB each), ``bytes`` (all), ``swa_full``; beside the lab's prediction ``predicted_bytes``
        (:func:`llama_kv_cells`) and why it differs from what the model needs (``note``)."""
        built = read_load_log(self.load_log)
        n_seq = self._lib.llama_n_seq_max(self.ctx)
        predicted = llama_kv_cells(self.model, self._lib.llama_n_ctx(self.ctx), n_seq, self.n_batch, self.swa_full)
        return {
            "caches": built["kv_caches"],
            "bytes": built["kv_bytes"],
            "swa_full": built["swa_full"],
            "predicted_bytes": predicted["bytes"],
            "note": self.kv_cache_note(self.model, swa_full=self.swa_full),
        }

    # --- generation -------------------------------------------------------
    def _sampler(self, cfg: GenerationConfig, seed: int | None = None):
        """A llama.cpp sampler chain for ``cfg`` (:data:`lablib.engines.sampling.DEFINITION`): greedy, or
        temp -> top_k (when > 0) -> top_p (when < 1) -> dist seeded with ``seed`` (default
        ``cfg.seed``). Built from nothing: llama.cpp's usual chain (llama-server, the CLI,
        ``Llama.generate``: penalties, DRY, top_k 40, top_p 0.95, min_p 0.05, XTC..., with top-k/top-p
        *before* the temperature) never applies."""
        lib = self._lib
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        self.constraint_stats = {}
        if cfg.constraint is not None:  # the grammar masks first: what may follow, then the lab's sampling
            lib.llama_sampler_chain_add(chain, self._grammar_sampler(cfg.constraint))
        if cfg.greedy:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        else:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(cfg.temperature))
            if cfg.top_k:
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(cfg.top_k))
            if cfg.top_p < 1:
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(cfg.top_p, 1))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(cfg.seed if seed is None else seed))
        return chain

    def _sample(self, smpl, cfg: GenerationConfig, i: int) -> int:
        """The next token from the logits of batch entry ``i`` (-1: the last).

        Greedy is the argmax of the logits, read in place (numpy, about 20 us for 49,152 floats):
        the same token as llama.cpp's greedy sampler (the first of equal maxima), without the
        sampler's copy of the whole vocabulary into candidate structs each step, which cost about
        2% of a decode step here. Sampled requests go through the chain (:meth:`_sampler`)."""
        if cfg.greedy and cfg.constraint is None:
            row = self._lib.llama_get_logits_ith(self.ctx, i)
            return int(self._np.ctypeslib.as_array(row, shape=(self.n_vocab,)).argmax())
        return self._lib.llama_sampler_sample(smpl, self.ctx, i)

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
            raise LabError(
                f"llama_decode failed with code {rc} ("
                + (
                    "no KV slot for the batch: raise n_ctx or lower the prompt)"
                    if rc == 1
                    else "invalid batch: check the token ids are within the vocabulary)"
                )
            )

    def clear_kv_cache(self) -> None:
        """Forget every sequence in the KV cache (no reuse across requests)."""
        self._lib.llama_memory_clear(self._lib.llama_get_memory(self.ctx), True)
        self.llm.n_tokens = 0  # keep the high-level object's prefix bookkeeping honest

    def _prefill(self, ids, start: int = 0) -> None:
        """Decode ``ids[start:]`` at positions start.. into sequence 0, ``n_batch`` tokens per call
        (logits for the last token only)."""
        for at in range(start, len(ids), self.n_batch):
            chunk = ids[at : at + self.n_batch]
            self._fill(chunk, at, logits_last=at + len(chunk) == len(ids))
            self._decode()

    def _save_seq(self, ids) -> PrefixCache:
        """Sequence 0's state (its KV cells for ``ids``) copied out of the context."""
        import ctypes

        lib = self._lib
        size = lib.llama_state_seq_get_size(self.ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        n = lib.llama_state_seq_get_data(self.ctx, buf, size, 0)
        if n == 0:
            raise LabError("llama.cpp could not save the sequence's state (llama_state_seq_get_data returned 0)")
        return PrefixCache(self.name, list(ids), state=buf, nbytes=int(n))

    def _restore(self, cache: PrefixCache, n: int) -> None:
        """Sequence 0 (emptied) takes the first ``n`` tokens' KV cells of ``cache``."""
        lib = self._lib
        if not lib.llama_state_seq_set_data(self.ctx, cache.state, cache.nbytes, 0):
            raise LabError("llama.cpp could not restore the prefix cache (llama_state_seq_set_data returned 0)")
        if n < len(cache.ids):
            lib.llama_memory_seq_rm(lib.llama_get_memory(self.ctx), 0, n, -1)

    def _cache_prefix(self, ids) -> PrefixCache:
        self.clear_kv_cache()
        try:
            self._prefill(ids)
            return self._save_seq(ids)
        finally:
            self.clear_kv_cache()

    def _keep_request(self, prefix_cache: PrefixCache, ids, trace: RequestTrace) -> None:
        # sequence 0 holds the prompt and every output token but the last (sampled, never decoded)
        kept = self._save_seq(list(ids) + trace.token_ids[:-1])
        prefix_cache.ids, prefix_cache.state, prefix_cache.nbytes = kept.ids, kept.state, kept.nbytes
        self.clear_kv_cache()

    def gbnf(self, constraint) -> str:
        """The GBNF grammar of ``constraint`` (cached per engine: the conversion runs once per schema): a JSON
        schema through llama-cpp-python's ``json_schema_to_gbnf``, a regex (matched in full) through the same
        converter's raw-pattern mode. Raises ConstraintError naming the part of the schema it cannot convert."""
        from lablib.engines.base import ConstraintError, schema_part

        cache = self.__dict__.setdefault("_gbnf", {})
        if constraint.key not in cache:
            try:
                cache[constraint.key] = _to_gbnf(constraint.kind, constraint.spec)
            except (AssertionError, ValueError, KeyError, TypeError) as e:
                part = None
                if constraint.kind == "json_schema":
                    part = schema_part(constraint.spec, lambda sub: not _converts(sub))
                raise ConstraintError(self.name, constraint, str(e) or type(e).__name__, part) from e
        return cache[constraint.key]

    def _grammar_sampler(self, constraint):
        """A grammar sampler for ``constraint``; times the conversion and llama.cpp's parse of the grammar into
        :attr:`constraint_stats` (a cached GBNF: only the parse, which llama.cpp repeats per sampler)."""
        from lablib.engines.base import ConstraintError

        t0 = now()
        cached = constraint.key in self.__dict__.get("_gbnf", {})
        grammar = self.gbnf(constraint)
        smpl = self._lib.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        if not smpl:
            msg = "llama.cpp could not parse the GBNF grammar (llama_sampler_init_grammar returned NULL)"
            raise ConstraintError(self.name, constraint, msg)
        self.constraint_stats = {"compile_s": now() - t0, "compile_cached": cached}
        return smpl

    def _generate(self, ids, cfg: GenerationConfig, trace: RequestTrace, prefix_cache=None) -> None:
        if self._draft is not None:
            return self._generate_lookup(ids, cfg, trace, prefix_cache)
        lib = self._lib
        smpl = self._sampler(cfg)
        eos = self.eos_ids
        try:
            self.clear_kv_cache()
            lib.llama_perf_context_reset(self.ctx)
            trace.start()
            cached = prefix_cache.reusable(ids) if prefix_cache is not None else 0
            if cached:
                self._restore(prefix_cache, cached)
                trace.cached_tokens = cached
            self._prefill(ids, cached)
            pos = len(ids)
            while True:
                tok = self._sample(smpl, cfg, -1)
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

    def _generate_lookup(self, ids, cfg: GenerationConfig, trace: RequestTrace, prefix_cache=None) -> None:
        """Greedy decode through ``Llama.generate`` with its prompt-lookup draft model: each pass evaluates the
        last token plus the drafted ones in one ``llama_decode`` and yields the verified run, stamped token by
        token as the generator gives them (a run arrives at once: its stamps microseconds apart)."""
        if not cfg.greedy or prefix_cache is not None or cfg.constraint is not None:
            raise LabError(
                "llama.cpp with speculative= (llama-cpp-python's prompt lookup) runs greedy requests without a "
                "prefix cache or constraint; expected temperature=0, no prefix_cache and no constraint (load it "
                "without speculative= for those)"
            )
        self.clear_kv_cache()
        self.llm.reset()
        self._lib.llama_perf_context_reset(self.ctx)
        self._draft.begin(len(ids))
        trace.start()
        gen = self.llm.generate(ids, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True)
        try:
            for tok in gen:
                trace.token(int(tok))
                if not cfg.ignore_eos and tok in self.eos_ids:
                    trace.finish_reason = "stop"
                    break
                if trace.output_tokens >= cfg.max_new_tokens:
                    trace.finish_reason = "length"
                    break
        finally:
            gen.close()
            self.clear_kv_cache()
        self._draft.verify(trace.token_ids)

    def logits(self, ids) -> np.ndarray:
        """Teacher-forced logits for ``ids``: float32 numpy array [len(ids), vocab]
        (an empty KV cache first, logits requested for every position)."""
        import numpy as np

        self.check_open()
        return np.concatenate(list(self.iter_logits(ids, self.n_batch)))

    def iter_logits(self, ids, chunk: int = 64):
        """Teacher-forced logits, ``chunk`` positions at a time: yields float32 numpy arrays
        [<= chunk, vocab] copied from llama.cpp's logits buffer after each ``llama_decode`` of up
        to ``n_batch`` tokens (an empty KV cache first and after; see :meth:`Engine.iter_logits`)."""
        import numpy as np

        lib, n_vocab = self._lib, self.llm.n_vocab()
        ids = token_ids(ids)
        self.check_context(len(ids), 0)
        self.check_ids(ids)
        self.clear_kv_cache()
        try:
            for at in range(0, len(ids), self.n_batch):
                batch = ids[at : at + self.n_batch]
                self._fill(batch, at, logits_last=False)
                for i in range(len(batch)):
                    self._batch.logits[i] = 1
                self._decode()
                for sub in range(0, len(batch), chunk):
                    n = min(chunk, len(batch) - sub)
                    out = np.empty((n, n_vocab), dtype=np.float32)
                    for i in range(n):
                        out[i] = np.ctypeslib.as_array(lib.llama_get_logits_ith(self.ctx, sub + i), shape=(n_vocab,))
                    yield out
        finally:
            self.clear_kv_cache()

    def engine_counters(self) -> dict:
        """llama.cpp's own perf counters for the last request (since the reset):
        prompt tokens evaluated and their ms, decoded tokens and their ms."""
        d = self._lib.llama_perf_context(self.ctx)
        out = {"n_p_eval": d.n_p_eval, "t_p_eval_ms": d.t_p_eval_ms, "n_eval": d.n_eval, "t_eval_ms": d.t_eval_ms}
        return {**out, **(self._draft.counters if self._draft is not None else {})}

    def batch_session(self, cfg: GenerationConfig, max_sequences: int, max_seq_tokens: int) -> LlamaCppBatchSession:
        """A continuous-batching session: up to ``max_sequences`` requests decoded together.

        ``max_seq_tokens``: the longest prompt + output of any request, tokens. Raises
        LabError when the context was loaded with ``n_seq_max < max_sequences`` and
        ContextOverflowError when ``max_seq_tokens`` exceeds a sequence's share of ``n_ctx``.
        """
        self.check_open()
        if self._draft is not None:
            raise LabError("llama.cpp loaded with speculative= decodes one sequence; load it without for batched mode")
        self.check_adapter_request(cfg)
        return LlamaCppBatchSession(self, cfg, max_sequences, max_seq_tokens)

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "llm", None) is not None:
            self.llm.close()
            self.llm = None


def _tensor_bytes(path) -> int:
    """Bytes of every tensor of a GGUF file as stored (what llama.cpp holds of it: its weights, or a LoRA's A and
    B copied in as they are)."""
    from lablib.model.formats import gguf_tensors

    return sum(b for _, _, _, b in gguf_tensors(str(path)))


def _largest_type(path) -> str:
    """The ggml type of a GGUF file's tensors that take the most bytes together."""
    from lablib.model.formats import gguf_tensors

    by: dict[str, int] = {}
    for _, kind, _, nbytes in gguf_tensors(str(path)):
        by[kind] = by.get(kind, 0) + nbytes
    return max(by, key=by.get)


def _to_gbnf(kind: str, spec) -> str:
    """GBNF of a JSON schema or of a regex (llama_cpp.llama_grammar.SchemaConverter, the Python port of llama.cpp's
    examples/json_schema_to_grammar.py; a regex is anchored with ^...$ and converted raw, without JSON quotes)."""
    from llama_cpp.llama_grammar import SchemaConverter

    conv = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=kind == "regex")
    if kind == "regex":
        pattern = spec if spec.startswith("^") else "^" + spec
        schema = {"type": "string", "pattern": pattern if pattern.endswith("$") else pattern + "$"}
    else:
        schema = conv.resolve_refs(spec, "input")
    conv.visit(schema, "")
    return conv.format_grammar()


def _converts(schema) -> bool:
    try:
        _to_gbnf("json_schema", schema)
        return True
    except (AssertionError, ValueError, KeyError, TypeError):
        return False


def _check_draft_scores(model, n_ctx: int) -> None:
    """With a draft model llama-cpp-python keeps the logits of every position (``logits_all``): a float32 array of
    n_ctx x vocabulary, allocated at load (8192 x 49,152 tokens: 1.5 GiB). LabError when it would take more than
    half the memory available (:func:`lablib.machine.available_ram_bytes`), naming the n_ctx that fits."""
    from lablib.machine import available_ram_bytes
    from lablib.model.shape import model_dims

    vocab = model_dims(model)["vocab"]
    need, room = n_ctx * vocab * 4, available_ram_bytes() // 2
    if vocab and need > room:
        raise LabError(
            f"speculative= with n_ctx={n_ctx}: llama-cpp-python's draft loop keeps every position's logits, "
            f"{need / 2**30:.2f} GiB for {vocab} tokens of vocabulary, more than half of the "
            f"{2 * room / 2**30:.2f} GiB available; use n_ctx={max(1, room // (vocab * 4))} or less"
        )


def _lookup_draft(k, n_seq_max: int):
    """llama-cpp-python's prompt-lookup draft model proposing ``k`` tokens a step, which keeps what it proposed
    (:class:`llama_cpp.llama_speculative.LlamaPromptLookupDecoding`, a subclass that records each call)."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    k = whole(k, "speculative", "a whole number of draft tokens per step, at least 1 (prompt lookup's num_pred_tokens)")
    if n_seq_max != 1:
        raise LabError(f"speculative={k} with n_seq_max={n_seq_max}: Llama.generate's draft loop decodes one sequence")

    class CountedLookup(LlamaPromptLookupDecoding):
        """Prompt lookup (max n-gram 2, llama-cpp-python's default) that records, per call, how many output
        tokens preceded it and what it drafted; :meth:`verify` compares the drafts with the tokens kept."""

        def begin(self, prompt_tokens: int) -> None:
            self.prompt_tokens, self.proposals, self.counters = prompt_tokens, [], {}

        def __call__(self, input_ids, /, **kwargs):
            out = super().__call__(input_ids, **kwargs)
            self.proposals.append((len(input_ids) - self.prompt_tokens, [int(t) for t in out]))
            return out

        def verify(self, out: list[int]) -> None:
            """Per target pass after the prefill: ``drafted`` (the draft tokens whose position the request
            reached) and ``accepted`` (its leading tokens the target produced too, the run llama-cpp-python
            kept). llama-cpp-python counts neither; these come from its draft model's own proposals."""
            drafted, accepted = [], []
            for n_out, draft in self.proposals:
                d = draft[: max(0, len(out) - n_out)]
                a = 0
                while a < len(d) and d[a] == out[n_out + a]:
                    a += 1
                drafted.append(len(d))
                accepted.append(a)
            self.counters = {
                "draft_n": sum(drafted),
                "draft_n_accepted": sum(accepted),
                "target_passes": len(self.proposals),
                "drafted_per_pass": drafted,
                "accepted_per_pass": accepted,
            }

        def describe(self) -> dict:
            return {
                "method": "prompt lookup (llama-cpp-python)",
                "num_pred_tokens": self.num_pred_tokens,
                "max_ngram_size": self.max_ngram_size,
            }

    return CountedLookup(num_pred_tokens=k)


class _Seq:
    """One request inside a batch session: its KV sequence id, sampler and progress."""

    __slots__ = ("trace", "ids", "number", "seq_id", "smpl", "n_prefilled", "pos", "next_token")

    def __init__(self, trace: RequestTrace, ids: list[int], number: int = 0):
        self.trace, self.ids, self.number = trace, ids, number  # number: submission order in the session
        self.seq_id = self.smpl = self.next_token = None
        self.n_prefilled = 0  # prompt tokens already sent to llama_decode
        self.pos = 0  # position of the next token in the sequence


class LlamaCppBatchSession:
    """Continuous batching on one llama.cpp context (see the module docstring).

    :meth:`submit` queues a request (FIFO); :meth:`step` is one ``llama_decode``
    over every running sequence (decode tokens first, then prompt chunks of new
    arrivals, at most ``n_batch`` tokens) and returns the traces that finished
    in it. ``stats``: ``steps`` (llama_decode calls), ``max_sequences_per_step``
    (most distinct sequences in one batch), ``max_decode_sequences_per_step``
    (most sequences sampling a token from one batch), ``max_tokens_per_step``,
    ``prompt_tokens`` (prompt tokens decoded) and ``generated_tokens`` (tokens sampled).
    Sampling: each sequence has its own chain (:meth:`LlamaCppEngine._sampler`); the k-th request
    submitted (k = 0, 1, ...) draws with seed ``cfg.seed + k``, so identical prompts give
    independent draws, as in transformers' and mlx-lm's batches (one random stream each).
    """

    def __init__(self, engine: LlamaCppEngine, cfg: GenerationConfig, max_sequences: int, max_seq_tokens: int):
        lib = engine._lib
        n_seq_max = lib.llama_n_seq_max(engine.ctx)
        if max_sequences > n_seq_max:
            raise LabError(
                f"llama.cpp batched mode with {max_sequences} concurrent sequences needs a context "
                f"with n_seq_max >= {max_sequences}, but this engine was loaded with n_seq_max="
                f"{n_seq_max}; load it with load_engine('llama.cpp', model, n_seq_max={max_sequences}, "
                f"n_ctx=...)"
            )
        if max_sequences > engine.n_batch:
            raise LabError(
                f"{max_sequences} concurrent sequences need n_batch >= {max_sequences} (one "
                f"decode token each per llama_decode); this engine has n_batch={engine.n_batch}"
            )
        per_seq = min(engine.n_ctx // n_seq_max, lib.llama_n_ctx_seq(engine.ctx))
        if max_seq_tokens > per_seq:
            need = n_seq_max * max_seq_tokens
            raise ContextOverflowError(
                f"context overflow on llama.cpp (batched): a sequence needs prompt + output = {max_seq_tokens} "
                f"tokens, but each of the {n_seq_max} sequences holds {per_seq} (n_ctx {engine.n_ctx} split "
                f"between them). Load the engine with n_ctx >= {need}, or lower the concurrency, the prompt "
                f"or max_new_tokens."
            )
        self.engine, self.cfg, self.lib = engine, cfg, lib
        self.max_sequences = max_sequences
        self._mem = lib.llama_get_memory(engine.ctx)
        self._free_ids = list(range(max_sequences))
        self._waiting: list[_Seq] = []
        self._running: list[_Seq] = []  # admission order
        self._submitted = 0
        self.stats = BatchStats.counters(
            engine, "llama_decode multi-sequence batch", "max_decode_sequences_per_step", "max_tokens_per_step"
        )
        engine.clear_kv_cache()  # no request reuses another's KV cells

    @property
    def pending(self) -> int:
        """Requests submitted and not yet finished."""
        return len(self._waiting) + len(self._running)

    def submit(self, ids: list[int], trace: RequestTrace) -> None:
        """Queue prompt ``ids``; ``trace`` receives t_start and the token events."""
        self._waiting.append(_Seq(trace, list(ids), self._submitted))
        self._submitted += 1

    def step(self) -> list[RequestTrace]:
        """One llama_decode over all running sequences; the traces finished in it, in order."""
        eng, cfg = self.engine, self.cfg
        while self._waiting and self._free_ids:  # admit FIFO into free KV sequences
            s = self._waiting.pop(0)
            s.seq_id, s.smpl = self._free_ids.pop(0), eng._sampler(cfg, cfg.seed + s.number)
            self._running.append(s)
        if not self._running:
            return []
        # batch entries: (sequence, token, position, wants logits)
        entries = [(s, s.next_token, s.pos, True) for s in self._running if s.next_token is not None]
        starting = []
        budget = eng.n_batch - len(entries)
        for s in self._running:
            if s.n_prefilled == len(s.ids) or budget <= 0:
                continue
            if s.n_prefilled == 0:
                starting.append(s)
            chunk = s.ids[s.n_prefilled : s.n_prefilled + budget]
            for j, tok in enumerate(chunk):
                last = s.n_prefilled + j == len(s.ids) - 1
                entries.append((s, tok, s.n_prefilled + j, last))
            s.n_prefilled += len(chunk)
            budget -= len(chunk)
        b = eng._batch
        for i, (s, tok, pos, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, int(logits)
            b.seq_id[i][0] = s.seq_id
        b.n_tokens = len(entries)
        t = now()
        for s in starting:
            s.trace.start(t)  # the engine begins this request's prefill now
        eng._decode()
        st = self.stats
        st["steps"] += 1
        st["max_tokens_per_step"] = max(st["max_tokens_per_step"], len(entries))
        st["max_sequences_per_step"] = max(st["max_sequences_per_step"], len({id(e[0]) for e in entries}))
        st["prompt_tokens"] += sum(1 for s, tok, pos, _ in entries if pos < len(s.ids))
        finished, sampling = [], 0
        for i, (s, _tok, pos, logits) in enumerate(entries):
            if not logits:
                continue
            sampling += 1
            tok = eng._sample(s.smpl, cfg, i)
            s.trace.token(tok)
            s.pos, s.next_token = pos + 1, tok
            if not cfg.ignore_eos and tok in eng.eos_ids:
                s.trace.finish_reason = "stop"
            elif s.trace.output_tokens >= cfg.max_new_tokens:
                s.trace.finish_reason = "length"
            if s.trace.finish_reason is not None:
                self._release(s)
                finished.append(s.trace)
        st["generated_tokens"] += sampling
        st["max_decode_sequences_per_step"] = max(st["max_decode_sequences_per_step"], sampling)
        return finished

    def _release(self, s: _Seq) -> None:
        """Free a finished sequence: its KV cells, its sampler, its sequence id."""
        self.lib.llama_memory_seq_rm(self._mem, s.seq_id, -1, -1)
        self.lib.llama_sampler_free(s.smpl)
        self._running.remove(s)
        self._free_ids.append(s.seq_id)
        s.smpl = None

    def close(self) -> None:
        """Free what is still held (after an error) and clear the KV cache."""
        for s in list(self._running):
            self._release(s)
        self._waiting.clear()
        self.engine.clear_kv_cache()
