"""LoRA adapters the lab makes itself (lab 11), in the form each engine reads, cached under the lab home.

No adapter for the lab's model ships anywhere the lab can reach, so the lab makes them. A LoRA adapter adds
``scale * B @ A`` to a weight ``W`` (out x in): ``A`` is rank x in, ``B`` is out x rank, ``scale`` is
``lora_alpha / rank`` (Hu et al. 2021, "LoRA"; PEFT's ``LoraConfig``). A LoRA initialised the usual way is a
no-op (``B`` is zero), so here both matrices are drawn from one seeded stream (torch's CPU generator: the same
numbers on every machine with the same torch) and ``B`` is scaled so that every target weight moves by
:data:`STRENGTH` of its own size: ``||scale * B @ A||_F = STRENGTH * ||W||_F``. The output changes (greedy ids
differ from the base model's) at any rank, and the text stays text.

One adapter, three forms, made on first use (:meth:`Adapter.path_for`):

- ``peft``: a PEFT folder (``adapter_config.json``, ``adapter_model.safetensors``), saved by PEFT itself: what
  transformers+PEFT and vLLM read;
- ``gguf``: a GGUF LoRA written by llama.cpp's own ``convert_lora_to_gguf.py`` (from the source the lab built
  llama.cpp from), float32: what llama.cpp and llama-server read;
- ``mlx``: mlx-lm's adapter folder (``adapter_config.json`` with ``lora_parameters``, ``adapters.safetensors``
  with ``lora_a`` = A transposed, ``lora_b`` = B transposed: mlx-lm's ``LoRALinear`` computes
  ``y + scale * (x @ lora_a) @ lora_b``).

And merged into the model's weights (:func:`merged_model`): PEFT's ``merge_and_unload`` (a Hugging Face folder),
llama.cpp's ``llama-export-lora`` (a GGUF whose merged tensors are F16, as that tool writes them), mlx-lm's
``fuse`` (an MLX folder).

Cached in ``<lab home>/adapters/<model sha256[:16]>/<name>/`` with ``adapter.json`` (rank, alpha, targets,
seed, strength, parameters, bytes on disk per form). Two processes making the same adapter wait for each other
(a file lock), and a half-written form is never left in place (written to ``<form>.<pid>.tmp``, renamed when done).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lablib.config import lab_home
from lablib.errors import FormatError, LabError, first_line
from lablib.model.derive import run_program
from lablib.staging import staged

# the projections a lab adapter changes: every attention and MLP projection of a llama-like decoder layer (PEFT's
# target_modules names; the same names in mlx-lm's keys, under self_attn. and mlx.)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MLX_KEYS = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}
RANKS = (8, 64)  # the ranks lab 11 compares: a small adapter and a large one
STRENGTH = 0.12  # ||scale * B @ A||_F / ||W||_F for every target weight: the output changes, the text stays text
FORMS = ("peft", "gguf", "mlx")
MERGED = ("hf", "gguf", "mlx")  # merged_model's forms: the model's own formats with the adapter in its weights
ADAPTER_VERSION = 1  # bump when what is written changes: older caches are made again


@dataclass
class Adapter:
    """One lab-made LoRA adapter of one model: its facts and the folder its forms are cached in.

    ``name``: how servers and rows name it (``r8``, ``r64-s1``: rank, and seed when not 0). ``rank``, ``alpha``
    (scale = alpha / rank), ``targets`` (PEFT module names), ``seed``, ``strength``; ``model_sha256``: the
    base model's source file hash (an adapter belongs to one model); ``parameters``: A and B over all target
    weights; ``bytes``: size on disk per form made so far; ``folder``: its cache folder.
    """

    name: str
    rank: int
    alpha: float
    targets: tuple[str, ...]
    seed: int
    strength: float
    model_name: str
    model_sha256: str
    model_source: str
    folder: str
    parameters: int = 0
    layers: int = 0
    bytes: dict = field(default_factory=dict)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def path_for(self, form: str, log=print) -> str:
        """The path of this adapter in ``form`` (one of :data:`FORMS`), made on first use. Raises LabError for
        another form, FormatError when the converter fails (its last line)."""
        if form not in FORMS:
            raise LabError(f"adapter form {form!r}: expected one of {', '.join(FORMS)}")
        path = Path(self.folder) / _FORM_PATHS[form]
        if not path.exists():
            with _lock(Path(self.folder)):
                if not path.exists():
                    from lablib.model.resolve import resolve

                    model = resolve(self.model_source)
                    _MAKERS[form](self, model, path, log)
                    self.bytes[form] = _size(path)
                    _write_facts(self)
        return str(path)

    def facts(self) -> dict:
        """What a row or a table says of it: name, rank, alpha, targets, seed, strength, parameters, bytes."""
        d = asdict(self)
        d.pop("folder")
        d.pop("model_source")
        d["targets"] = ",".join(self.targets)
        return d


_FORM_PATHS = {"peft": "peft", "gguf": "adapter-f32.gguf", "mlx": "mlx"}


def adapter_name(rank: int, seed: int = 0) -> str:
    """The name of the lab adapter of ``rank`` and ``seed``: ``r8``, ``r8-s1``."""
    return f"r{rank}" + (f"-s{seed}" if seed else "")


def make_adapter(
    model=None,
    rank: int = 8,
    seed: int = 0,
    forms=("peft",),
    targets=TARGETS,
    strength: float = STRENGTH,
    log=print,
) -> Adapter:
    """The lab's LoRA adapter of ``rank`` for ``model`` (a ResolvedModel, a name or path, None: the default),
    drawn from ``seed``, with ``forms`` (some of :data:`FORMS`) made now; cached, so a second call reads its
    ``adapter.json``. Raises LabError for a rank or strength out of range, or a model with no Hugging Face
    folder (the adapter is made on its weights) or none of ``targets``."""
    from lablib.checks import whole
    from lablib.model.resolve import resolve

    rank = whole(rank, "rank", "a whole number, at least 1 (the adapter's inner dimension)")
    seed = whole(seed, "seed", "a whole number, 0 or more", lo=0)
    if not 0 < float(strength) < 1:
        raise LabError(f"strength={strength!r}: expected a share of each weight's size between 0 and 1")
    bad = [forms] if isinstance(forms, str) else [f for f in forms if f not in FORMS]
    if bad:
        raise LabError(f"adapter forms {bad}: expected a list of some of {', '.join(FORMS)}")
    rm = resolve(model)
    name = adapter_name(rank, seed)
    if tuple(targets) != TARGETS or float(strength) != STRENGTH:
        import hashlib

        name += "-" + hashlib.sha256(f"{sorted(targets)}{strength}".encode()).hexdigest()[:6]
    folder = lab_home() / "adapters" / rm.sha256[:16] / name
    folder.mkdir(parents=True, exist_ok=True)
    with _lock(folder):
        ad = _read_facts(folder)
        if ad is None:
            ad = Adapter(
                name=name,
                rank=rank,
                alpha=float(rank),  # scale 1: the strength is in B
                targets=tuple(targets),
                seed=seed,
                strength=float(strength),
                model_name=rm.name,
                model_sha256=rm.sha256,
                model_source=rm.source,
                folder=str(folder),
            )
            _make_peft(ad, rm, folder / _FORM_PATHS["peft"], log)
            ad.bytes["peft"] = _size(folder / _FORM_PATHS["peft"])
            _write_facts(ad)
    for form in forms:
        ad.path_for(form, log=log)
    return ad


def check_adapter_for(adapter: Adapter, model) -> None:
    """Raise LabError when ``adapter`` was not made for ``model`` (a ResolvedModel): an adapter's matrices are
    shaped by, and learned against, one base model's weights."""
    if adapter.model_sha256 != model.sha256:
        raise LabError(
            f"adapter {adapter.name} was made for {adapter.model_name} (sha256 {adapter.model_sha256[:12]}), not "
            f"{model.name} (sha256 {model.sha256[:12]}): expected an adapter of the same base model; make one "
            "with lablib.model.adapters.make_adapter(model)"
        )


