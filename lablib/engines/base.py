"""The interface every engine implements, and the errors they share.

An engine wraps one loaded model in one inference library. The lab talks to it
in token ids: text goes through one tokenizer, every engine is fed the same ids
(DESIGN.md, "The clock"). Each request returns a :class:`RequestTrace` with one
timestamp per generated token id.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from ..errors import ContextOverflowError, LabError
from ..trace import RequestTrace, now


@dataclass
class GenerationConfig:
    """What to generate.

    ``max_new_tokens``: output budget (tokens). ``ignore_eos``: generate exactly
    ``max_new_tokens`` (sweeps, so engines do equal work) instead of stopping at
    EOS; an EOS the model picks is kept in the output and generation goes on
    (vLLM's ``ignore_eos``), it is not masked. ``temperature`` 0 means greedy; otherwise sampled with
    ``top_k`` (0 = off), ``top_p`` (1 = off) and ``seed``, as :data:`lablib.sampling.DEFINITION` says:
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

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise LabError(f"max_new_tokens={self.max_new_tokens}: expected at least 1 token")
        if self.temperature < 0:
            raise LabError(f"temperature={self.temperature}: expected 0 (greedy) or more")
        if not 0 < self.top_p <= 1:
            raise LabError(f"top_p={self.top_p}: expected a value in (0, 1]")
        import operator

        try:
            k = None if isinstance(self.top_k, bool) else operator.index(self.top_k)  # int, numpy integers
        except TypeError:
            k = None
        if k is None or k < 0:
            raise LabError(f"top_k={self.top_k!r}: expected a whole number of tokens, 0 (off) or more")
        self.top_k = k

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

    def to_dict(self) -> dict:
        return asdict(self)


# Oversubscription is a fair experiment (what do 8 threads on 2 cores cost?), thousands of
# threads are not: llama.cpp crashes, torch cannot start them.
MAX_THREADS_PER_CPU = 4


def check_threads(value, what: str = "threads") -> int:
    """``value`` as a thread count: a whole number from 1 to :data:`MAX_THREADS_PER_CPU` per
    logical CPU (a str of digits, an int or a numpy integer). Raises LabError naming ``what``."""
    import operator

    from ..hardware import cpus_usable

    most = MAX_THREADS_PER_CPU * (os.cpu_count() or 1)
    try:
        n = int(value) if isinstance(value, str) and value.strip().isdecimal() else operator.index(value)
    except (TypeError, ValueError):
        n = None
    if isinstance(value, bool) or n is None or not 1 <= n <= most:
        shown = value if len(repr(value)) < 40 else f"{repr(value)[:37]}..."
        raise LabError(f"{what}={shown!r}: expected a whole number of threads from 1 to {most} "
                       f"({MAX_THREADS_PER_CPU} per logical CPU; {cpus_usable()} would use the CPUs this "
                       f"process may use), or leave it unset")
    return n


def default_threads() -> int:
    """Threads for CPU engines: the CPUs this process can use (physical cores, affinity and
    container quota: :func:`lablib.hardware.cpus_usable`). LABLIB_THREADS overrides.

    Raises LabError when LABLIB_THREADS is not a whole number from 1 to 4 per logical CPU.
    """
    from ..hardware import cpus_usable

    env = os.environ.get("LABLIB_THREADS", "").strip()
    return check_threads(env, "LABLIB_THREADS") if env else cpus_usable()


class Engine:
    """Base class. Subclasses set ``name`` and implement the ``_``-methods.

    Public verbs: :meth:`tokenize`, :meth:`apply_chat_template`,
    :meth:`generate`, :meth:`info`, :meth:`close`.
    """

    name = "engine"

    def __init__(self, model):
        self.model = model  # lablib.models.ResolvedModel

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

    def _generate(self, ids: list[int], cfg: GenerationConfig, trace: RequestTrace) -> None:
        """Run prefill and decode for ``ids``; call ``trace.start()`` when the
        engine begins work and ``trace.token(id)`` as each token id arrives.
        Must not reuse KV cache from an earlier request."""
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
            yield full[at:at + chunk]

    def close(self) -> None:
        """Free the model (memory) where the library allows it."""

    # --- shared --------------------------------------------------------
    n_ctx: int = 0  # context window, tokens; each engine sets it when it loads
    n_vocab: int = 0  # vocabulary size; each engine sets it when it loads

    def check_ids(self, ids) -> None:
        """Raise LabError naming the first token id outside [0, n_vocab)."""
        if self.n_vocab:
            bad = next((i for i in ids if not 0 <= i < self.n_vocab), None)
            if bad is not None:
                raise LabError(f"token id {bad} is outside {self.name}'s vocabulary of {self.n_vocab} "
                               f"(ids 0..{self.n_vocab - 1}); were the ids made by another model's tokenizer?")

    def check_context(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise ContextOverflowError unless prompt + output fits this engine's context."""
        need = prompt_tokens + max_new_tokens
        if need > self.n_ctx:
            raise ContextOverflowError(
                f"context overflow on {self.name}: prompt {prompt_tokens} + output "
                f"{max_new_tokens} = {need} tokens, but the context holds {self.n_ctx}. "
                f"Shorten the prompt, lower max_new_tokens, or load the engine with a "
                f"larger context (n_ctx=...; the model was trained to "
                f"{self.model.max_position_embeddings})."
            )

    def generate(self, ids: list[int], cfg: GenerationConfig | None = None,
                 t_submit: float | None = None) -> RequestTrace:
        """Generate from prompt token ids; returns the request's trace.

        ``t_submit`` is when the request entered the lab's queue (default: now).
        Raises ContextOverflowError before any work when it cannot fit.
        """
        cfg = cfg or GenerationConfig()
        ids = [int(i) for i in ids]
        if not ids:
            raise LabError("empty prompt: expected at least one token id")
        self.check_ids(ids)
        self.check_context(len(ids), cfg.max_new_tokens)
        if t_submit is None:
            t_submit = now()  # after validation: a single request has no queue
        trace = RequestTrace(prompt_tokens=len(ids), t_submit=t_submit)
        self._generate(ids, cfg, trace)
        return trace

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<{type(self).__name__} {self.model.name}>"
