"""Model formats and the facts a model's files state: one reader per kind of file.

- :func:`detect_format`: GGUF file, Hugging Face folder or MLX folder
- :func:`read_config`, :func:`trained_context`: a folder's config.json (the model's shape from it:
  :mod:`lablib.model.shape`)
- :func:`normalize_config`: a config every engine reads the same way
- :data:`SETTINGS_KEYS`: the settings a model states, keyed once for a config.json (:func:`config_settings`),
  a GGUF header (:func:`gguf_config`) and each loaded engine (``Engine.effective_config``); the attention kind
  of each layer (:func:`config_layer_types`, :func:`gguf_layer_types`: full, or sliding over a window)
- :func:`gguf_facts`, :func:`gguf_config` and :func:`gguf_tensors`: what a GGUF file states (one
  GGUF reader, :func:`open_gguf`, read once per version of a file into :func:`gguf_header`;
  :func:`file_type_name` names its file type)
- :func:`restore_pre_tokenizer`: the GGUF's split rule for a tokenizer built from it
- :func:`weight_tensors`: every weight tensor a file or folder stores, with its type and bytes (GGUF
  tensors, safetensors headers, ONNX initializers)
- :func:`folder_with_config`: a model folder with another config, for experiments
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

from lablib.checks import keywords_checked
from lablib.errors import FormatError, LabError, first_line
from lablib.staging import staged

FORMATS = ("gguf", "hf", "mlx")
CONVERT_HINT = {
    (
        "hf",
        "gguf",
    ): "convert it with llama.cpp's convert_hf_to_gguf.py (python convert_hf_to_gguf.py FOLDER --outtype f16)",
    (
        "mlx",
        "gguf",
    ): "convert the Hugging Face original with llama.cpp's convert_hf_to_gguf.py; MLX folders do not convert to GGUF directly",
    ("gguf", "hf"): "run `lablib prepare FILE.gguf`, which dequantizes it into a Hugging Face folder",
    (
        "mlx",
        "hf",
    ): "start from the Hugging Face original, or dequantize with `mlx_lm.convert --dequantize` and load that folder",
    ("gguf", "mlx"): "run `lablib prepare FILE.gguf`, which derives an MLX folder",
    ("hf", "mlx"): "run `lablib prepare FOLDER` (uses mlx_lm.convert, which needs safetensors weights, "
    "not PyTorch .bin files)",
}


# --- format detection -------------------------------------------------------
def detect_format(path: str | Path) -> str:
    """'gguf', 'hf' or 'mlx' for a local file or folder; FormatError otherwise.

    GGUF: a file starting with the magic ``GGUF``. MLX: a folder whose
    safetensors say ``{"format": "mlx"}`` in their metadata, or whose config
    has an MLX ``quantization`` block. HF: a folder with config.json and
    safetensors or PyTorch weights.
    """
    p = Path(path)
    if p.is_file():
        with open(p, "rb") as f:
            if f.read(4) == b"GGUF":
                return "gguf"
        raise FormatError(
            f"{p} is a file but not GGUF (no GGUF magic); expected a .gguf file "
            "or a model folder (Hugging Face or MLX)."
        )
    if not p.is_dir():
        raise FormatError(f"{p} does not exist")
    ggufs = gguf_files(p)
    config = p / "config.json"
    weights = sorted(p.glob("*.safetensors"))
    if config.is_file() and weights:
        from safetensors import safe_open

        try:
            with safe_open(str(weights[0]), "np") as f:
                meta = f.metadata() or {}
        except Exception as e:  # safetensors raises its own SafetensorError on a bad header
            raise FormatError(
                f"{weights[0]} is not a readable safetensors file ({first_line(e)}); "
                "expected complete weights: copy or download the folder again."
            ) from None
        cfg = read_config(p)
        if meta.get("format") == "mlx" or "quantization" in cfg:
            return "mlx"
        return "hf"
    if config.is_file() and (list(p.glob("pytorch_model*.bin"))):
        return "hf"
    if ggufs:
        return "gguf"
    raise FormatError(
        f"{p}: no GGUF file, and no config.json with safetensors weights; expected "
        "a GGUF file, a Hugging Face folder or an MLX folder."
    )


def gguf_files(folder: Path) -> list[Path]:
    """Files in ``folder`` named *.gguf that start with the GGUF magic, sorted."""
    found = []
    for g in sorted(folder.glob("*.gguf")):
        try:
            with open(g, "rb") as f:
                if f.read(4) == b"GGUF":
                    found.append(g)
        except OSError:
            continue
    return found


def read_config(folder: Path) -> dict:
    """A model folder's config.json as a dict; FormatError naming the file otherwise."""
    path = Path(folder) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise FormatError(
            f"{path} is not readable JSON ({first_line(e)}); expected the model's config: "
            "copy or download the folder again."
        ) from None
    if not isinstance(cfg, dict):
        raise FormatError(f"{path} holds a {type(cfg).__name__}, expected a JSON object (the model's config)")
    return cfg


CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def trained_context(cfg: dict, where="config.json") -> int:
    """The trained context length a config names (Llama-style ``max_position_embeddings``,
    GPT-2-style ``n_positions``...; in ``text_config`` for multimodal models), tokens; 0 when it
    names none. Raises FormatError for a value that is not a whole number (``"8k"``)."""
    cfg = cfg.get("text_config") or cfg
    for key in CONTEXT_KEYS:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise FormatError(
                f"{where}: {key}={value!r}, expected a whole number of tokens (e.g. 8192): fix the config"
            )
        if value:
            return value
    return 0


# --- config compatibility -------------------------------------------------------
def normalize_config(cfg: dict) -> dict:
    """A config every engine reads the same way (returns the keys to add).

    transformers 5 moved ``rope_theta`` and ``rope_scaling`` into
    ``rope_parameters``; mlx-lm 0.32 still reads them at the top level and
    silently falls back to its defaults (RoPE base 10000). This lifts them back
    up, and names ``torch_dtype`` for readers that predate ``dtype``. Keys
    already at the top level win. Source: data/cases/rope_theta_v5.

    A model whose layers differ (Gemma 3) keeps one entry per layer type in ``rope_parameters``; the full
    layers' base and scaling are lifted as above, the sliding layers' base as ``rope_local_base_freq``, and a
    ``layer_types`` list that repeats a period (five sliding, one full) as ``sliding_window_pattern``: what
    mlx-lm's Gemma 3 reads (its defaults, 1e6, 1e4 and 6, would otherwise apply whatever the model says).
    """
    add: dict = {}
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        per_type = {k: v for k, v in rp.items() if isinstance(v, dict)}
        full = per_type.get("full_attention") or (rp if not per_type else {})
        if "rope_theta" in full and "rope_theta" not in cfg:
            add["rope_theta"] = full["rope_theta"]
        rtype = full.get("rope_type", "default")
        if rtype != "default" and not cfg.get("rope_scaling"):
            add["rope_scaling"] = {k: v for k, v in full.items() if k != "rope_theta"}
        if "partial_rotary_factor" in full and "partial_rotary_factor" not in cfg:
            add["partial_rotary_factor"] = full["partial_rotary_factor"]
        sliding = per_type.get("sliding_attention")
        if sliding and "rope_theta" in sliding and "rope_local_base_freq" not in cfg:
            add["rope_local_base_freq"] = sliding["rope_theta"]
    period = _layer_period(cfg.get("layer_types"))
    if period and "sliding_window_pattern" not in cfg:
        add["sliding_window_pattern"] = period
    if "dtype" in cfg and "torch_dtype" not in cfg:
        add["torch_dtype"] = cfg["dtype"]
    return add


