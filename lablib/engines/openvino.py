"""OpenVINO GenAI: an ``LLMPipeline`` on the CPU plugin, reading a GGUF file directly.

Which file. OpenVINO GenAI 2026.4 reads a GGUF itself (its "legacy" GGUF reader: llama, qwen2,
qwen3; F16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K; a preview feature) and builds the model graph, the
tokenizer and the detokenizer from the file: no export, no optimum-intel (which needs
transformers < 5.6). Measured on the default model (SmolLM2-135M, Q4_1 with a Q8_0 token
embedding tied to the output), the reader runs the shipped file, but a *different* model: greedy
tokens leave transformers' at the first or second token on 4 of 5 prompts, and teacher-forced,
the tokens it picks are 1-2 nats below transformers' argmax where llama.cpp on the same file
agrees with transformers within 0.1 nats (a Q8_0 requantization of the file does the same). On the
lab's F16 reference of that file (:func:`lablib.model.reference.reference`: every tensor dequantized with the
gguf package, cached by the file's hash under the lab home), it agrees with transformers for 32
greedy tokens on 4 of those 5 prompts. So the engine reads the F16 reference by default
(``weights="f16"``); ``weights="source"`` reads the model's own GGUF, to show the difference
(``lablib.studies.compare`` then names where it diverges).

Generation: ``LLMPipeline.generate`` on an ``ov.Tensor`` of the lab's token ids (no
re-tokenization, no chat template), greedy, ``ignore_eos``, ``max_new_tokens`` from the lab's
:class:`GenerationConfig`, with a ``StreamerBase`` whose ``write`` receives token *ids*: each is
stamped with the lab's clock as it arrives. The pipeline's own ``perf_metrics`` of the last request
(TTFT, TPOT, per-token times) are kept (:meth:`OpenVINOEngine.engine_counters`). Sampled requests
are refused: OpenVINO GenAI's multinomial sampler has not been checked against
:data:`lablib.engines.sampling.DEFINITION`.

Numerics are OpenVINO's own for this CPU, recorded in ``info().flags``: the CPU plugin's default
inference precision (bf16 where the CPU has bf16 instructions, else f32), int8 dynamic
quantization of activations for compressed weights, and the KV cache precision the reader sets
(f16 for an F16 or F32 GGUF; u8, the CPU default, otherwise). ``info().weights`` names the file it read
("f16" or "source") and ``info().compute_dtype`` the inference precision its matrix products run at
(bfloat16 for either file on a CPU with AVX-512 BF16 or AMX): what :mod:`lablib.studies.roofline` bounds its rows by.

Threads: ``INFERENCE_NUM_THREADS`` is a compile-time property of the CPU plugin: the engine loads
with the lab's thread count (``threads``, else LABLIB_THREADS, else the CPUs other processes leave
free at load) and cannot change it per request (``threads_auto`` says whether the count was chosen
automatically at load, ``threads_fixed_at_load`` True; each row records the count it loaded with).
On ONE thread on a CPU with AMX it compiles in f32, not the plugin's bf16: bf16 there kills the
process with SIGFPE (openvinotoolkit/openvino#33300; :func:`single_thread_amx_precision`), and
``info().flags["precision_changed"]`` and ``compute_dtype`` say so.

Batched mode (:meth:`OpenVINOEngine.batch_session`) is OpenVINO GenAI's own continuous batching, a
``ContinuousBatchingPipeline`` (paged attention, a ``SchedulerConfig`` sized for the session)
driven step by step from the calling thread: ``add_request`` per request, ``step()`` advances every
scheduled sequence, each handle's new token ids are read and stamped after the step.
"""

from __future__ import annotations

import functools
import sys

from lablib.engines.base import BatchStats, Engine, EngineInfo, GenerationConfig, token_ids
from lablib.engines.sampling import DEFINITION
from lablib.errors import LabError
from lablib.results.trace import RequestTrace, now

WEIGHTS = ("f16", "source")  # the lab's F16 reference GGUF, or the model's own GGUF


# the GGUF architectures OpenVINO GenAI's reader builds a model of (openvino.genai 2026.4,
# src/cpp/src/gguf_utils/gguf_modeling.cpp: create_from_gguf)
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")


