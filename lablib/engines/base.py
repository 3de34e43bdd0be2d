"""The interface every engine implements, and the errors they share.

An engine wraps one loaded model in one inference library. The lab talks to it
in token ids: text goes through one tokenizer, every engine is fed the same ids
(DESIGN.md, "The clock"). Each request returns a :class:`RequestTrace` with one
timestamp per generated token id.

An engine class also carries its facts, so that no module outside ``lablib/engines/``
branches on an engine's name: the model format it reads, the module it needs and how
to install it, its KV-cache bytes per value, what it allocates at load, its load
defaults, the weights it reads for each choice of its weights option and the type its
matrix products run at (:meth:`Engine.weight_tensors`, :meth:`Engine.compute_dtype`: what
lablib.studies.roofline bounds a run by; a loaded engine records both in its :class:`EngineInfo`),
the effective config it computes with (:meth:`Engine.effective_config`), and
its continuous-batching session (:class:`BatchSession`, counted in :class:`BatchStats`).

Prefix caching is opt-in (lab 08): a :class:`PrefixCache` the caller owns holds the KV cache of a
token prefix (:meth:`Engine.cache_prefix`); ``generate(ids, prefix_cache=...)`` takes the longest
common prefix from it and prefills only the rest. Without it, every request starts from an empty
KV cache (DESIGN.md, "no hidden cache reuse").
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from lablib.checks import chat_messages, whole
from lablib.engines.constraints import Constraint, ConstraintError, schema_part  # noqa: F401 - engines import them here
from lablib.errors import ContextOverflowError, EngineUnavailable, LabError, shown
from lablib.machine.threads import default_threads
from lablib.model.formats import SETTINGS_KEYS
from lablib.results.trace import RequestTrace, now

# The settings :meth:`Engine.effective_config` returns (what lablib.studies.compare holds side by side): the
# model layer's keys, the same for a config.json, a GGUF header and each engine
CONFIG_KEYS = SETTINGS_KEYS


@dataclass
class GenerationConfig:
    """What to generate.

    ``max_new_tokens``: output budget (tokens). ``ignore_eos``: generate exactly
    ``max_new_tokens`` (sweeps, so engines do equal work) instead of stopping at
    EOS; an EOS the model picks is kept in the output and generation goes on
    (vLLM's ``ignore_eos``), it is not masked. ``temperature`` 0 means greedy; otherwise sampled with
    ``top_k`` (0 = off), ``top_p`` (1 = off) and ``seed``, as :data:`lablib.engines.sampling.DEFINITION` says:
    logits / temperature -> top-k -> top-p -> softmax -> draw, in every engine and mode. These
    settings are all that apply: what a model folder (generation_config.json) or a library
    default asks for beyond them is switched off (each engine's ``info().flags["settings_off"]``).
    """

    max_new_tokens: int = 32
    ignore_eos: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    top_k: int = 0
    # what the output must match (structured output, lab 10): a :class:`Constraint`, or None (free text)
    constraint: Constraint | None = None
    # the LoRA adapter this request uses, by the name the server was started with (lab 11; a server that serves
    # several adapters at once: llama-server, vLLM); None: the base model. In-process engines carry their adapter
    # from load (``load_engine(..., adapter=)``) and refuse a request naming another
    adapter: str | None = None

    def __post_init__(self):
        self.max_new_tokens = whole(self.max_new_tokens, "max_new_tokens", "a whole number of tokens, at least 1")
        if self.constraint is not None:
            if not isinstance(self.constraint, Constraint):
                raise LabError(
                    f"constraint={self.constraint!r}: expected a Constraint (Constraint.json_schema(schema) or "
                    "Constraint.regex(pattern)) or None"
                )
            if self.ignore_eos:
                raise LabError(
                    f"constraint {self.constraint.label} with ignore_eos=True: a constrained output ends where its "
                    "grammar ends (the only token then allowed is EOS); set ignore_eos=False"
                )
        if not 0 <= self.temperature < float("inf"):  # NaN and infinity too: logits / either are no distribution
            raise LabError(f"temperature={self.temperature}: expected a finite number, 0 (greedy) or more")
        if not 0 < self.top_p <= 1:
            raise LabError(f"top_p={self.top_p}: expected a value in (0, 1]")
        self.top_k = whole(self.top_k, "top_k", "a whole number of tokens, 0 (off) or more", lo=0)
        self.seed = whole(self.seed, "seed", "a whole number, 0 or more", lo=0)
        if self.adapter is not None and (not isinstance(self.adapter, str) or not self.adapter.strip()):
            raise LabError(f"adapter={self.adapter!r}: expected an adapter's name (a non-empty string) or None")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class EngineInfo:
    """How an engine describes itself (goes into every result's manifest)."""

    name: str
    version: str
    backend: str
    dtype: str  # weights as the engine computes with them: float32, Q4_1, ...
    threads: int
    n_ctx: int  # context window the engine enforces or was trained to, tokens
    flags: dict = field(default_factory=dict)
    device: str = "cpu"  # what it computes on: cpu, cuda, mps (torch), metal / gpu (MLX), cuda/metal offload
    # the weights it loaded, as its ``Engine.weights_option`` load keyword names them ("int4", "source", ...;
    # None: an engine with one choice); Engine.weight_tensors(model, weights) lists them
    weights: str | None = None
    # the type its matrix products run at (float32, bfloat16, float16, int8): the roof that bounds its arithmetic
    compute_dtype: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PrefixCache:
    """The KV cache of one token prefix, kept by the caller for reuse (prefix caching, lab 08).

    Made by :meth:`Engine.cache_prefix` (a prefill whose KV is kept) and used by
    ``engine.generate(ids, prefix_cache=cache)``. ``engine``: the name of the engine that made it
    (only that engine, loaded on the same model, can use it); ``ids``: the token ids whose KV it
    holds, positions 0..len(ids)-1; ``state``: the engine's copy of that KV (llama.cpp: a sequence's
    state bytes; transformers: per-layer key/value tensors; mlx: per-layer key/value arrays);
    ``nbytes``: bytes the kept KV occupies, as the engine measures it.
    """

    engine: str
    ids: list[int]
    state: Any = None
    nbytes: int = 0

    def reusable(self, ids) -> int:
        """Leading tokens of ``ids`` this cache can supply: their longest common prefix with
        :attr:`ids`, at most ``len(ids) - 1`` (the last prompt token is always computed: its logits
        give the first output token, as llama-server's prompt cache does)."""
        n, limit = 0, min(len(self.ids), len(ids) - 1)
        while n < limit and self.ids[n] == ids[n]:
            n += 1
        return n

    def __repr__(self):
        return f"PrefixCache({self.engine}, {len(self.ids)} tokens, {self.nbytes} bytes)"


class BatchSession(Protocol):
    """An engine's continuous batching, driven by :func:`lablib.measure.closed_loop.run_closed_loop`.

    ``submit(ids, trace)`` queues a request (its trace receives t_start and the token events);
    ``step()`` advances every running sequence by one engine step and returns the traces that
    finished in it; ``pending`` counts submitted, unfinished requests; ``stats`` is a dict counted
    from the engine's own state, not from clocks (the keys of :class:`BatchStats`, plus
    engine-specific counters); ``close()`` frees what is still held.
    """

    stats: dict

    @property
    def pending(self) -> int: ...

    def submit(self, ids: list[int], trace: RequestTrace) -> None: ...

    def step(self) -> list[RequestTrace]: ...

    def close(self) -> None: ...


@dataclass
class BatchStats:
    """What one closed-loop run counted. ``steps``: engine steps (forward passes / decode calls;
    None in serial mode); ``max_sequences_per_step``: the most sequences that advanced in one
    step (the evidence of batching); ``prompt_tokens`` and ``generated_tokens``: tokens the
    engine processed; ``extra``: engine-specific counters (e.g. ``max_tokens_per_step``)."""

    mode: str
    concurrency: int
    requests: int
    engine: str
    impl: str
    steps: int | None = None
    max_sequences_per_step: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    extra: dict = field(default_factory=dict)

    @staticmethod
    def counters(engine, impl: str, *maxima: str, **start) -> dict:
        """A batch session's ``stats`` dict at its start: ``engine`` (its name) and ``impl`` (what
        batches), the shared counters at 0 (``steps``, ``max_sequences_per_step``, ``prompt_tokens``,
        ``generated_tokens``), then the engine's own: each name of ``maxima`` at 0 (e.g.
        ``max_tokens_per_step``) and ``start``'s counters at their given values."""
        counts = {"engine": engine.name, "impl": impl, "steps": 0, "max_sequences_per_step": 0}
        return {**counts, **dict.fromkeys(maxima, 0), "prompt_tokens": 0, "generated_tokens": 0, **start}

    @classmethod
    def from_counts(cls, counts: dict, **run) -> BatchStats:
        """Shared keys of a session's ``stats`` dict become fields, the rest ``extra``."""
        names = set(cls.__dataclass_fields__) - {"extra"}
        merged = {**counts, **run}
        return cls(
            **{k: v for k, v in merged.items() if k in names}, extra={k: v for k, v in merged.items() if k not in names}
        )

    def to_dict(self) -> dict:
        """One flat dict: the fields and the engine-specific counters."""
        d = asdict(self)
        return {**d.pop("extra"), **d}


class TokenizerLike(Protocol):
    """What the tokenizer and template checks of lablib.studies.compare need (an Engine, or a
    tokenizer alone such as lablib.studies.compare.TokenizerView)."""

    name: str

    def tokenize(self, text: str, add_special: bool = False) -> list[int]: ...

    def detokenize(self, ids: list[int]) -> str: ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]: ...

    @property
    def bos_id(self) -> int | None: ...


def token_ids(ids) -> list[int]:
    """``ids`` as a list of ints: token ids (numpy integers included); LabError for text, floats, booleans (was:
    "hello" failed in int() with "invalid literal", [1.7, 2.2] ran silently as [1, 2])."""
    import operator

    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise LabError(
            f"ids={ids!r:.60}: expected token ids (a list of ints): make them with engine.tokenize(text) or "
            "lablib.chat_ids(model, messages)"
        )
    out = []
    for i in ids:
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise LabError(f"token id {i!r:.40}: expected token ids as whole numbers (ints)")
        out.append(operator.index(i))
    return out


def check_text(text, what: str = "text") -> str:
    """``text`` when it is a str; LabError naming what was given otherwise (was: llama.cpp's AttributeError
    "'int' object has no attribute 'encode'", transformers' ValueError on its batch types, or a list tokenized
    as a batch)."""
    if not isinstance(text, str):
        raise LabError(
            f"{what}={shown(text)}: expected text (a str) to tokenize; a chat's messages go to "
            "engine.apply_chat_template(messages), token ids to engine.generate as they are"
        )
    return text


# an engine verb's first argument, checked before the engine's library sees it: {verb: (keyword, check)}
VERB_ARGUMENTS = {"tokenize": ("text", check_text), "apply_chat_template": ("messages", chat_messages)}


class Engine:
    """Base class. Subclasses set ``name`` and their facts, and implement the ``_``-methods.

    Public verbs: :meth:`tokenize`, :meth:`apply_chat_template`,
    :meth:`generate`, :meth:`info`, :meth:`close`; :meth:`batch_session` where the
    library batches; :meth:`effective_config` for lablib.studies.compare.
    """

    name = "engine"
    # --- facts (class attributes: known before the library loads) ---------------
    format: ClassVar[str] = ""  # the model format it reads: "gguf", "hf" or "mlx"
    requires: ClassVar[str] = ""  # the module that must import for it to load
    install_hint: ClassVar[str] = ""  # what to run when that module is missing
    kv_bytes_per_value: ClassVar[int] = 4  # bytes of one K or V element in its KV cache
    reserves_kv_at_load: ClassVar[bool] = False  # True: the KV cache for all of n_ctx is allocated at load
    in_process: ClassVar[bool] = True  # False: the model runs in another process (a server), no memory check here
    # the weight dtypes its ``dtype=`` load argument takes (the quality ladder's variants); () = none
    dtypes: ClassVar[tuple[str, ...]] = ()
    # the load keyword that chooses which weights it reads ("precision", "weights", "dtype") and its choices,
    # the default first; None and (): one choice, its format's file (EngineInfo.weights records the choice)
    weights_option: ClassVar[str | None] = None
    weights_choices: ClassVar[tuple[str, ...]] = ()
    lab_default: ClassVar[bool] = True  # in the lab's default set: what sweeps, compare and notebooks run unasked
    compare_load_kwargs: ClassVar[dict] = {}  # lablib.studies.compare loads it so: as the library alone reads the model
    modes: ClassVar[tuple] = ("serial", "batched")  # scheduling modes lablib.measure.closed_loop runs it in
    prefix_caching: ClassVar[bool] = False  # True: generate(..., prefix_cache=) reuses a kept prefix (lab 08)
    # True: the quality ladder's GGUF engine: its library's quantizer makes the GGUF rungs (lablib.studies.quant)
    # and the ladder measures them and the F32 reference on it (lablib.studies.ladder.gguf_engine); exactly one engine
    quantizes_gguf: ClassVar[bool] = False
    # the Constraint kinds (json_schema, regex) it enforces per request (structured output, lab 10); () = none: a
    # constrained request is refused (check_constraint), never run unconstrained
    constraints: ClassVar[tuple[str, ...]] = ()
    # the speculative decoding its library runs itself (lab 10), by method ("prompt lookup", "draft model"); () = none
    speculation_methods: ClassVar[tuple[str, ...]] = ()
    # the form of a LoRA adapter it reads at load (lab 11; ``load_engine(..., adapter=)``): "peft", "gguf" or "mlx",
    # a form of lablib.model.adapters.Adapter.path_for; None: it takes no adapter (load_engine refuses adapter=)
    adapter_form: ClassVar[str | None] = None
    # the form of lablib.model.adapters.merged_model it loads instead of the base with merge_adapter=True
    merged_form: ClassVar[str | None] = None

    # the LoRA adapter loaded with the engine (lab 11), set at load: ``adapter`` (a lablib.model.adapters.Adapter;
    # None: the base model), ``adapter_merged`` (True: the weights of merged_model were loaded instead of the
    # base's), ``adapter_load_s`` (seconds to read the unmerged adapter and attach it to the loaded base, the lab's
    # clock; None merged or without one), ``adapter_bytes`` (bytes the engine holds for it: the LoRA tensors as
    # loaded, unmerged; the merged weights' bytes less the base's, merged; 0 without one)
    adapter = None
    adapter_merged: bool = False
    adapter_load_s: float | None = None
    adapter_bytes: int = 0

    # True once close() ran: a request then raises LabError (check_open). Was: llama.cpp's generate on its freed
    # context ended the process by SIGSEGV (a notebook's kernel died); the others raised AttributeError
    closed: bool = False
    # the verbs that read the loaded model: each engine's own refuses after close() as generate does (check_open).
    # Was: AttributeError on None from transformers', MLX's, OpenVINO's and ONNX Runtime GenAI's
    needs_open: ClassVar[tuple] = (
        "tokenize",
        "detokenize",
        "apply_chat_template",
        "info",
        "logits",
        "iter_logits",
        "batch_session",
        "effective_config",
    )

    def __init_subclass__(cls, **kw):
        """Every engine's own ``close`` marks the engine closed when it has run (:attr:`closed`), so no engine
        file needs to remember to; its own verbs call :meth:`check_open` first (those of :attr:`needs_open`) and
        check what they are given (:data:`VERB_ARGUMENTS`) before its library sees it."""
        super().__init_subclass__(**kw)
        for verb in (*Engine.needs_open, *VERB_ARGUMENTS):
            own_verb = cls.__dict__.get(verb)
            if callable(own_verb) and not getattr(own_verb, "checked_by_engine_base", False):

                @functools.wraps(own_verb)
                def checked(self, *a, _own=own_verb, _verb=verb, **k):
                    if _verb in self.needs_open:
                        self.check_open()
                    key, check = VERB_ARGUMENTS.get(_verb, (None, None))
                    if check is not None and (a or key in k):
                        check(a[0] if a else k[key], key)
                    return _own(self, *a, **k)

                checked.checked_by_engine_base = True  # wrapped once: a subclass that keeps it is not wrapped again
                setattr(cls, verb, checked)
        own = cls.__dict__.get("close")
        if own is not None and not getattr(own, "marks_closed", False):

            @functools.wraps(own)
            def close(self, _own=own):
                try:
                    _own(self)
                finally:
                    self.closed = True

            close.marks_closed = True
            cls.close = close

    def check_open(self) -> None:
        """Raise LabError when :meth:`close` has run (its model and context are freed)."""
        if self.closed:
            raise LabError(
                f"the {self.name} engine was closed (engine.close(), or the end of its with block): its model is "
                f"freed; load it again (lablib.load_engine({self.name!r}, model)) to run a request"
            )

    @classmethod
    def check_adapter(cls, model, adapter, merge_adapter: bool = False) -> None:
        """Raise LabError, before any loading, unless ``adapter`` (None, or a lablib.model.adapters.Adapter made
        for ``model``, a ResolvedModel) and ``merge_adapter`` can be loaded by this engine."""
        if adapter is None:
            if merge_adapter:
                raise LabError(
                    "merge_adapter=True without adapter=: expected the adapter to merge (lablib.model.adapters."
                    "make_adapter(model)), or merge_adapter=False"
                )
            return
        from lablib.model.adapters import Adapter, check_adapter_for

        if not cls.adapter_form:
            raise LabError(
                f"engine {cls.name} takes no LoRA adapter in the lab (adapter={getattr(adapter, 'name', adapter)!r})"
            )
        if not isinstance(adapter, Adapter):
            raise LabError(
                f"adapter={adapter!r}: expected a LoRA adapter made by lablib.model.adapters.make_adapter(model) "
                "(an Adapter), or None"
            )
        check_adapter_for(adapter, model)

    def _begin_adapter(self, adapter, merge_adapter: bool) -> str | None:
        """At load, before the weights: check ``adapter`` (:meth:`check_adapter`) and record it; returns the path
        of the merged model to load instead of the base's (``merge_adapter``: made on first use), else None."""
        self.check_adapter(self.model, adapter, merge_adapter)
        self.adapter, self.adapter_merged = adapter, bool(adapter is not None and merge_adapter)
        self.adapter_load_s, self.adapter_bytes = None, 0
        if not self.adapter_merged:
            return None
        from lablib.model.adapters import merged_model

        return merged_model(adapter, self.merged_form)

    def adapter_flags(self) -> dict:
        """What :meth:`info` records of the loaded adapter ({} without one): ``adapter`` (its name),
        ``adapter_rank``, ``adapter_merged``."""
        if self.adapter is None:
            return {}
        return {"adapter": self.adapter.name, "adapter_rank": self.adapter.rank, "adapter_merged": self.adapter_merged}

    def check_adapter_request(self, cfg: GenerationConfig) -> None:
        """Raise LabError when ``cfg.adapter`` names an adapter other than the one loaded: an in-process engine
        carries one adapter, from load."""
        if cfg.adapter is None or (self.adapter is not None and cfg.adapter == self.adapter.name):
            return
        has = f"carries adapter {self.adapter.name}" if self.adapter is not None else "was loaded without an adapter"
        raise LabError(
            f"request for adapter {cfg.adapter!r}, but engine {self.name} {has}: an in-process engine carries the one "
            f"adapter it was loaded with; load it with that adapter (load_engine({self.name!r}, model, adapter=...)) "
            "or send the request without GenerationConfig.adapter"
        )

    @classmethod
    def speculation_kwargs(cls, method: str, k: int, draft=None) -> dict:
        """Load keywords that make this engine speculate with ``method`` (one of :attr:`speculation_methods`),
        ``k`` draft tokens a step, ``draft`` the draft model where the method takes one (its own form: a dtype, a
        folder). Raises LabError for a method it does not run."""
        raise LabError(
            f"engine {cls.name} runs no {method!r} speculation of its own in the lab; expected one of "
            f"{', '.join(cls.speculation_methods) or 'none'}"
        )

    @classmethod
    def unsupported(cls, model) -> str | None:
        """Why this engine cannot read ``model`` (a ResolvedModel), known before loading anything: one message
        naming the model, what it lacks or what the engine does not support, and what to do; None when it can
        (as far as can be told without loading it). Here: its format could not be had (a converter that does not
        know the architecture, :attr:`ResolvedModel.unavailable`); engines add what their reader supports."""
        from lablib.errors import FormatError

        if cls.format and not getattr(model, f"{cls.format}_path", None):
            try:
                model.path_for(cls.format, cls.name)
            except FormatError as e:
                return str(e)
        return None

    @classmethod
    def default_load_kwargs(cls, model, concurrency: int = 1) -> dict:
        """Load keywords the lab fills in when the caller gives none, for ``concurrency``
        sequences at once (e.g. llama.cpp's context size and parallel sequences)."""
        return {}

    @classmethod
    def check_weights(cls, weights: str | None) -> str | None:
        """``weights`` as a choice of :attr:`weights_choices` (None: the default, the first; None for an
        engine with one choice). Raises LabError naming the choices for anything else."""
        if not weights:
            return cls.weights_choices[0] if cls.weights_choices else None
        if not cls.weights_choices:
            raise LabError(
                f"weights={weights!r} for {cls.name}: it has one choice, its {cls.format or 'model'} file as "
                "given; expected no weights choice (None)"
            )
        if weights not in cls.weights_choices:
            raise LabError(
                f"{cls.weights_option}={weights!r} for {cls.name}: expected one of "
                f"{', '.join(cls.weights_choices)} (its {cls.weights_option}= load keyword)"
            )
        return weights

    @classmethod
    def weights_path(cls, model, weights: str | None = None, log=lambda *_: None) -> str | None:
        """The weights file or folder the engine reads for ``model`` when loaded with ``weights`` (a choice
        of :attr:`weights_choices`; None: its default): its format's path by default (None when
        ``model`` has none). Engines whose weights are derived write them on first use (saying so to
        ``log``)."""
        cls.check_weights(weights)
        return getattr(model, f"{cls.format}_path", None) if cls.format else None

    @classmethod
    def weight_tensors(cls, model, weights: str | None = None) -> tuple:
        """(name, type, elements, bytes) of every weight tensor the engine holds for ``model`` loaded with
        ``weights`` (:meth:`weights_path`'s file or folder, as stored: :func:`lablib.model.formats.weight_tensors`).
        lablib.studies.roofline counts the bytes a step reads from them. Raises LabError when there is no such file."""
        from lablib.model.formats import weight_tensors

        path = cls.weights_path(model, weights)
        if not path:
            raise LabError(
                f"{getattr(model, 'source', model)}: no {cls.format or 'weights'} files for {cls.name}; "
                "run `lablib prepare` on a model in that format"
            )
        return weight_tensors(path)

    @classmethod
    def compute_dtype(cls, model, weights: str | None = None) -> str:
        """The type the engine's matrix products run at for ``model`` loaded with ``weights``, as known
        before loading (float32 by default); a loaded engine reports its own in ``info().compute_dtype``."""
        return "float32"

    @classmethod
    def weights_bytes(cls, model) -> int:
        """Bytes of weights the engine loads: its format's file, or the folder's weight files
        (the parameters x 4 bytes when ``model`` has no path in that format)."""
        path = cls.weights_path(model)
        if not path:
            return model.parameters * 4
        p = Path(path)
        if p.is_file():
            return p.stat().st_size
        files = list(p.glob("*.safetensors")) or list(p.glob("pytorch_model*.bin"))
        return sum(f.stat().st_size for f in files)

    @classmethod
    def kv_cache_bytes(cls, model, context_tokens: int, sequences: int = 1, **load) -> int:
        """KV cache bytes the engine holds for ``sequences`` sequences of ``context_tokens`` tokens each, loaded
        with ``load`` (its load keywords; ``prompt_tokens=``, the request's prompt, where what it holds depends on
        it, as mlx-lm's rotating cache does): by default what the model needs
        (:func:`lablib.model.shape.kv_cache_bytes`: a sliding-window layer keeps at most its window) at
        :attr:`kv_bytes_per_value`; an engine that allocates otherwise overrides it and says why in
        :meth:`kv_cache_note`."""
        from lablib.model.shape import kv_cache_bytes, model_dims

        return kv_cache_bytes(model_dims(model), cls.kv_bytes_per_value, context_tokens, sequences)

    @classmethod
    def kv_cache_note(cls, model, **load) -> str:
        """Why :meth:`kv_cache_bytes` differs from what ``model`` needs ("": it does not)."""
        return ""

    @classmethod
    def runtime_bytes(cls, model, n_batch: int = 512, context_tokens: int = 0) -> int:
        """Buffers allocated at load besides weights and KV cache, bytes (0: activations are
        allocated per request and covered by lablib.engines.memory's headroom)."""
        return 0

    @classmethod
    def check_generation(cls, cfg: GenerationConfig) -> None:
        """Raise LabError when this engine cannot run ``cfg`` (e.g. sampling in a greedy-only
        engine); a class method, so callers check before loading anything."""

    # what the last request's constraint cost, where the engine times its own compile: ``compile_s`` (seconds to
    # turn it into the engine's grammar, for this request) and ``compile_cached`` (True: a grammar compiled for an
    # earlier request was reused); {} without a constraint
    constraint_stats: dict = {}

    def check_constraint(self, cfg: GenerationConfig) -> None:
        """Raise LabError naming this engine when ``cfg.constraint`` is a kind it cannot enforce (its
        ``constraints``): a constrained request is never run unconstrained."""
        c = cfg.constraint
        if c is not None and c.kind not in self.constraints:
            can = ", ".join(self.constraints) if self.constraints else "no constraints"
            raise LabError(
                f"engine {self.name} cannot enforce a {c.kind} constraint ({c.name!r}): it enforces {can}. Use an "
                "engine that does (llama.cpp, transformers, or a llama-server or vLLM server through the http "
                "engine) or send the request without a constraint"
            )

    library_version: str | None = None  # the ``__version__`` of :attr:`requires`, once :meth:`_import_library` ran
    # the bytes of KV cache the last request held when it ended, as the engine's own cache objects measure them
    # (transformers: its cache's key and value tensors; mlx: its prompt cache's arrays); None where not read
    # (llama.cpp allocates its KV cache at load: kv_report()). What Engine.kv_cache_bytes predicts.
    last_kv_bytes: int | None = None

    def __init__(self, model):
        self.model = model  # lablib.model.resolve.ResolvedModel

    def _import_library(self, *modules: str) -> tuple:
        """Import the library this engine runs on, ``modules`` in order (dotted names: "mlx.core"),
        and return them, as a tuple. Raises EngineUnavailable naming the module that failed and
        :attr:`install_hint`, the engine's one install hint. Records the ``__version__`` of
        :attr:`requires` (imported by then) as :attr:`library_version`, what :meth:`info` reports."""
        import importlib
        import sys

        found = []
        for name in modules:
            try:
                found.append(importlib.import_module(name))
            except ImportError as e:  # pragma: no cover - load_engine and doctor report a missing library first
                raise EngineUnavailable(
                    f"engine {self.name}: {name} cannot be imported ({e}); install it: {self.install_hint}"
                ) from e
        version = getattr(sys.modules.get(self.requires), "__version__", None)
        self.library_version = None if version is None else str(version)
        return tuple(found)

    # --- to implement --------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        """Text -> token ids with this engine's tokenizer (special tokens parsed)."""
        raise NotImplementedError

    def detokenize(self, ids: list[int]) -> str:
        raise NotImplementedError

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Chat messages [{"role", "content"}] -> prompt token ids, via this engine's template."""
        raise NotImplementedError

    def info(self) -> EngineInfo:
        raise NotImplementedError

    @property
    def eos_ids(self) -> set[int]:
        raise NotImplementedError

    def _generate(self, ids: list[int], cfg: GenerationConfig, trace: RequestTrace, prefix_cache=None) -> None:
        """Run prefill and decode for ``ids``; call ``trace.start()`` when the
        engine begins work and ``trace.token(id)`` as each token id arrives.
        Must not reuse KV cache from an earlier request, unless given ``prefix_cache``
        (engines with :attr:`prefix_caching`): then copy its first
        ``prefix_cache.reusable(ids)`` tokens' KV (after ``trace.start()``: the copy is the
        request's work), set ``trace.cached_tokens`` to that count and prefill only the rest."""
        raise NotImplementedError

    def _cache_prefix(self, ids: list[int]) -> PrefixCache:
        """Prefill ``ids`` and return their KV cache as a :class:`PrefixCache` (engines with
        :attr:`prefix_caching`)."""
        raise NotImplementedError

    def _keep_request(self, prefix_cache: PrefixCache, ids: list[int], trace: RequestTrace) -> None:
        """After a request run with ``prefix_cache``: make it hold that request's KV (prompt and the
        output tokens fed back), as a chat server keeps a conversation's cache for its next turn."""
        raise NotImplementedError

    @property
    def bos_id(self) -> int | None:
        """The BOS token id as this engine's tokenizer knows it (None if it has none)."""
        raise NotImplementedError

    def logits(self, ids: list[int]):
        """Teacher-forced logits for ``ids``: float32 numpy array [len(ids), vocab]."""
        raise NotImplementedError(f"{self.name} does not expose logits")

    def iter_logits(self, ids: list[int], chunk: int = 64):
        """Teacher-forced logits for ``ids``, ``chunk`` positions at a time: yields float32 numpy
        arrays [<= chunk, vocab] in position order (one KV cache across chunks), so a caller
        never holds [len(ids), vocab] (49,152 floats a position for SmolLM2). Engines override
        this; the fallback slices :meth:`logits`."""
        full = self.logits(ids)
        for at in range(0, len(full), chunk):
            yield full[at : at + chunk]

    def close(self) -> None:
        """Free the model (memory) where the library allows it."""

    def engine_counters(self) -> dict:
        """The library's own counters for the last request, where it has them (``n_p_eval``: prompt
        tokens evaluated in prefill). Default: none ({})."""
        return {}

    def cache_prefix(self, ids) -> PrefixCache:
        """Prefill ``ids`` (a shared system prompt, a conversation so far) and keep their KV cache:
        a :class:`PrefixCache` for ``generate(..., prefix_cache=)``. ``ids`` may be empty (an empty
        cache, e.g. for a chat kept with ``keep=True``). Not a measured request: no trace. Raises
        LabError for an engine without prefix caching, ContextOverflowError when ``ids`` exceed
        the context."""
        self.check_open()
        self._check_prefix_caching()
        ids = token_ids(ids)
        if not ids:
            return PrefixCache(self.name, [])
        self.check_ids(ids)
        self.check_context(len(ids), 0)
        self.adapt_threads()
        return self._cache_prefix(ids)

    def _check_prefix_caching(self, cache: PrefixCache | None = None) -> None:
        if not self.prefix_caching:
            raise LabError(
                f"engine {self.name} has no prefix caching in the lab; use one of the in-process engines "
                "(transformers, llama.cpp, mlx)"
            )
        if cache is not None and (not isinstance(cache, PrefixCache) or cache.engine != self.name):
            made = cache.engine if isinstance(cache, PrefixCache) else type(cache).__name__
            raise LabError(
                f"prefix_cache was made by {made}, not {self.name}: make it with this engine's cache_prefix(ids)"
            )

    def effective_config(self) -> dict:
        """The settings this loaded engine computes with ({key: value} for :data:`CONFIG_KEYS`),
        read back from the library's loaded objects where it exposes them."""
        raise LabError(f"engine {self.name} does not report its effective config")

    def batch_session(self, cfg: GenerationConfig, max_sequences: int, max_seq_tokens: int) -> BatchSession:
        """A continuous-batching session for up to ``max_sequences`` requests of at most
        ``max_seq_tokens`` (prompt + output) each. Raises LabError for an engine without one."""
        raise LabError(f"engine {self.name} has no batched mode; use mode='serial'")

    def _apply_threads(self, n: int) -> None:
        """Make the engine compute with ``n`` threads from the next request on (engines whose
        library can change it cheaply override this; see :meth:`adapt_threads`)."""

    # --- shared --------------------------------------------------------
    n_ctx: int = 0  # context window, tokens; each engine sets it when it loads
    n_vocab: int = 0  # vocabulary size; each engine sets it when it loads
    threads: int = 0  # threads the engine computes with now
    max_threads: int = 0  # threads on a quiet machine: the CPUs this process may use
    auto_threads: bool = False  # True: threads follow the CPUs other processes leave free
    _busy = None  # lablib.machine.BusyMeter when auto_threads

    def _init_threads(self, threads: int | None) -> int:
        """Each engine's thread count at load: ``threads`` when given, else LABLIB_THREADS, else
        automatic (:func:`default_threads` on a quiet machine, fewer while other processes keep
        CPUs busy: :meth:`adapt_threads`). Returns the count to load with."""
        from lablib.machine.threads import BusyMeter, threads_beside_others

        fixed = threads is not None or bool(os.environ.get("LABLIB_THREADS", "").strip())
        self.max_threads = threads or default_threads()
        self.auto_threads = not fixed
        self.threads = self.max_threads
        if self.auto_threads:
            self._busy = BusyMeter()
            self.threads = threads_beside_others(self.max_threads, self._busy.others())
        return self.threads

    def adapt_threads(self) -> int:
        """Before a request: with automatic threads, use the CPUs other processes left free since
        the last request (:func:`lablib.machine.threads_beside_others`). Returns the threads the
        request runs with (recorded in its trace and row)."""
        if self.auto_threads and self._busy is not None:
            from lablib.machine.threads import threads_beside_others

            n = threads_beside_others(self.max_threads, self._busy.others())
            if n != self.threads:
                self._apply_threads(n)
                self.threads = n
        return self.threads

    def check_ids(self, ids) -> None:
        """Raise LabError naming the first token id outside [0, n_vocab)."""
        if self.n_vocab:
            bad = next((i for i in ids if not 0 <= i < self.n_vocab), None)
            if bad is not None:
                raise LabError(
                    f"token id {bad} is outside {self.name}'s vocabulary of {self.n_vocab} "
                    f"(ids 0..{self.n_vocab - 1}); were the ids made by another model's tokenizer?"
                )

    def check_context(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise ContextOverflowError unless prompt + output fits this engine's context."""
        need = prompt_tokens + max_new_tokens
        if need > self.n_ctx:
            raise ContextOverflowError(
                f"context overflow on {self.name}: prompt {prompt_tokens} + output "
                f"{max_new_tokens} = {need} tokens, but the context holds {self.n_ctx}. "
                f"Shorten the prompt, ask for fewer output tokens (max_new_tokens=...), or {self._larger_context()}."
            )

    def _larger_context(self) -> str:
        """How to give this engine a larger context, for :meth:`check_context`'s message: an in-process
        engine is loaded with ``n_ctx=``; an engine whose context is a server's says the server's knob."""
        return (
            f"load the engine with a larger context (n_ctx=...; the model was trained to "
            f"{self.model.max_position_embeddings})"
        )

    def generate(
        self,
        ids: list[int],
        cfg: GenerationConfig | None = None,
        t_submit: float | None = None,
        prefix_cache: PrefixCache | None = None,
        keep: bool = False,
    ) -> RequestTrace:
        """Generate from prompt token ids; returns the request's trace.

        ``t_submit`` is when the request entered the lab's queue (default: now).
        ``prefix_cache`` (opt-in prefix caching, lab 08; a :class:`PrefixCache` from
        :meth:`cache_prefix`): its KV for the longest common prefix with ``ids`` is copied in and
        only the rest is prefilled; ``trace.cached_tokens`` counts the tokens taken from it. With
        ``keep``, afterwards the cache holds this request's KV (prompt and output), for the next
        turn of a chat. Without ``prefix_cache`` the request starts from an empty KV cache.
        Raises ContextOverflowError before any work when it cannot fit, LabError for settings the
        engine cannot run (:meth:`check_generation`) or an adapter other than the one it loaded
        (:meth:`check_adapter_request`).
        """
        self.check_open()
        cfg = cfg or GenerationConfig()
        if not isinstance(cfg, GenerationConfig):  # was: AttributeError "... has no attribute 'constraint'"
            raise LabError(
                f"cfg={cfg!r:.60}: expected a GenerationConfig, such as GenerationConfig(max_new_tokens=32) "
                "(from lablib.engines.base)"
            )
        self.check_generation(cfg)
        self.check_constraint(cfg)
        self.check_adapter_request(cfg)
        ids = token_ids(ids)
        if not ids:
            raise LabError("empty prompt: expected at least one token id")
        self.check_ids(ids)
        self.check_context(len(ids), cfg.max_new_tokens)
        if keep and prefix_cache is None:
            raise LabError("keep=True needs a prefix_cache to keep the request's KV in")
        if prefix_cache is not None:
            self._check_prefix_caching(prefix_cache)
        threads = self.adapt_threads()
        if t_submit is None:
            t_submit = now()  # after validation: a single request has no queue
        trace = RequestTrace(prompt_tokens=len(ids), t_submit=t_submit, threads=threads)
        if prefix_cache is None:
            self._generate(ids, cfg, trace)
            return trace
        self._generate(ids, cfg, trace, prefix_cache=prefix_cache)
        if keep:
            self._keep_request(prefix_cache, ids, trace)
        return trace

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<{type(self).__name__} {self.model.name}>"