def _layer_period(types) -> int | None:
    """n when ``types`` (transformers' layer_types) is n - 1 sliding layers then a full one, repeated (Gemma 3:
    6); None when it is not such a pattern (or all one kind)."""
    if not isinstance(types, list) or "full_attention" not in types or "sliding_attention" not in types:
        return None
    n = types.index("full_attention") + 1
    expect = ["full_attention" if (i + 1) % n == 0 else "sliding_attention" for i in range(len(types))]
    return n if types == expect else None


def write_normalized_config(folder: Path) -> dict:
    """Rewrite ``folder/config.json`` with :func:`normalize_config`'s keys; returns them."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    add = normalize_config(cfg)
    if add:
        cfg.update(add)
        path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return add


# --- the settings a model states ------------------------------------------------------------
# What lablib.studies.compare holds side by side: each key as a config.json states it (config_settings), as a
# GGUF header states it for llama.cpp (gguf_config) and as each loaded engine computes with it
# (Engine.effective_config). rope_theta is the RoPE base of the full-attention layers; rope_theta_sliding that of
# the sliding-window layers (None: the model has none); sliding_window the window, tokens (0: none);
# sliding_layers how many layers attend over it; the two soft-caps None when the model applies none.
SETTINGS_KEYS = (
    "rope_theta",
    "rope_theta_sliding",
    "rope_scaling",
    "rms_norm_eps",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "n_layers",
    "sliding_window",
    "sliding_layers",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "vocab_size",
    "context_length",
    "tie_word_embeddings",
    "bos_id",
    "eos_id",
)
ATTENTION_KINDS = {"full_attention": "full", "sliding_attention": "sliding"}  # transformers' layer_types names


def text_config(cfg: dict) -> dict:
    """The language model's part of a config (``text_config`` of a multimodal one, else the config)."""
    return cfg.get("text_config") or cfg


def _int(cfg: dict, *keys):
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def config_layer_types(cfg: dict) -> tuple[str, ...]:
    """Each layer's attention as a config states it for transformers: "full", or "sliding" (attending its
    ``sliding_window`` last positions); another kind keeps transformers' name ("chunked_attention"...).

    From ``layer_types`` (transformers 5 writes it for every model whose layers differ: Gemma 2 and 3, Qwen 2
    with ``use_sliding_window``, GPT-OSS, Cohere 2...); a config that names a window but not the layers
    (older Gemma configs: ``sliding_window_pattern``) is read by transformers' own config class, which computes
    them; one whose class has none (Mistral, Phi-3) applies the window to every layer. A window of at least
    the trained context, or ``use_sliding_window: false``, is no window."""
    cfg = text_config(cfg)
    n = _int(cfg, "num_hidden_layers", "n_layer", "num_layers") or 0
    types = cfg.get("layer_types")
    window = _int(cfg, "sliding_window") or 0
    if not (isinstance(types, list) and len(types) == n):
        if not window or cfg.get("use_sliding_window") is False or not n:
            types = ["full_attention"] * n
        else:
            types = _transformers_layer_types(cfg) or ["sliding_attention"] * n
    context = _int(cfg, *CONTEXT_KEYS) or 0
    no_window = not window or (context and window >= context)
    return tuple("full" if no_window and t == "sliding_attention" else ATTENTION_KINDS.get(t, t) for t in types)


def _transformers_layer_types(cfg: dict) -> list | None:
    """``layer_types`` as transformers' config class for ``cfg["model_type"]`` computes them (None when that
    class has none, or transformers does not know the type)."""
    try:
        from transformers import AutoConfig

        keys = {k: v for k, v in cfg.items() if k not in ("model_type", "transformers_version", "architectures")}
        types = getattr(AutoConfig.for_model(cfg.get("model_type", ""), **keys), "layer_types", None)
    except Exception:  # an unknown model_type (ValueError), a config its class refuses
        return None
    return list(types) if types else None


def rope_scaling_summary(scaling) -> dict | None:
    """A RoPE scaling as every reader states it, to compare: None for none (or "default"), else {"type",
    "factor"} (a config's ``rope_type``, a GGUF's ``type``; the factor a float), and the other numbers it names."""
    if not isinstance(scaling, dict):
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default", "none"):
        return None
    out = {"type": kind}
    for k, v in scaling.items():
        if k not in ("rope_type", "type", "rope_theta") and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    return out