class OpenVINOEngine(Engine):
    """OpenVINO GenAI engine (CPU plugin).

    ``weights``: "f16" (default: the lab's F16 reference GGUF of the model, see the module
    docstring) or "source" (the model's own GGUF as shipped). ``threads``: CPU threads, fixed at
    load (default: the CPUs this process may use, or LABLIB_THREADS). ``n_ctx``: context the lab
    enforces (default: the trained context; OpenVINO's paged KV cache grows as needed).
    ``properties``: extra plugin properties (e.g. {"INFERENCE_PRECISION_HINT": "f32"}).
    ``device``: "auto" (OpenVINO's GPU plugin when ``ov.Core().available_devices`` lists a GPU,
    else the CPU), "CPU" or "GPU". On a GPU the thread count is not a property (the CPU plugin's).
    """

    name = "openvino"
    format = "gguf"
    requires = "openvino_genai"
    install_hint = "pip install -e '.[openvino]' (openvino-genai, openvino, openvino-tokenizers)"
    kv_bytes_per_value = 2  # f16: what the GGUF reader sets for an F16 file (the default weights)
    lab_default = False
    weights_option = "weights"
    weights_choices = WEIGHTS
    SETTINGS_OFF = (
        "chat template and special tokens of string inputs: not used, the lab passes token ids",
        "the GGUF's generation defaults and stop strings: replaced by a greedy config with max_new_tokens only",
    )

    @classmethod
    def unsupported(cls, model) -> str | None:
        """Its GGUF reader builds the architectures of :data:`GGUF_ARCHITECTURES` only (OpenVINO GenAI
        2026.4's ``create_from_gguf``: "Unsupported model architecture" for the rest)."""
        why = super().unsupported(model)
        if why or not getattr(model, "gguf_path", None):
            return why
        from lablib.model.formats import gguf_facts

        arch = gguf_facts(model.gguf_path)["architecture"]
        if arch not in GGUF_ARCHITECTURES:
            return (
                f"OpenVINO GenAI's GGUF reader builds {', '.join(GGUF_ARCHITECTURES)} models only, and {model.name} is "
                f"{arch}; run it with transformers, llama.cpp or mlx"
            )
        return None

    @classmethod
    def check_generation(cls, cfg: GenerationConfig) -> None:
        """Greedy only: LabError for a sampled ``cfg`` (temperature > 0)."""
        if not cfg.greedy:
            raise LabError(
                f"engine {cls.name} runs greedy decoding only (--temperature 0 / temperature=0): OpenVINO "
                "GenAI's multinomial sampler has not been checked against the lab's sampling definition; "
                "sample with another engine"
            )

    @classmethod
    def weights_path(cls, model, weights: str | None = None, log=lambda *_: None) -> str:
        """The GGUF it reads for ``weights``: "f16" (the default) the lab's F16 reference of ``model``
        (written once and cached by :func:`lablib.model.reference.reference` when missing, saying so to ``log``),
        "source" the model's own GGUF. FormatError for a model without a GGUF file."""
        if cls.check_weights(weights) == "source":
            return model.path_for("gguf", cls.name)
        from lablib.model.reference import reference

        return str(reference(model, "F16", log=log))

    @classmethod
    def compute_dtype(cls, model, weights: str | None = None, device: str = "CPU", properties=None) -> str:
        """The type its matrix products run at: the plugin's inference precision (``properties``'
        INFERENCE_PRECISION_HINT, else the ``device``'s default: bf16 on a CPU with AVX-512 BF16 or AMX,
        else f32), for either weights: the CPU plugin decompresses Q4_1/Q8_0 weights to it (its runtime
        graph on an AVX-512 BF16 EPYC: every FullyConnected a ``brgemm_avx512_bf16`` primitive, the F16
        and the shipped Q4_1 file alike). float32 when OpenVINO is not installed."""
        cls.check_weights(weights)
        hint = _precision_hint(device, properties)
        return OV_TYPES.get(hint.lower(), hint) if hint else "float32"

    @classmethod
    def weights_bytes(cls, model) -> int:
        """Bytes of the F16 reference GGUF it reads (parameters x 2 before it exists)."""
        from lablib.model.reference import quant_home

        ref = quant_home(model.sha256) / "reference-F16.gguf"
        return ref.stat().st_size if ref.is_file() else model.parameters * 2

    def __init__(
        self,
        model,
        threads: int | None = None,
        n_ctx: int | None = None,
        weights: str = "f16",
        properties: dict | None = None,
        device: str = "auto",
    ):
        super().__init__(model)
        np, ov, ov_genai = self._import_library("numpy", "openvino", "openvino_genai")
        self._np, self._ov, self._g = np, ov, ov_genai
        if weights not in WEIGHTS:
            raise LabError(f"weights={weights!r}: expected one of {', '.join(WEIGHTS)}")
        self.weights = weights
        model.path_for("gguf", self.name)  # FormatError for a model without a GGUF, before any work
        self.path = self.weights_path(model, weights, log=print)
        self._init_threads(threads)
        # INFERENCE_NUM_THREADS is fixed at compile time: chosen once (automatically or not), then kept
        self.auto_threads_at_load, self.auto_threads, self._busy = self.auto_threads, False, None
        found = list(ov.Core().available_devices)
        device = device.upper()
        if device == "AUTO":
            device = "GPU" if any(d.startswith("GPU") for d in found) else "CPU"
        if device not in found:
            raise LabError(f"device={device!r}: OpenVINO sees {', '.join(found)} here; expected one of them or 'auto'")
        self.ov_device = device
        self.device = "cpu" if device == "CPU" else device.lower()
        threads_prop = {"INFERENCE_NUM_THREADS": self.threads} if device == "CPU" else {}
        self.properties, self.precision_note = single_thread_amx_precision(
            device, {**threads_prop, **(properties or {})}
        )
        if self.precision_note:
            print(f"engine openvino: {self.precision_note}", file=sys.stderr, flush=True)
        self.n_ctx = int(n_ctx or model.max_position_embeddings or 0)
        if self.n_ctx < 1:
            raise LabError("the model states no trained context; pass n_ctx (--n-ctx)")
        # LLMPipeline runs the paged-attention backend on the CPU with prefix caching ON by default:
        # a repeated prompt would be served from the previous request's KV blocks (a prefill of one
        # step). Off here, so no request reuses another's KV cache (Engine._generate).
        sc = ov_genai.SchedulerConfig()
        sc.enable_prefix_caching = False
        self.pipe = ov_genai.LLMPipeline(self.path, self.ov_device, scheduler_config=sc, **self.properties)
        self.tok = self.pipe.get_tokenizer()
        self.n_vocab = model_vocab(model)
        self._eos = {int(self.tok.get_eos_token_id())}
        self._last_metrics = None

    # --- tokenizer (OpenVINO's own, built from the GGUF) ---------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        ids = self.tok.encode([text], add_special_tokens=add_special).input_ids
        return [int(i) for i in ids.data[0]]

    def detokenize(self, ids) -> str:
        ids = token_ids(ids)
        self.check_ids(ids)  # the same LabError in every engine (llama.cpp's aborted the process; this one gave "")
        return self.tok.decode(ids, skip_special_tokens=False)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        """OpenVINO GenAI's own path for a chat: render with the GGUF's template, then tokenize
        without adding special tokens (the template writes them)."""
        text = self.tok.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt)
        return self.tokenize(text, add_special=False)

    @property
    def bos_id(self) -> int | None:
        bos = int(self.tok.get_bos_token_id())
        return bos if bos >= 0 else None

    @property
    def eos_ids(self) -> set[int]:
        return self._eos

    # --- description ---------------------------------------------------------------
    def _device_defaults(self) -> dict:
        """The CPU plugin's defaults for the settings that change numerics (before this engine's
        properties): inference precision, KV cache precision, activation quantization group."""
        keys = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE")
        return {key: _device_property(self.ov_device, key) for key in keys}

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            version=self.library_version.split("-")[0],
            backend=f"openvino {self._ov.__version__.split('-')[0]} {self.ov_device}",
            dtype="F16" if self.weights == "f16" else (self.model.quantization or "gguf"),
            threads=self.threads,
            n_ctx=self.n_ctx,
            device=self.device,
            weights=self.weights,
            compute_dtype=self.compute_dtype(self.model, self.weights, self.ov_device, self.properties),
            flags={
                "threads_auto": self.auto_threads_at_load,
                "threads_fixed_at_load": True,
                "max_threads": self.max_threads,
                "weights": self.weights,
                "gguf": self.path,
                "properties": dict(self.properties),
                "attention": "paged (LLMPipeline's CPU default), prefix caching off",
                "cpu_defaults": self._device_defaults(),
                "precision_changed": self.precision_note,
                "kv_cache_precision": "f16 (set by the GGUF reader for F16/F32 files)"
                if self.weights == "f16"
                else "CPU default",
                "sampling": DEFINITION + " (greedy only here)",
                "settings_off": list(self.SETTINGS_OFF),
            },
        )

    def effective_config(self) -> dict:
        """The settings of the GGUF the reader builds from, with BOS/EOS read back from
        OpenVINO's tokenizer (the pipeline exposes no model config of its own)."""
        from lablib.model.formats import gguf_config

        cfg = gguf_config(self.path)
        cfg.update(bos_id=self.bos_id, eos_id=int(self.tok.get_eos_token_id()))
        return cfg

    # --- generation ---------------------------------------------------------------
    def _ov_config(self, cfg: GenerationConfig):
        g = self._g.GenerationConfig()
        g.max_new_tokens = cfg.max_new_tokens
        g.do_sample = False
        g.ignore_eos = cfg.ignore_eos
        if not cfg.ignore_eos:
            g.stop_token_ids = set(self._eos)
        return g

    def _ids_tensor(self, ids):
        return self._ov.Tensor(self._np.asarray([ids], dtype=self._np.int64))

    def _generate(self, ids, cfg: GenerationConfig, trace: RequestTrace) -> None:
        streamer = _make_streamer(self._g, trace)
        inputs = self._ids_tensor(ids)
        gcfg = self._ov_config(cfg)
        trace.start()
        res = self.pipe.generate(inputs, gcfg, streamer)
        self._last_metrics = res.perf_metrics
        last = trace.token_ids[-1] if trace.token_ids else None
        trace.finish_reason = "stop" if (not cfg.ignore_eos and last in self._eos) else "length"

    def engine_counters(self) -> dict:
        """OpenVINO GenAI's own perf_metrics of the last request: ``ttft_ms``, ``tpot_ms`` (mean
        time per output token after the first), ``n_input`` and ``n_generated`` tokens,
        ``token_infer_ms`` (each token's inference time, ms) and ``token_times_s`` (when each token
        was ready: ``raw_metrics.m_new_token_times``, ms of the steady clock, here in seconds; on
        Linux the same CLOCK_MONOTONIC as the lab's clock, so comparable with a trace's ``t_tokens``)."""
        pm = self._last_metrics
        if pm is None:
            raise LabError("engine openvino has run no request yet: no perf_metrics to read")
        raw = pm.raw_metrics
        return {
            "ttft_ms": float(pm.get_ttft().mean),
            "tpot_ms": float(pm.get_tpot().mean),
            "n_input": int(pm.get_num_input_tokens()),
            "n_generated": int(pm.get_num_generated_tokens()),
            "token_infer_ms": [d / 1e3 for d in raw.token_infer_durations],
            "token_times_s": [t / 1e3 for t in raw.m_new_token_times],
        }

    def batch_session(self, cfg: GenerationConfig, max_sequences: int, max_seq_tokens: int) -> OpenVINOBatchSession:
        """OpenVINO GenAI's continuous batching for up to ``max_sequences`` requests of at most
        ``max_seq_tokens`` (prompt + output) tokens: a ContinuousBatchingPipeline on the same GGUF
        (loaded for the session, freed at close)."""
        self.check_generation(cfg)
        self.check_context(max_seq_tokens, 0)
        return OpenVINOBatchSession(self, cfg, max_sequences, max_seq_tokens)

    def close(self) -> None:
        self.pipe = None
        self.tok = None