def merged_model(adapter: Adapter, form: str, log=print) -> str:
    """The base model with ``adapter`` merged into its weights, in ``form`` (one of :data:`MERGED`): a Hugging
    Face folder (PEFT's ``merge_and_unload``), a GGUF file (``llama-export-lora`` on the model's GGUF: merged
    tensors come out F16, the others as they were), an MLX folder (mlx-lm's ``fuse``). Made on first use,
    cached beside the adapter."""
    if form not in MERGED:
        raise LabError(f"merged form {form!r}: expected one of {', '.join(MERGED)}")
    path = Path(adapter.folder) / {"hf": "merged-hf", "gguf": "merged.gguf", "mlx": "merged-mlx"}[form]
    if not path.exists():
        with _lock(Path(adapter.folder)):
            if not path.exists():
                from lablib.model.resolve import resolve

                model = resolve(adapter.model_source)
                _MERGERS[form](adapter, model, path, log)
                adapter.bytes[f"merged-{form}"] = _size(path)
                _write_facts(adapter)
    return str(path)


# --- making the forms ---------------------------------------------------------------------------------------


def _make_peft(ad: Adapter, model, out: Path, log) -> None:
    """Draw A and B (seeded), scale B to the strength, save with PEFT."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    hf = model.path_for("hf", "a LoRA adapter")
    log(f"making LoRA adapter {ad.name} (rank {ad.rank}) of {model.name}")
    base = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    present = {n.rsplit(".", 1)[-1] for n, _ in base.named_modules()}
    missing = [t for t in ad.targets if t not in present]
    if len(missing) == len(ad.targets):
        raise LabError(
            f"{model.name} has none of the adapter's target modules ({', '.join(ad.targets)}): expected a "
            "llama-like decoder (q_proj ... down_proj)"
        )
    targets = [t for t in ad.targets if t in present]
    cfg = LoraConfig(r=ad.rank, lora_alpha=ad.alpha, target_modules=targets, lora_dropout=0.0, bias="none")
    with _quiet_peft():
        peft_model = get_peft_model(base, cfg)
    g = torch.Generator().manual_seed(ad.seed)
    params, layers = 0, set()
    with torch.no_grad():
        for name, mod in peft_model.named_modules():
            if not (hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {})):
                continue
            a, b, w = mod.lora_A["default"].weight, mod.lora_B["default"].weight, mod.base_layer.weight
            a.copy_(torch.randn(a.shape, generator=g) / a.shape[1] ** 0.5)
            b.copy_(torch.randn(b.shape, generator=g))
            delta = (ad.alpha / ad.rank) * (b @ a)
            b.mul_(ad.strength * w.norm() / delta.norm())
            params += a.numel() + b.numel()
            layers.update(p for p in name.split(".") if p.isdigit())
    ad.parameters, ad.layers = params, len(layers)
    with staged(out) as tmp:
        peft_model.save_pretrained(str(tmp))
        cfg_path = tmp / "adapter_config.json"
        cfg_json = json.loads(cfg_path.read_text())
        cfg_json["base_model_name_or_path"] = str(hf)  # a local folder, never a hub id (offline rooms)
        cfg_path.write_text(json.dumps(cfg_json, indent=2))


def _make_gguf(ad: Adapter, model, out: Path, log) -> None:
    """llama.cpp's ``convert_lora_to_gguf.py`` on the PEFT folder, float32."""
    from lablib.build.llama import BuildError, converter_path

    try:
        script = converter_path().with_name("convert_lora_to_gguf.py")
    except BuildError as e:
        raise FormatError(f"llama.cpp's LoRA converter is not here ({e})") from None
    peft = ad.path_for("peft", log=log)
    log(f"converting LoRA adapter {ad.name} to GGUF (llama.cpp's {script.name})")
    with staged(out) as tmp:
        run_program(
            [
                sys.executable,
                str(script),
                "--base",
                model.path_for("hf", "a GGUF LoRA"),
                "--outtype",
                "f32",
                "--outfile",
                str(tmp),
                peft,
            ],
            tmp,
            f"llama.cpp's LoRA converter ({script.name}) could not convert adapter {ad.name}",
        )


