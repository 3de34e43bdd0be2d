"""ONNX Runtime GenAI: an ONNX model built from the lab's Hugging Face folder, ONNX Runtime's CPU kernels.

The model is built once per Hugging Face folder and precision by onnxruntime-genai's own model
builder (``python -m onnxruntime_genai.models.builder -i HF_FOLDER -o OUT -p fp32|int4 -e cpu``),
in a child process (it imports torch, transformers, onnx and onnx-ir, and holds the weights
twice), and cached under ``$LABLIB_HOME/onnx/<precision>-<key>/``, where key hashes the folder
(``lablib.model.resolve._folder_sha256``), the precision and the builder's version
(:func:`onnx_folder`). For SmolLM2-135M on two busy cores a build took 8-14 s (fp32) and
9-10 s (int4: the builder's RTN quantizer, MatMulNBits with blocks of 32 weights). On Linux the
builder dies with the process that started it, even under ``kill -9`` (:mod:`lablib.children`: it went
0.00-0.02 s after its parent), so an interrupted load leaves no orphan writing into the cache.

What a step reads and computes with follows the build it loaded (``info().weights``, the precision;
``info().compute_dtype``): fp32, the float32 weights (538 MB for SmolLM2-135M, as transformers);
int4, every matrix in 4-bit blocks of 32 with a float32 scale, 5 bits a weight (84 MB), multiplied
in int8 (the builder's ``accuracy_level`` 4 on MatMulNBits: ONNX Runtime quantizes the activations
to int8 per block). :mod:`lablib.studies.roofline` counts both from the built model's initializers.

Generation is the library's own loop on ``og.Generator``: ``append_tokens(prompt ids)`` is the
prefill (one forward pass over the prompt: its logits, the KV cache), then each
``generate_next_token()`` samples from the logits at hand (the first call only samples; every
later one runs one decode forward pass first) and ``get_next_tokens()`` hands the id over, which
the lab stamps at once. The prompt goes in as the lab's token ids. A fresh generator per request:
no KV cache is reused.

ignore_eos: ORT GenAI marks a sequence done when it samples an EOS id and pads from then on.
The lab keeps the EOS (it is the model's choice) and appends it back as input
(``append_tokens([eos])``: a forward pass on it, as any sampled token gets), so generation
goes on exactly as vLLM's ``ignore_eos`` and the other engines do. Not ``min_length``: that
masks EOS, which changes the tokens chosen.

Threads: ONNX Runtime's intra-op thread pool is sized when the session is created (the genai
config's ``session_options.intra_op_num_threads``, set through ``og.Config.overlay``), so the
thread count is chosen once at load (``threads``, else LABLIB_THREADS, else the CPUs other
processes leave free at that moment) and stays for every request: it cannot follow a busy
neighbour per request as llama.cpp and PyTorch do. Its threads spin between operations; on a
busy 2-core machine 1 thread decoded faster than 2.

Batched mode: none. onnxruntime-genai 0.18's ``og.Engine`` batches requests on CPU, but as a
*static* batch (at most 4 by default): a request submitted while a batch runs waits until the
whole batch has finished (measured here), its continuous (dynamic) batching needs a paged KV
cache that the CPU model builder does not produce, and a sequence in a static batch cannot
continue past an EOS except by masking it. So the lab runs it in serial mode only.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lablib.children import tied
from lablib.config import lab_home
from lablib.engines.base import Engine, EngineInfo, GenerationConfig, token_ids
from lablib.engines.sampling import DEFINITION
from lablib.errors import LabError
from lablib.results.trace import RequestTrace
from lablib.staging import staged

if TYPE_CHECKING:
    import numpy as np

PRECISIONS = ("fp32", "int4")  # what the lab builds; the builder also has int8, fp16 and bf16 (not for CPU)
DTYPES = {"fp32": "float32", "int4": "int4 (MatMulNBits, RTN, block 32)"}  # the builder's CPU defaults
# MatMulNBits' accuracy_level: the type ONNX Runtime may convert the activations to before the product
# (0: left as they are, float32 here); the contrib op's documentation (onnxruntime ContribOperators.md)
ACCURACY_LEVELS = {0: "float32", 1: "float32", 2: "float16", 3: "bfloat16", 4: "int8"}
BUILD_LOG = "build.log"
BUILD_RECORD = "lab_build.json"


def builder_version() -> str:
    """The installed onnxruntime-genai version (the builder ships with it), read from the
    package's metadata without importing it; "" when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onnxruntime-genai")
    except PackageNotFoundError:
        return ""