# OpenVINO's element type names (get_type_name) -> the lab's compute dtypes (lablib.studies.roofline's roofs)
OV_TYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "i8": "int8", "u8": "int8"}


# openvinotoolkit/openvino#33300 (open in 2026.4): the CPU plugin dies with SIGFPE (a division by zero
# in libopenvino_intel_cpu_plugin.so, which takes the whole Python process) compiling an LLMPipeline
# in bf16 on ONE thread where oneDNN picks its AMX kernels. Seen on an Intel Xeon with AMX (2 cores):
# the F16 reference with INFERENCE_NUM_THREADS=1 dies at load; 2 threads, f32 or f16 precision, or
# oneDNN capped at AVX512_CORE_BF16 (ONEDNN_MAX_CPU_ISA, process-wide) load. The lab's automatic
# thread count is 1 on a busy 2-core machine, so a lab run met it without asking for one thread.
AMX_ONE_THREAD_BUG = "openvinotoolkit/openvino#33300"


def single_thread_amx_precision(device: str, properties: dict, flags=None, default=None) -> tuple[dict, str | None]:
    """``properties`` for an ``LLMPipeline`` on ``device``, with INFERENCE_PRECISION_HINT f32 where the
    CPU plugin would compile bf16 on one thread on a CPU with AMX (``flags``: the CPU's feature flags,
    default :func:`lablib.machine.identity.cpu_flags`; ``default``: the plugin's precision when the
    properties set none, default the plugin's own), which kills the process (:data:`AMX_ONE_THREAD_BUG`).
    Returns (properties, a sentence saying what changed and why, or None when nothing changed).
    LabError when the caller asked for bf16 on one thread there: it cannot load."""
    if device != "CPU" or properties.get("INFERENCE_NUM_THREADS") != 1:
        return properties, None
    if flags is None:
        from lablib.machine.identity import cpu_flags

        flags = cpu_flags()
    if "amx_bf16" not in flags:
        return properties, None
    if str(_precision_hint(device, properties, default)).lower() != "bf16":
        return properties, None
    if properties.get("INFERENCE_PRECISION_HINT") is not None:
        raise LabError(
            "engine openvino: INFERENCE_PRECISION_HINT=bf16 on 1 thread on this CPU with AMX: OpenVINO's CPU "
            f"plugin dies with SIGFPE compiling that ({AMX_ONE_THREAD_BUG}); load with threads=2 or more, "
            "or with INFERENCE_PRECISION_HINT f32 or f16"
        )
    note = (
        "inference precision f32 instead of the CPU plugin's bf16: on 1 thread on a CPU with AMX the plugin "
        f"dies with SIGFPE compiling bf16 ({AMX_ONE_THREAD_BUG}); load with threads=2 or more for bf16"
    )
    return {**properties, "INFERENCE_PRECISION_HINT": "f32"}, note