def _make_mlx(ad: Adapter, model, out: Path, log) -> None:
    """mlx-lm's adapter folder from the PEFT weights: lora_a = A^T, lora_b = B^T, scale = alpha / rank."""
    from safetensors.numpy import load_file, save_file

    peft = Path(ad.path_for("peft", log=log))
    weights = load_file(str(peft / "adapter_model.safetensors"))
    out_w, layers = {}, set()
    for key, w in weights.items():
        # base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight -> model.layers.3.self_attn.q_proj.lora_a
        stem, leaf = key.rsplit(".lora_", 1)
        stem = stem.removeprefix("base_model.model.")
        out_w[f"{stem}.lora_{leaf[0].lower()}"] = w.T.copy()
        layers.add(int(stem.split(".layers.")[1].split(".")[0]))
    n_layers = _num_layers(model)
    if layers != set(range(n_layers - len(layers), n_layers)):
        raise LabError(
            f"adapter {ad.name} changes layers {sorted(layers)}: mlx-lm's adapter folder can only name the last "
            f"num_layers of the model's {n_layers}; expected an adapter on the last layers"
        )
    config = {
        "fine_tune_type": "lora",
        "num_layers": len(layers),
        "lora_parameters": {
            "rank": ad.rank,
            "scale": ad.scale,
            "dropout": 0.0,
            "keys": [_MLX_KEYS[t] for t in ad.targets if any(f".{t}." in k for k in weights)],
        },
    }
    with staged(out, make_folder=True) as tmp:
        save_file(out_w, str(tmp / "adapters.safetensors"))
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2))


def _num_layers(model) -> int:
    from lablib.model.shape import model_dims

    return int(model_dims(model)["layers"])


