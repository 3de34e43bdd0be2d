"""Derived formats: a Hugging Face folder from a GGUF file, an MLX folder from a Hugging Face folder.

Each derivation writes into ``<out>.<pid>.tmp`` (:mod:`lablib.staging`) and renames it into place when complete, so an
interrupted derivation leaves no half folder. :func:`lablib.model.resolve.prepare` calls these
once per source file and caches the result.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import json
import math
import os
from pathlib import Path

from lablib.errors import FormatError, LabError, first_line
from lablib.model.formats import gguf_facts, normalize_config, restore_pre_tokenizer, write_normalized_config
from lablib.staging import staged


@contextlib.contextmanager
def gguf_read_once():
    """Within the block, each GGUF file is parsed once, and gguf's tensor-name maps built once.

    transformers parses the same GGUF for the tokenizer, the config and the weights (each parse
    walks every vocabulary entry in Python), converts its metadata twice, and builds a
    ``gguf.TensorNameMap`` once per module of the model (397 times for SmolLM2-135M). These are
    pure functions of their arguments, so here they are memoized: the derived folder is
    byte-for-byte what the unmemoized path writes (tests/test_models.py), and a first
    ``lablib prepare`` takes about half the time (benchmarks/prepare.py). transformers imports
    these names from their modules at call time, so replacing the module attributes reaches it.
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

    with staged(out, make_folder=True) as tmp:
        folder, fname = str(gguf_path.parent), gguf_path.name
        with gguf_read_once() if read_once else contextlib.nullcontext():
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
            restore_pre_tokenizer(tok, gguf_facts(gguf_path)["pre_tokenizer"])
            config = transformers.AutoConfig.from_pretrained(folder, gguf_file=fname)
            restore_gguf_settings(config, gguf_path)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, config=config, dtype="float32")
        state = model.state_dict()
        if getattr(model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(
            {k: v.detach().contiguous() for k, v in state.items()},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        cfg["architectures"] = [type(model).__name__]
        cfg["dtype"] = "float32"
        cfg.update(normalize_config(cfg))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        if model.generation_config is not None:
            model.generation_config.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        keep_tokenizer_as_saved(tok, tmp)


GENERIC_TOKENIZER = "TokenizersBackend"  # transformers 5's tokenizer class that takes tokenizer.json as it is


def keep_tokenizer_as_saved(tok, folder: Path) -> bool:
    """Make ``folder``'s tokenizer load back as ``tok`` was saved: when transformers' class for it (the
    ``tokenizer_class`` its GGUF converter names) rebuilds its own pipeline on load, discarding tokenizer.json's
    (transformers 5's ``Qwen2Tokenizer`` puts back Qwen's split regex and an NFC normalizer over the GPT-2 split a
    GGUF's "smollm" pre-tokenizer names: "\\n  x" became 3 tokens where llama.cpp makes 2), the folder names
    :data:`GENERIC_TOKENIZER` instead. Returns whether it did."""
    from transformers import AutoTokenizer

    def pipeline(t):
        b = t.backend_tokenizer
        return (str(b.pre_tokenizer), str(b.normalizer))

    if pipeline(AutoTokenizer.from_pretrained(str(folder))) == pipeline(tok):
        return False
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = GENERIC_TOKENIZER
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    if pipeline(AutoTokenizer.from_pretrained(str(folder))) != pipeline(tok):
        raise FormatError(f"{folder}: its tokenizer does not load back as it was saved, even as {GENERIC_TOKENIZER}")
    return True


def restore_gguf_settings(config, gguf_path: Path) -> dict:
    """Put back into ``config`` (a transformers config read from a GGUF) what the GGUF states and transformers'
    GGUF mapping left at its config class's default; returns {setting: (transformers' value, the GGUF's)}.

    The head size: transformers 5's GGUF loader maps no ``<arch>.attention.key_length``, so a Qwen 3 GGUF whose
    heads are not the class default of 128 wide got a config whose projections do not fit its tensors ("Reinit
    due to size mismatch", then an error: a tiny Qwen 3 with 16-wide heads, tests/test_architectures.py)."""
    from lablib.model.formats import gguf_header

    fields = gguf_header(gguf_path)["fields"]
    arch = fields.get("general.architecture", "")
    fixed = {}
    head_dim = fields.get(f"{arch}.attention.key_length")  # stated, not derived (partial RoPE has fewer dims)
    if head_dim and getattr(config, "head_dim", head_dim) != head_dim:
        fixed["head_dim"] = (config.head_dim, head_dim)
        config.head_dim = head_dim
    return fixed


def derive_mlx_from_hf(hf_path: Path, out: Path, dtype: str = "float32") -> None:
    """Convert a Hugging Face folder to an MLX folder (mlx_lm.convert), then
    normalize its config so mlx-lm reads the RoPE base and scaling correctly."""
    from mlx_lm import convert

    with staged(out) as tmp, contextlib.redirect_stdout(io.StringIO()):
        convert(str(hf_path), mlx_path=str(tmp), dtype=dtype)
        write_normalized_config(tmp)


def run_derivation(what: str, source: Path, work):
    """Run a derivation (returns what ``work`` returns); a failure becomes one FormatError naming the source
    and the cause."""
    try:
        return work()
    except LabError:
        raise
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise  # prepare() names the unwritable lab home
        raise FormatError(
            f"deriving {what} from {source} failed ({e}); check the files and free disk "
            "space, then run `lablib prepare` again."
        ) from e
    except Exception as e:
        raise FormatError(
            f"deriving {what} from {source} failed ({type(e).__name__}: {first_line(e)}); "
            "expected a complete model the converter supports: check the files, or "
            "give the engine a model in its own format."
        ) from e


# the distributions whose versions decide what the derivations make: transformers (GGUF -> HF), mlx-lm (-> MLX),
# gguf, llama-cpp-python (whose llama.cpp source holds convert_hf_to_gguf.py); lablib.model.resolve tries a
# derivation that failed again when one of them changed
CONVERTER_DISTRIBUTIONS = "transformers mlx-lm gguf llama-cpp-python".split()

# the converter's --outtype for a Hugging Face folder's dtype: its own precision, so the GGUF holds the same
# weights (bfloat16 as most models are published; a float32 folder stays float32)
GGUF_OUTTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def gguf_outtype(hf_path: Path) -> str:
    """The converter's ``--outtype`` for ``hf_path``: its config's dtype (``dtype`` / ``torch_dtype``) as
    :data:`GGUF_OUTTYPES` names it; f32 when it names none."""
    from lablib.model.formats import read_config, text_config

    cfg = read_config(hf_path)
    dtype = cfg.get("dtype") or cfg.get("torch_dtype") or text_config(cfg).get("dtype") or "float32"
    return GGUF_OUTTYPES.get(str(dtype).replace("torch.", ""), "f32")


def derive_gguf_from_hf(hf_path: Path, out: Path) -> Path:
    """A GGUF file of a Hugging Face folder, written by llama.cpp's own converter (``convert_hf_to_gguf.py``
    from the source tree the lab's llama.cpp was built from: the same version reads it) at the folder's own
    precision (:func:`gguf_outtype`), into ``out/model-<outtype>.gguf``. Returns the file. Raises FormatError
    with the converter's last line when it cannot convert the architecture, LabError when llama.cpp's source
    is not on this machine."""
    import sys

    from lablib.build.llama import BuildError, converter_path

    try:
        script = converter_path()
    except BuildError as e:
        raise FormatError(f"llama.cpp's converter is not here ({e})") from None
    outtype = gguf_outtype(hf_path)
    with staged(out, make_folder=True) as tmp:
        target = tmp / f"model-{outtype}.gguf"
        run_program(
            [sys.executable, str(script), str(hf_path), "--outfile", str(target), "--outtype", outtype],
            target,
            f"llama.cpp's converter ({script.name}) could not convert it",
        )
    return out / target.name


def run_program(argv: list[str], makes: Path, failed: str) -> None:
    """Run one of llama.cpp's programs or scripts (``argv``), which should write ``makes``. Raises FormatError
    ``"{failed} (exit code N): <its last line of output>"`` when it exits non-zero or wrote nothing."""
    import subprocess

    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0 or not Path(makes).exists():
        lines = [ln for ln in (p.stderr or p.stdout).strip().splitlines() if ln.strip()]
        raise FormatError(f"{failed} (exit code {p.returncode}): {lines[-1] if lines else 'no output'}")


def count_params(folder: Path) -> int:
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
                raise FormatError(
                    f"{w} is not a readable PyTorch checkpoint ({type(e).__name__}: "
                    f"{first_line(e)}); expected weights saved by torch.save or transformers: "
                    "copy or download the folder again, or convert it to safetensors."
                ) from None
    return n