def _precision_hint(device: str, properties: dict | None, default: str | None = None) -> str | None:
    """The inference precision ``properties`` set (an ov.Type or its name), else ``default``, else the
    ``device``'s own, as OpenVINO names a type (bf16, f32); None when neither is known."""
    hint = (properties or {}).get("INFERENCE_PRECISION_HINT")
    if hint is None:
        hint = default or _device_property(device, "INFERENCE_PRECISION_HINT")
    if hasattr(hint, "get_type_name"):  # an ov.Type given as a property
        hint = hint.get_type_name()
    return None if hint is None else str(hint)


@functools.lru_cache(maxsize=32)
def _device_property(device: str, key: str) -> str | None:
    """An OpenVINO device's default for property ``key``, as OpenVINO spells it: an element type's name
    (bf16, u8), not its Python repr; None when the device does not have it or OpenVINO is not installed."""
    try:
        import openvino as ov

        value = ov.Core().get_property(device, key)
    except (ImportError, RuntimeError):
        return None
    return value.get_type_name() if hasattr(value, "get_type_name") else str(value)


def model_vocab(model) -> int:
    """Vocabulary size of ``model`` (its shape as the lab reads it from the files)."""
    from lablib.model.shape import model_shape

    return int(model_shape(model)["vocab"] or 0)