def _merge_hf(ad: Adapter, model, out: Path, log) -> None:
    """PEFT's ``merge_and_unload``, saved with the base folder's tokenizer and settings files."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    hf = Path(model.path_for("hf", "a merged adapter"))
    log(f"merging LoRA adapter {ad.name} into {ad.model_name} (PEFT merge_and_unload)")
    base = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    with _quiet_peft():
        merged = PeftModel.from_pretrained(base, ad.path_for("peft", log=log)).merge_and_unload()
    with staged(out) as tmp:
        merged.save_pretrained(str(tmp))
        for f in hf.iterdir():  # tokenizer, chat template, generation settings: as the base has them
            if f.is_file() and not (tmp / f.name).exists() and not f.name.endswith((".safetensors", ".bin")):
                shutil.copy2(f, tmp / f.name)


def _merge_gguf(ad: Adapter, model, out: Path, log) -> None:
    """llama.cpp's ``llama-export-lora``: the model's GGUF with the GGUF LoRA added, merged tensors in F16."""
    from lablib.build.llama import BuildError, llama_tool

    try:
        tool = llama_tool("llama-export-lora", log=log)
    except BuildError as e:
        raise LabError(f"llama.cpp's llama-export-lora could not be built here ({first_line(e)})") from None
    lora = ad.path_for("gguf", log=log)
    log(f"merging LoRA adapter {ad.name} into {ad.model_name} (llama-export-lora)")
    with staged(out) as tmp:
        run_program(
            [str(tool), "-m", model.path_for("gguf", "a merged adapter"), "--lora", lora, "-o", str(tmp)],
            tmp,
            f"llama-export-lora could not merge adapter {ad.name}",
        )


def _merge_mlx(ad: Adapter, model, out: Path, log) -> None:
    """mlx-lm's fuse: the adapter's LoRALinear layers folded into their weights, saved as an MLX folder."""
    import mlx_lm
    from mlx.utils import tree_unflatten
    from mlx_lm.utils import save

    src = Path(model.path_for("mlx", "a merged adapter"))
    log(f"merging LoRA adapter {ad.name} into {ad.model_name} (mlx-lm fuse)")
    m, tok, config = mlx_lm.load(str(src), adapter_path=ad.path_for("mlx", log=log), return_config=True)
    fused = [(n, mod.fuse()) for n, mod in m.named_modules() if hasattr(mod, "fuse")]
    m.update_modules(tree_unflatten(fused))
    with staged(out) as tmp:
        save(tmp, str(src), m, tok, config)
        for f in src.iterdir():  # the lab's normalized config and anything else the folder carried
            if f.is_file() and not (tmp / f.name).exists() and not f.name.endswith(".safetensors"):
                shutil.copy2(f, tmp / f.name)
        shutil.copy2(src / "config.json", tmp / "config.json")


@contextlib.contextmanager
def _quiet_peft():
    """PEFT 0.21 asks transformers 5 its deprecated ``is_gradient_checkpointing``: that FutureWarning, silenced
    (as lablib.engines.hf does)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


_MAKERS = {"peft": _make_peft, "gguf": _make_gguf, "mlx": _make_mlx}
_MERGERS = {"hf": _merge_hf, "gguf": _merge_gguf, "mlx": _merge_mlx}


# --- the cache ----------------------------------------------------------------------------------------------


def _size(path: Path) -> int:
    path = Path(path)
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _write_facts(ad: Adapter) -> None:
    d = asdict(ad)
    d["targets"] = list(ad.targets)
    d["version"] = ADAPTER_VERSION
    p = Path(ad.folder) / "adapter.json"
    with staged(p) as tmp:
        tmp.write_text(json.dumps(d, indent=2))


def _read_facts(folder: Path) -> Adapter | None:
    try:
        d = json.loads((folder / "adapter.json").read_text())
    except (OSError, ValueError):
        return None
    if d.pop("version", None) != ADAPTER_VERSION or not (folder / _FORM_PATHS["peft"]).is_dir():
        return None
    d["targets"] = tuple(d["targets"])
    d["folder"] = str(folder)
    return Adapter(**{k: v for k, v in d.items() if k in Adapter.__dataclass_fields__})


class _lock:
    """An exclusive lock on ``<folder>/.lock`` (re-entrant within one process: path_for inside make_adapter)."""

    _held: set = set()

    def __init__(self, folder: Path):
        self.path = Path(folder) / ".lock"

    def __enter__(self):
        import fcntl

        self.mine = str(self.path) not in _lock._held
        if self.mine:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.f = open(self.path, "w")
            fcntl.flock(self.f, fcntl.LOCK_EX)
            _lock._held.add(str(self.path))
        return self

    def __exit__(self, *exc):
        if self.mine:
            _lock._held.discard(str(self.path))
            self.f.close()