def config_rope(cfg: dict, types: tuple | None = None) -> tuple:
    """(RoPE base of the full-attention layers, of the sliding ones or None, scaling or None) as a config
    states them: transformers 5's ``rope_parameters`` (one dict, or one per layer type), or the top-level
    ``rope_theta`` / ``rope_scaling`` / ``rope_local_base_freq`` of transformers 4's configs. ``types``: the
    config's :func:`config_layer_types`, when the caller has them."""
    types = config_layer_types(cfg) if types is None else types
    cfg = text_config(cfg)
    rp = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    per_type = {k: v for k, v in rp.items() if isinstance(v, dict)}
    full = per_type.get("full_attention") or (rp if not per_type else {})
    sliding = per_type.get("sliding_attention")
    theta = full.get("rope_theta", cfg.get("rope_theta"))
    scaling = (
        None if full.get("rope_type", "default") == "default" else {k: v for k, v in full.items() if k != "rope_theta"}
    )
    scaling = scaling or cfg.get("rope_scaling") or None
    if "sliding" not in config_layer_types(cfg):
        return theta, None, scaling
    theta_sliding = sliding.get("rope_theta") if sliding else cfg.get("rope_local_base_freq", theta)
    return theta, theta_sliding, scaling


def config_settings(cfg: dict) -> dict:
    """The settings a config.json states (what transformers reads), keyed as :data:`SETTINGS_KEYS`."""
    c = text_config(cfg)
    heads = _int(c, "num_attention_heads", "n_head", "num_heads")
    hidden = _int(c, "hidden_size", "n_embd", "d_model")
    types = config_layer_types(cfg)
    theta, theta_sliding, scaling = config_rope(cfg, types)
    eos = c.get("eos_token_id", cfg.get("eos_token_id"))
    return {
        "rope_theta": theta,
        "rope_theta_sliding": theta_sliding,
        "rope_scaling": scaling,
        "rms_norm_eps": c.get("rms_norm_eps", c.get("layer_norm_epsilon")),
        "n_heads": heads,
        "n_kv_heads": _int(c, "num_key_value_heads") or heads,
        "head_dim": _int(c, "head_dim") or (hidden // heads if hidden and heads else None),
        "n_layers": len(types) or None,
        "sliding_window": (_int(c, "sliding_window") or 0) if "sliding" in types else 0,
        "sliding_layers": types.count("sliding"),
        "attn_logit_softcapping": c.get("attn_logit_softcapping") or None,
        "final_logit_softcapping": c.get("final_logit_softcapping") or None,
        "vocab_size": _int(c, "vocab_size"),
        "context_length": trained_context(cfg) or None,
        "tie_word_embeddings": bool(c.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        "bos_id": c.get("bos_token_id", cfg.get("bos_token_id")),
        "eos_id": eos[0] if isinstance(eos, list) else eos,
    }


# --- tokenizer fidelity -----------------------------------------------------------
# GGUF pre-tokenizer types (``tokenizer.ggml.pre``) whose split rule llama.cpp
# implements as "each digit alone, then the GPT-2 regex" (llama-vocab.cpp:
# STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA), i.e. the
# original tokenizer.json's Sequence[Digits(individual_digits), ByteLevel].
# transformers 5's GGUF loader has no entry for them and falls back to a plain
# ByteLevel split, which tokenizes "c\n\n1" as "\n", "\n" instead of "\n\n"
# (data/cases/tokenizer_probe.txt).
DIGIT_SPLIT_PRE_TYPES = {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva"}


def restore_pre_tokenizer(tokenizer, pre_type: str) -> bool:
    """Give an HF tokenizer built from a GGUF the split rule its GGUF names.

    Returns True when it changed something. Only types transformers misses are
    touched; others keep what transformers built.
    """
    from tokenizers import pre_tokenizers

    if pre_type not in DIGIT_SPLIT_PRE_TYPES:
        return False
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    return True


# --- GGUF facts -----------------------------------------------------------------
def open_gguf(path):
    """(reader, val) for a GGUF file: ``val(key, default)`` gives a metadata field's value.

    The package's one GGUF reader (the ``gguf`` library). Raises FormatError for a path that cannot
    be opened, a file that is not GGUF, and one that starts like GGUF but cannot be read (torn,
    truncated).
    """
    import gguf

    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise _cannot_open(path, e) from None
    if magic != b"GGUF":
        raise FormatError(f"{path} is not a GGUF file (no GGUF magic); expected a .gguf model file")
    try:
        r = gguf.GGUFReader(str(path))
    except Exception as e:  # gguf raises ValueError, struct or numpy errors on a torn file
        raise FormatError(
            f"{path} starts like GGUF but cannot be read ({type(e).__name__}: {first_line(e)}); "
            f"it is {path.stat().st_size:,} bytes, perhaps truncated or corrupt: remove it, then download, "
            "copy or make it again."
        ) from None

    def val(key, default=None):
        f = r.fields.get(key)
        return f.contents() if f is not None else default

    return r, val


def file_type_name(file_type) -> str:
    """A GGUF's ``general.file_type`` (a llama_ftype number) by name, as llama.cpp prints it: gguf's
    LlamaFileType without ``MOSTLY_`` (7 -> 'Q8_0', 0 -> 'ALL_F32'); "" for None, the number as text
    for one this gguf version does not know."""
    import gguf

    if file_type is None:
        return ""
    try:
        return gguf.LlamaFileType(file_type).name.replace("MOSTLY_", "")
    except ValueError:
        return str(file_type)


def _version(path) -> tuple[str, int, int]:
    """(real path, size, mtime): one version of a file, the key of the cached readers below."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise _cannot_open(path, e) from None
    return os.path.realpath(path), st.st_size, st.st_mtime_ns


def _cannot_open(path, e: OSError) -> FormatError:
    return FormatError(f"{path}: cannot open it ({e.strerror or first_line(e)}); expected a GGUF file")


# A GGUF's header as the facts below read it: every metadata field small enough to keep (arrays of
# more than this many items, the vocabulary and merges, are kept as their length) and every tensor's
# (name, type, elements, bytes). gguf's reader parses every vocabulary string (seconds for a
# 49,152-token vocabulary), so the header is read once per version of a file: in this process
# (lru_cache) and across processes (a JSON file under lab_home()/cache/gguf, keyed by the file's
# real path, size and mtime; the engines' child processes each ask).
HEADER_ARRAY_ITEMS = 256
HEADER_CACHE_VERSION = 1


def gguf_header(path) -> dict:
    """{"fields": {key: value, or {"length": n} for a long array}, "tensors": [(name, ggml type
    name, elements, bytes), ...]} of a GGUF file, read once per version of the file (see above).
    Raises FormatError as :func:`open_gguf` does."""
    return _gguf_header(*_version(path))


def _header_cache_file(path: str, size: int, mtime_ns: int) -> Path:
    import hashlib

    from lablib.config import lab_home

    key = hashlib.sha256(f"{HEADER_CACHE_VERSION}|{path}|{size}|{mtime_ns}".encode()).hexdigest()[:24]
    return lab_home() / "cache" / "gguf" / f"{key}.json"


@functools.lru_cache(maxsize=16)
def _gguf_header(path: str, size: int, mtime_ns: int) -> dict:
    cache = _header_cache_file(path, size, mtime_ns)
    try:
        kept = json.loads(cache.read_text())
        if kept.get("path") == path and kept.get("size") == size and kept.get("mtime_ns") == mtime_ns:
            return {"fields": kept["fields"], "tensors": [tuple(t) for t in kept["tensors"]]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # none yet, or unreadable: read the file
    import gguf

    r, _ = open_gguf(path)
    fields = {}
    for name, f in r.fields.items():
        if f.types and f.types[0] == gguf.GGUFValueType.ARRAY and len(f.data) > HEADER_ARRAY_ITEMS:
            fields[name] = {"length": len(f.data)}
        else:
            value = f.contents()
            fields[name] = value.tolist() if hasattr(value, "tolist") else value
    tensors = [(t.name, t.tensor_type.name, int(t.n_elements), int(t.n_bytes)) for t in r.tensors]
    try:
        text = json.dumps({"path": path, "size": size, "mtime_ns": mtime_ns, "fields": fields, "tensors": tensors})
        cache.parent.mkdir(parents=True, exist_ok=True)
        with staged(cache) as tmp:
            tmp.write_text(text)
    except (OSError, TypeError, ValueError):
        pass  # a read-only lab home, or a value JSON cannot hold: read again next time
    return {"fields": fields, "tensors": tensors}


def _header_val(path):
    """(header, val) for a GGUF file: ``val(key, default)`` gives a metadata field's value from its
    :func:`gguf_header`."""
    header = gguf_header(path)
    fields = header["fields"]
    return header, lambda key, default=None: fields.get(key, default)


def gguf_facts(path: Path) -> dict:
    """Architecture, parameter count, quantization and context length of a GGUF file."""
    header, val = _header_val(path)
    arch = val("general.architecture", "")
    return {
        "architecture": arch,
        "name": val("general.name", Path(path).stem),
        "parameters": int(sum(t[2] for t in header["tensors"])),
        "quantization": file_type_name(val("general.file_type")),
        "max_position_embeddings": int(val(f"{arch}.context_length", 0) or 0),
        "pre_tokenizer": val("tokenizer.ggml.pre", ""),
    }


# llama.cpp's sliding-window layers, by GGUF architecture, when the header states a window but no
# ``<arch>.attention.sliding_window_pattern``: (n, dense_first) of ``load_swa_pattern(ml, n, dense_first)`` in its
# src/models/<arch>.cpp (llama-cpp-python 0.3.36's llama.cpp). Layer il slides when il % n < n - 1 (dense_first:
# when il % n != 0); n = 0 slides every layer. An architecture not here ignores a stated window (llama.cpp's Phi-3
# warns "Phi SWA is currently disabled"; Llama/Mistral and Qwen 2 read none).
LLAMA_SWA_PATTERNS = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "gemma-embedding": (6, False),
    "cohere2": (4, False),
    "exaone4": (4, False),
    "olmo2": (4, False),
    "gpt-oss": (2, False),
    "llama4": (4, False),
    "smallthinker": (4, True),
    "afmoe": (4, False),
    "plamo3": (8, False),
}
# architectures whose sliding layers take their RoPE base from ``<arch>.rope.freq_base_swa``, else llama.cpp's
# default of 10000 (llama_hparams.rope_freq_base_train_swa); the others default to the full layers' base
LLAMA_SWA_BASE_10000 = {"gemma3", "gemma3n", "gemma-embedding"}


def gguf_layer_types(path) -> tuple[str, ...]:
    """Each layer's attention as llama.cpp builds it from a GGUF header: "sliding" where
    ``<arch>.attention.sliding_window`` is above 0 and the layer's place in the architecture's pattern
    (``<arch>.attention.sliding_window_pattern``, a list of booleans or a period, else
    :data:`LLAMA_SWA_PATTERNS`) says so; "full" elsewhere."""
    _, val = _header_val(path)
    arch = val("general.architecture", "")
    n = int(val(f"{arch}.block_count") or 0)
    window = val(f"{arch}.attention.sliding_window") or 0
    if not window or arch not in LLAMA_SWA_PATTERNS:
        return ("full",) * n
    pattern = val(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list) and len(pattern) >= n:
        return tuple("sliding" if pattern[i] else "full" for i in range(n))
    period, dense_first = LLAMA_SWA_PATTERNS[arch]
    period = int(pattern) if isinstance(pattern, int) and not isinstance(pattern, bool) else period
    slides = (lambda i: i % period != 0) if dense_first else (lambda i: i % period < period - 1)
    return tuple("sliding" if period == 0 or slides(i) else "full" for i in range(n))


def gguf_config(path) -> dict:
    """The settings a GGUF file states (what llama.cpp reads), keyed as :data:`SETTINGS_KEYS`."""
    header, val = _header_val(path)
    arch = val("general.architecture", "")
    heads = val(f"{arch}.attention.head_count")
    embd = val(f"{arch}.embedding_length")
    scaling = val(f"{arch}.rope.scaling.type")
    names = {t[0] for t in header["tensors"]}
    tokens = val("tokenizer.ggml.tokens", [])
    types = gguf_layer_types(path)
    theta = float(val(f"{arch}.rope.freq_base", 10000.0))
    sliding = "sliding" in types
    theta_sliding = val(f"{arch}.rope.freq_base_swa", 10000.0 if arch in LLAMA_SWA_BASE_10000 else theta)
    return {
        "rope_theta": theta,
        "rope_theta_sliding": float(theta_sliding) if sliding else None,
        "rope_scaling": rope_scaling_summary({"type": scaling, "factor": val(f"{arch}.rope.scaling.factor")}),
        "rms_norm_eps": float(val(f"{arch}.attention.layer_norm_rms_epsilon", float("nan"))),
        "n_heads": heads,
        "n_kv_heads": val(f"{arch}.attention.head_count_kv", heads),
        "head_dim": val(f"{arch}.attention.key_length")
        or val(f"{arch}.rope.dimension_count")
        or (embd // heads if embd and heads else None),
        "n_layers": val(f"{arch}.block_count"),
        "sliding_window": int(val(f"{arch}.attention.sliding_window") or 0) if sliding else 0,
        "sliding_layers": types.count("sliding"),
        "attn_logit_softcapping": val(f"{arch}.attn_logit_softcapping") or None,
        "final_logit_softcapping": val(f"{arch}.final_logit_softcapping") or None,
        "vocab_size": val(f"{arch}.vocab_size") or (tokens["length"] if isinstance(tokens, dict) else len(tokens)),
        "context_length": val(f"{arch}.context_length"),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_id": val("tokenizer.ggml.bos_token_id"),
        "eos_id": val("tokenizer.ggml.eos_token_id"),
    }


# --- weight tensors as stored ------------------------------------------------------
def weight_tensors(path) -> tuple:
    """(name, type, elements, bytes) of every weight tensor stored at ``path``: a GGUF file
    (:func:`gguf_tensors`), a folder of ONNX models (:func:`onnx_tensors`) or of *.safetensors
    (:func:`safetensors_tensors`). ``elements`` counts weights, ``bytes`` what they occupy as stored.
    Raises LabError for a path that holds none of these."""
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return gguf_tensors(str(p))
    if p.is_dir() and list(p.glob("*.onnx")):
        return onnx_tensors(str(p))
    if p.is_dir() and list(p.glob("*.safetensors")):
        return safetensors_tensors(str(p))
    raise LabError(
        f"{p}: no weights to count; expected a GGUF file, or a folder of ONNX models or *.safetensors "
        "(run `lablib prepare`, or load the engine once so that it builds its model)"
    )


def gguf_tensors(path) -> tuple:
    """(name, ggml type name, elements, bytes) of every tensor of a GGUF file (from its
    :func:`gguf_header`, read once per version of the file)."""
    return tuple(gguf_header(path)["tensors"])


@functools.lru_cache(maxsize=16)
def safetensors_tensors(folder: str) -> tuple:
    """(name, dtype, elements, bytes) of every tensor in a folder's *.safetensors (headers only: an
    8-byte little-endian length, then JSON {name: {dtype, shape, data_offsets}})."""
    import math
    import struct

    out = []
    for p in sorted(Path(folder).glob("*.safetensors")):
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                lo, hi = t["data_offsets"]
                out.append((name, t["dtype"], math.prod(t["shape"]), hi - lo))
    return tuple(out)


# floating-point tensor types, as GGUF and safetensors name them (the rest are quantized or integer)
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
# ONNX TensorProto data types as safetensors names them
ONNX_TYPES = {1: "F32", 2: "U8", 3: "I8", 5: "I16", 6: "I32", 7: "I64", 9: "BOOL", 10: "F16", 11: "F64", 16: "BF16"}
# ONNX Runtime's block-quantized operators: (data, scales, zero points) inputs of one weight matrix
BLOCK_QUANTIZED = {"MatMulNBits": (1, 2, 3), "GatherBlockQuantized": (0, 2, 3)}


@functools.lru_cache(maxsize=16)
def onnx_tensors(folder: str) -> tuple:
    """(name, type, elements, bytes) of every initializer of the *.onnx models in ``folder``, read from
    the graph (external data left unread: its ``length``, else the tensor's own bytes).

    A weight matrix that ONNX Runtime's block-quantized operators read (``MatMulNBits``,
    ``GatherBlockQuantized``: packed ``bits``-bit data, per-block scales and optional zero points)
    is one entry: the data's name without its ``_Q4``-style suffix, type ``INT{bits}``, its weights
    (N x K, from the node's attributes, or the packed bytes x 8 / bits), the bytes of data, scales and
    zero points together (as a GGUF Q4_0 block holds its scale). Other initializers keep their ONNX
    type, named as safetensors names dtypes (F32, F16, U8...). Needs the ``onnx`` package."""
    import math
    import re

    try:
        import onnx
    except ImportError:
        raise LabError(
            f"{folder}: counting an ONNX model's weights needs the onnx package; install it: "
            "pip install -e '.[onnxruntime-genai]'"
        ) from None
    out = []
    for path in sorted(Path(folder).glob("*.onnx")):
        g = onnx.load(str(path), load_external_data=False).graph
        init = {t.name: t for t in g.initializer}

        def nbytes(t):
            ext = {e.key: e.value for e in t.external_data}
            if "length" in ext:
                return int(ext["length"])
            return len(t.raw_data) or len(onnx.numpy_helper.to_array(t).tobytes())

        merged = set()
        for node in g.node:
            if node.op_type not in BLOCK_QUANTIZED or node.input[BLOCK_QUANTIZED[node.op_type][0]] not in init:
                continue
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            bits = int(attrs.get("bits", 4))
            parts = [node.input[i] for i in BLOCK_QUANTIZED[node.op_type] if i < len(node.input)]
            parts = [n for n in parts if n in init and n not in merged]
            data = init[parts[0]]
            if "K" in attrs and "N" in attrs:
                elements = int(attrs["K"]) * int(attrs["N"])
            else:
                elements = math.prod(data.dims) * 8 // bits
            name = re.sub(r"_Q\d+$", "", data.name)
            out.append((name, f"INT{bits}", elements, sum(nbytes(init[n]) for n in parts)))
            merged.update(parts)
        for t in g.initializer:
            if t.name not in merged:
                kind = ONNX_TYPES.get(t.data_type, onnx.TensorProto.DataType.Name(t.data_type))
                out.append((t.name, kind, math.prod(t.dims), nbytes(t)))
    return tuple(out)


# --- the model's shape: lablib.model.shape -------------------------------------------


# --- experiments ------------------------------------------------------------------
@keywords_checked
def folder_with_config(folder, config, out) -> Path:
    """A copy of model ``folder`` at ``out`` whose config.json is ``config`` (a dict or a
    path); weights are linked, not copied. For experiments such as "what does mlx-lm do
    with a config written by transformers 5?" (data/cases/rope_theta_v5)."""
    folder, out = Path(folder), Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in folder.iterdir():
        if f.name == "config.json" or not f.is_file():
            continue
        if f.suffix == ".safetensors":
            (out / f.name).symlink_to(f.resolve())
        else:
            shutil.copy(f, out / f.name)
    cfg = config if isinstance(config, dict) else json.loads(Path(config).read_text())
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out