BUILDER = "onnxruntime_genai.models.builder"


@functools.lru_cache(maxsize=1)
def builder_architectures() -> tuple:
    """The ``architectures`` names the installed model builder converts, read from its source text (its
    ``create_model`` compares ``config.architectures[0] == "..."``), without importing it (it imports torch and
    transformers); () when the builder is not installed."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec(BUILDER)
    except ImportError:
        return ()
    if spec is None or not spec.origin:
        return ()
    text = Path(spec.origin).read_text(encoding="utf-8", errors="replace")
    return tuple(sorted(set(re.findall(r'architectures\[0\] == "(\w+)"', text))))


# The builder runs tied to the lab process (:func:`lablib.children.tied`): a killed lab process
# (kill -9, an out-of-memory kill, a restarted kernel) takes the build with it instead of leaving
# an orphan that burns CPU and writes into <folder>.<pid>.tmp. The signal fires when the *thread* that
# forked exits; :func:`_build` forks from the thread that calls it and blocks there in
# ``subprocess.run`` until the child has exited (on an exception too: run kills the child first),
# so the forking thread outlives the child even when the load runs in a worker thread (the
# widgets' sweep thread).


def builder_command(hf_path, out, precision: str, cache_dir) -> list[str]:
    """The model builder's command line: ``python -m onnxruntime_genai.models.builder -i HF -o OUT
    -p PRECISION -e cpu -c CACHE`` (``-c``: where it puts temporary files; default ./cache_dir).
    The lab runs it tied to itself (:func:`lablib.children.tied`); this is the line a person would type."""
    return [
        sys.executable,
        "-m",
        BUILDER,
        "-i",
        str(hf_path),
        "-o",
        str(out),
        "-p",
        precision,
        "-e",
        "cpu",
        "-c",
        str(cache_dir),
    ]


def onnx_key(hf_path, precision: str) -> str:
    """16 hex digits naming a build: sha256 of the Hugging Face folder's hash (file names, sizes,
    JSON contents, as ``lablib.model.resolve`` keys a folder), the precision and the builder version."""
    from lablib.model.resolve import _folder_sha256

    h = hashlib.sha256(f"{_folder_sha256(Path(hf_path))}|{precision}|{builder_version()}".encode())
    return h.hexdigest()[:16]


def onnx_folder(model, precision: str = "fp32", log=print) -> Path:
    """The ONNX folder (model.onnx, its weights, genai_config.json, tokenizer) for ``model``'s
    Hugging Face folder at ``precision`` ("fp32" or "int4"), built on first use and cached under
    ``$LABLIB_HOME/onnx/<precision>-<key>/`` (:func:`onnx_key`).

    The builder runs in a child process under a lock (two processes never build the same folder),
    writing into ``<folder>.<pid>.tmp`` that is renamed into place when complete; its output goes to
    ``build.log`` in the folder, ``lab_build.json`` records the command, versions and seconds.
    Raises LabError for an unknown precision, or naming the command and the builder's last lines
    when it fails; FormatError when ``model`` has no Hugging Face folder.
    """
    from lablib.model.resolve import _locked

    if precision not in PRECISIONS:
        raise LabError(f"precision={precision!r}: expected one of {', '.join(PRECISIONS)}")
    hf = Path(model.path_for("hf", OnnxRuntimeGenAIEngine.name))
    out = lab_home() / "onnx" / f"{precision}-{onnx_key(hf, precision)}"
    if (out / BUILD_RECORD).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent / f".{out.name}.lock"):
        if (out / BUILD_RECORD).is_file():  # built by another process while this one waited
            return out
        _build(hf, out, precision, log)
    return out


def _build(hf: Path, out: Path, precision: str, log) -> None:
    with staged(out, make_folder=True) as tmp:  # an error or a Ctrl-C: no half-built model left
        cmd = builder_command(hf, tmp, precision, tmp / "cache_dir")
        log(
            f"building an ONNX model ({precision}) from {hf} with onnxruntime-genai's model builder (~10 s for 135M)..."
        )
        t0 = time.perf_counter()
        with open(tmp / BUILD_LOG, "w") as f:
            p = subprocess.run(tied(cmd), stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp)
        seconds = time.perf_counter() - t0
        if p.returncode != 0 or not (tmp / "genai_config.json").is_file():
            tail = [ln for ln in (tmp / BUILD_LOG).read_text(errors="replace").splitlines() if ln.strip()][-3:]
            hint = (
                " (install the builder's packages: pip install -e '.[onnxruntime-genai]')"
                if "No module" in str(tail)
                else ""
            )
            kept = shutil.copy(tmp / BUILD_LOG, out.with_name(f"{out.name}.{BUILD_LOG}"))  # the half build goes
            raise LabError(
                f"building the ONNX model failed (exit code {p.returncode}): {' '.join(cmd)}{hint}. "
                f"Last lines of its output ({kept}): " + " | ".join(ln.strip()[:300] for ln in tail)
            )
        shutil.rmtree(tmp / "cache_dir", ignore_errors=True)
        record = {
            "command": cmd,
            "precision": precision,
            "source": str(hf),
            "onnxruntime_genai": builder_version(),
            "seconds": round(seconds, 1),
        }
        (tmp / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    log(f"built {out} in {seconds:.1f} s")


class OnnxRuntimeGenAIEngine(Engine):
    """ONNX Runtime GenAI engine (CPU execution provider).

    ``precision``: "fp32" (default: the derived folder's float32 weights as they are) or "int4"
    (the builder's 4-bit weights). ``threads``: ONNX Runtime intra-op threads, fixed at load
    (default: the CPUs this process may use, less those other processes keep busy at load).
    ``n_ctx``: context the lab enforces (default and most: the genai config's ``context_length``,
    the trained context; a larger one is capped to it).
    """

    name = "onnxruntime-genai"
    format = "hf"  # the builder reads the Hugging Face folder; the ONNX folder is derived and cached
    requires = "onnxruntime_genai"
    install_hint = "pip install -e '.[onnxruntime-genai]' (onnxruntime-genai, onnxruntime, onnx, onnx-ir)"
    kv_bytes_per_value = 4  # the CPU builder's KV cache is float32, for fp32 and int4 weights alike
    reserves_kv_at_load = False  # each generator allocates its KV buffer for prompt + output (max_length)
    lab_default = False
    modes = ("serial",)  # no continuous batching on CPU (module docstring)
    weights_option = "precision"
    weights_choices = PRECISIONS

    # the genai config's own search defaults (genai_config.json "search"), which the lab sets explicitly
    SETTINGS_OFF = (
        "genai_config.json search defaults (top_k=50, repetition_penalty, min_length, no_repeat_ngram_size, "
        "num_beams): every search option is set per request from the lab's GenerationConfig",
        "EOS ends a sequence (ORT GenAI pads after it): with ignore_eos the EOS is kept and appended back as input",
    )

    @classmethod
    def unsupported(cls, model) -> str | None:
        """The model builder converts the ``architectures`` its ``create_model`` names (read from its source,
        :func:`builder_architectures`), and reads one RoPE entry (``config.rope_parameters["rope_type"]``): a
        config with one per layer type (Gemma 3 under transformers 5) makes it fail with KeyError 'rope_type'."""
        why = super().unsupported(model)
        if why or not getattr(model, "hf_path", None):
            return why
        from lablib.model.formats import read_config

        cfg = read_config(model.hf_path)
        arch = (cfg.get("architectures") or [""])[0]
        known = builder_architectures()
        if known and arch not in known:
            return (
                f"onnxruntime-genai's model builder converts {len(known)} architectures and not {arch or 'this one'} "
                f"({model.name}); run it with transformers, llama.cpp or mlx"
            )
        rp = cfg.get("rope_parameters")
        if isinstance(rp, dict) and any(isinstance(v, dict) for v in rp.values()):
            return (
                f"onnxruntime-genai's model builder reads one RoPE entry, and {model.name}'s config keeps one per layer "
                f"type ({', '.join(k for k, v in rp.items() if isinstance(v, dict))}, as transformers 5 writes "
                f"{cfg.get('model_type')}): it stops with KeyError 'rope_type'; run it with transformers, llama.cpp or mlx"
            )
        return None

    @classmethod
    def default_load_kwargs(cls, model, concurrency: int = 1) -> dict:
        """``precision`` fp32: the same float32 weights transformers reads."""
        return {"precision": "fp32"}

    @classmethod
    def weights_path(cls, model, weights: str | None = None, log=lambda *_: None) -> str:
        """The ONNX folder it reads for ``weights`` (a precision: "fp32", the default, or "int4"),
        built on first use (:func:`onnx_folder`, saying so to ``log``)."""
        return str(onnx_folder(model, cls.check_weights(weights), log=log))

    @classmethod
    def weights_bytes(cls, model) -> int:
        """Bytes of the float32 weights it loads by default: the Hugging Face folder's weights the
        builder converts (counted without building the ONNX model; parameters x 4 without a folder)."""
        folder = getattr(model, "hf_path", None)
        files = sorted(Path(folder).glob("*.safetensors")) if folder else []
        return sum(f.stat().st_size for f in files) if files else model.parameters * 4

    @classmethod
    def compute_dtype(cls, model, weights: str | None = None) -> str:
        """The type its matrix products run at, read from the built graph (:meth:`weights_path`):
        float32 for the fp32 build's MatMul nodes; for the int4 build, what its MatMulNBits nodes'
        ``accuracy_level`` lets ONNX Runtime quantize the activations to (:data:`ACCURACY_LEVELS`:
        the CPU builder sets 4, int8: blocks of activations quantized to int8 and multiplied with
        the 4-bit weights in int8 dot products, MLAS's CompInt8 kernels)."""
        folder = Path(cls.weights_path(model, weights))
        levels = _graph_facts(folder / "model.onnx").get("accuracy_levels") or [0]
        return ACCURACY_LEVELS.get(max(levels), "float32")

    @classmethod
    def runtime_bytes(cls, model, n_batch: int = 512, context_tokens: int = 0) -> int:
        """The prefill's logits, bytes: the builder's model returns logits for every prompt position
        ([1, prompt tokens, vocabulary] float32), 1.6 GB for an 8192-token SmolLM2 prompt. Allocated
        per request, so 0 at load (``context_tokens`` 0)."""
        from lablib.model.shape import model_shape

        return context_tokens * (model_shape(model)["vocab"] or 0) * 4

    def __init__(self, model, precision: str = "fp32", threads: int | None = None, n_ctx: int | None = None):
        super().__init__(model)
        np, og = self._import_library("numpy", "onnxruntime_genai")
        self._og, self._np = og, np
        og.disable_telemetry_events()  # the library would otherwise queue usage events for Microsoft
        self.precision = precision
        self.folder = onnx_folder(model, precision)
        self.genai_config = json.loads((self.folder / "genai_config.json").read_text())
        self.threads = self._init_threads(threads)
        # ONNX Runtime sizes its thread pool when the session is created: fixed from here on
        self.auto_threads_at_load, self.auto_threads, self._busy = self.auto_threads, False, None
        cfg = og.Config(str(self.folder))
        cfg.clear_providers()  # the CPU execution provider
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": self.threads}}}}))
        try:
            self.og_model = og.Model(cfg)
        except Exception as e:
            raise LabError(f"onnxruntime-genai cannot load {self.folder} ({type(e).__name__}: {e})") from e
        self.tok = og.Tokenizer(self.og_model)
        self.tok.update_options(skip_special_tokens="false")  # render special tokens, as the other engines do
        m = self.genai_config["model"]
        self.n_vocab = int(m["vocab_size"])
        # the model holds context_length tokens (its RoPE cache): ORT GenAI refuses a longer generator
        # mid-request, so a larger n_ctx is capped there and a longer request is a ContextOverflowError
        held = int(m.get("context_length") or model.max_position_embeddings)
        self.n_ctx = min(int(n_ctx or held), held)
        eos = m.get("eos_token_id")
        self._eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        self._bos = m.get("bos_token_id")

    # --- tokenizer (ORT GenAI's own, built from the folder's tokenizer.json) ------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        """ORT GenAI's tokenizer; it adds no BOS of its own (SmolLM2's tokenizer has none to add),
        so ``add_special`` prepends the genai config's BOS."""
        ids = [int(i) for i in self.tok.encode(text)]
        if add_special and self._bos is not None and ids[:1] != [self._bos]:
            ids = [self._bos, *ids]
        return ids

    def detokenize(self, ids) -> str:
        ids = token_ids(ids)
        self.check_ids(ids)  # the same LabError in every engine (llama.cpp's aborted the process)
        return self.tok.decode(self._np.asarray(ids, dtype=self._np.int32))

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        """ORT GenAI's own path: ``Tokenizer.apply_chat_template`` (the folder's template) to text,
        then ``encode``."""
        text = self.tok.apply_chat_template(json.dumps(messages), add_generation_prompt=add_generation_prompt)
        return self.tokenize(text)

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_ids(self) -> set[int]:
        return self._eos

    # --- description -------------------------------------------------------------------------
    def info(self) -> EngineInfo:
        from importlib.metadata import version

        return EngineInfo(
            name=self.name,
            version=self.library_version,
            backend=f"onnxruntime {version('onnxruntime')} cpu",
            dtype=DTYPES[self.precision],
            threads=self.threads,
            n_ctx=self.n_ctx,
            weights=self.precision,
            compute_dtype=self.compute_dtype(self.model, self.precision),
            flags={
                "precision": self.precision,
                "onnx_folder": str(self.folder),
                "onnx_build": json.loads((self.folder / BUILD_RECORD).read_text()),
                "intra_op_num_threads": self.threads,
                "threads_auto": self.auto_threads_at_load,
                "threads_fixed_at_load": True,
                "max_threads": self.max_threads,
                "sampling": DEFINITION,
                "settings_off": list(self.SETTINGS_OFF),
            },
        )

    def effective_config(self) -> dict:
        """The settings the ONNX model computes with: shapes and token ids from genai_config.json
        (what ORT GenAI reads), the RMSNorm epsilon from the graph's normalization nodes, the RoPE
        base from the graph's ``cos_cache`` (cos(p * inv_freq), so inv_freq[1] = arccos of row 1),
        and the rest (``rope_scaling``, the sliding window, the soft-caps) from the folder the builder read
        (:func:`lablib.model.formats.config_settings`: the cache holds the scaling baked in)."""
        import math

        from lablib.engines.hf import rope_base_from_inv_freq
        from lablib.model.formats import config_settings, read_config

        m, d = self.genai_config["model"], self.genai_config["model"]["decoder"]
        hf = read_config(Path(self.model.path_for("hf", self.name)))
        out = config_settings(hf)
        graph = _graph_facts(self.folder / d["filename"])
        if graph.get("cos_row1") is not None:
            base = rope_base_from_inv_freq([0.0, math.acos(graph["cos_row1"])], d["head_size"])
            out["rope_theta"] = float(f"{base:.6g}")
        eos = m.get("eos_token_id")
        out.update(
            rms_norm_eps=graph.get("epsilon", out["rms_norm_eps"]),
            n_heads=d["num_attention_heads"],
            n_kv_heads=d["num_key_value_heads"],
            head_dim=d["head_size"],
            n_layers=d["num_hidden_layers"],
            vocab_size=m["vocab_size"],
            context_length=m.get("context_length"),
            bos_id=m.get("bos_token_id"),
            eos_id=eos[0] if isinstance(eos, list) else eos,
        )
        return out

    # --- generation ----------------------------------------------------------------------------
    def _params(self, cfg: GenerationConfig, max_length: int):
        """og.GeneratorParams for one request of ``max_length`` tokens (prompt + output), every
        search option set from ``cfg`` (:data:`lablib.engines.sampling.DEFINITION`): greedy, or ORT
        GenAI's CPU sampler (top-k, then / temperature, then top-p on the softmax, then a draw:
        ``GreedySearch_Cpu::SampleTopKTopP``), with top-k 0 (off) as the whole vocabulary."""
        p = self._og.GeneratorParams(self.og_model)
        opts = {
            "max_length": max_length,
            "min_length": 0,
            "num_beams": 1,
            "repetition_penalty": 1.0,
            "no_repeat_ngram_size": 0,
            "do_sample": not cfg.greedy,
        }
        if not cfg.greedy:
            top_k = cfg.top_k if 0 < cfg.top_k < self.n_vocab else self.n_vocab
            opts.update(temperature=cfg.temperature, top_k=top_k, top_p=cfg.top_p, random_seed=cfg.seed)
        p.set_search_options(**opts)
        return p

    def _generate(self, ids, cfg: GenerationConfig, trace: RequestTrace) -> None:
        np = self._np
        prompt = np.asarray(ids, dtype=np.int32)
        gen = self._og.Generator(self.og_model, self._params(cfg, len(ids) + cfg.max_new_tokens))
        eos, n = self._eos, cfg.max_new_tokens
        trace.start()
        gen.append_tokens(prompt)  # prefill
        trace.finish_reason = "length"
        while True:
            gen.generate_next_token()
            tok = int(gen.get_next_tokens()[0])
            trace.token(tok)
            if tok in eos:
                if not cfg.ignore_eos:
                    trace.finish_reason = "stop"
                    break
                if trace.output_tokens < n:  # ORT GenAI stopped the sequence: the EOS goes back in
                    gen.append_tokens(np.asarray([tok], dtype=np.int32))
            if trace.output_tokens >= n:
                break

    def logits(self, ids) -> np.ndarray:
        """Teacher-forced logits for ``ids``: float32 numpy array [len(ids), vocab]."""
        return self._np.concatenate(list(self.iter_logits(ids, len(ids) or 1)))

    def iter_logits(self, ids, chunk: int = 64):
        """Teacher-forced logits, ``chunk`` positions per ``append_tokens`` on one generator (one KV
        cache): yields float32 numpy arrays [<= chunk, vocab] (the model's ``logits`` output, every
        position of the chunk; see :meth:`Engine.iter_logits`)."""
        np = self._np
        ids = token_ids(ids)
        self.check_ids(ids)
        self.check_context(len(ids), 0)
        gen = self._og.Generator(self.og_model, self._params(GenerationConfig(max_new_tokens=1), len(ids) + 1))
        for at in range(0, len(ids), chunk):
            gen.append_tokens(np.asarray(ids[at : at + chunk], dtype=np.int32))
            yield np.array(gen.get_output("logits")[0], dtype=np.float32)

    def close(self) -> None:
        self.og_model = self.tok = None


def _graph_facts(path: Path) -> dict:
    """From an ONNX graph (its external weights left unread): ``epsilon`` of its first
    (Skip)SimplifiedLayerNormalization node, ``cos_row1``, ``cos_cache[1, 1]`` read from the
    external data file at its offset, and ``accuracy_levels``, the sorted distinct ``accuracy_level``
    of its MatMulNBits nodes ([] without any). {} without the onnx package."""
    try:
        import onnx
    except ImportError:
        return {}
    import numpy as np

    g = onnx.load(str(path), load_external_data=False).graph
    out: dict = {}
    for node in g.node:
        if node.op_type.endswith("SimplifiedLayerNormalization"):
            out["epsilon"] = next((float(a.f) for a in node.attribute if a.name == "epsilon"), None)
            break
    out["accuracy_levels"] = sorted(
        {
            next((int(a.i) for a in node.attribute if a.name == "accuracy_level"), 0)
            for node in g.node
            if node.op_type == "MatMulNBits"
        }
    )
    for t in g.initializer:
        if t.name == "cos_cache" and t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2:
            ext = {e.key: e.value for e in t.external_data}
            if "location" in ext:
                with open(path.parent / ext["location"], "rb") as f:
                    f.seek(int(ext.get("offset", 0)) + 4 * (int(t.dims[1]) + 1))
                    out["cos_row1"] = float(np.frombuffer(f.read(4), dtype=np.float32)[0])
            elif t.raw_data:
                out["cos_row1"] = float(np.frombuffer(t.raw_data, dtype=np.float32)[int(t.dims[1]) + 1])
    return out