def _make_streamer(ov_genai, trace: RequestTrace):
    """A StreamerBase whose ``write`` gets token ids (one id, or a list when the pipeline emits
    several at once) and stamps each with the lab's clock."""

    class _TokenIdStreamer(ov_genai.StreamerBase):
        def write(self, token):
            t = now()
            for tok in token if isinstance(token, (list, tuple)) else (token,):
                trace.token(int(tok), t)
            return ov_genai.StreamingStatus.RUNNING

        def end(self):
            pass

    return _TokenIdStreamer()


class OpenVINOBatchSession:
    """OpenVINO GenAI's ContinuousBatchingPipeline behind the lab's session interface.

    The scheduler holds ``max_sequences`` sequences (``max_num_seqs``) with KV blocks for all of
    them at ``max_seq_tokens`` each (``num_kv_blocks``: block size 32 on the CPU, plus one spare
    each), prefix caching off (no request reuses another's KV cache), at most 512 tokens per
    step (``max_num_batched_tokens``, as llama.cpp's n_batch). :meth:`step` is one
    ``ContinuousBatchingPipeline.step()``; afterwards each handle's new token ids are read and
    stamped with the lab's clock. ``t_start`` is the start of the first step after the request was
    submitted (the scheduler admits every waiting request that fits). ``stats``: ``steps``,
    ``max_sequences_per_step`` (the pipeline's ``scheduled_requests`` after a step),
    ``prompt_tokens``, ``generated_tokens``, ``max_cache_usage`` (% of KV blocks).
    """

    BLOCK = 32  # KV block size of the CPU plugin's paged attention, tokens

    def __init__(self, engine: OpenVINOEngine, cfg: GenerationConfig, max_sequences: int, max_seq_tokens: int):
        g = engine._g
        sc = g.SchedulerConfig()
        sc.max_num_seqs = max_sequences
        sc.num_kv_blocks = max_sequences * (-(-max_seq_tokens // self.BLOCK) + 1)
        sc.cache_size = 0  # sized by num_kv_blocks
        sc.max_num_batched_tokens = max(512, max_sequences)
        sc.enable_prefix_caching = False
        sc.dynamic_split_fuse = True
        self.engine, self.cfg = engine, cfg
        self.pipe = g.ContinuousBatchingPipeline(engine.path, sc, engine.ov_device, dict(engine.properties))
        self._gcfg = engine._ov_config(cfg)
        self._running: dict[int, tuple] = {}  # request id -> (handle, trace)
        self._n = 0
        self.stats = BatchStats.counters(
            engine,
            "openvino_genai ContinuousBatchingPipeline (paged attention, step() in the calling thread)",
            max_cache_usage=0.0,
        )

    @property
    def pending(self) -> int:
        """Requests submitted and not yet finished."""
        return len(self._running)

    def submit(self, ids: list[int], trace: RequestTrace) -> None:
        """Queue prompt ``ids`` (token ids, no re-tokenization); ``trace`` receives t_start and the tokens."""
        rid = self._n
        self._n += 1
        tensor = self.engine._ov.Tensor(self.engine._np.asarray(ids, dtype=self.engine._np.int64))
        handle = self.pipe.add_request(rid, tensor, self._gcfg)
        self._running[rid] = (handle, trace)
        self.stats["prompt_tokens"] += len(ids)

    def step(self) -> list[RequestTrace]:
        """One ContinuousBatchingPipeline.step(); the traces finished in it, in submission order."""
        if not self._running:
            return []
        t0 = now()
        for _, trace in self._running.values():
            if trace.t_start is None:
                trace.start(t0)
        self.pipe.step()
        t = now()
        m = self.pipe.get_metrics()
        st = self.stats
        st["steps"] += 1
        st["max_sequences_per_step"] = max(st["max_sequences_per_step"], int(m.scheduled_requests))
        st["max_cache_usage"] = max(st["max_cache_usage"], float(m.cache_usage))
        finished = []
        status = self.engine._g.GenerationStatus
        for rid, (handle, trace) in list(self._running.items()):
            if handle.can_read():
                for out in handle.read().values():
                    for tok in out.generated_ids:
                        trace.token(int(tok), t)
                        st["generated_tokens"] += 1
            if handle.get_status() != status.RUNNING and not handle.can_read():
                last = trace.token_ids[-1] if trace.token_ids else None
                eos = not self.cfg.ignore_eos and last in self.engine.eos_ids
                trace.finish_reason = "stop" if eos else "length"
                finished.append(trace)
                del self._running[rid]
        return finished

    def close(self) -> None:
        """Drop unfinished requests and free the pipeline (its model and KV blocks)."""
        for handle, _ in self._running.values():
            handle.stop()
        self._running.clear()
        self.pipe = None
