"""Derived formats: a Hugging Face folder from a GGUF file, an MLX folder from a Hugging Face folder.

Each derivation writes into ``<out>.tmp`` and renames it into place when complete, so an
interrupted derivation leaves no half folder. :func:`lablib.models.prepare` calls these
once per source file and caches the result.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import shutil
from pathlib import Path

from .errors import FormatError, LabError, first_line
from .formats import gguf_facts, normalize_config, restore_pre_tokenizer, write_normalized_config


def derive_hf_from_gguf(gguf_path: Path, out: Path) -> None:
    """Dequantize a GGUF into a Hugging Face folder (float32 safetensors).

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
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    restore_pre_tokenizer(tok, gguf_facts(gguf_path)["pre_tokenizer"])
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype="float32")
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
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def derive_mlx_from_hf(hf_path: Path, out: Path, dtype: str = "float32") -> None:
    """Convert a Hugging Face folder to an MLX folder (mlx_lm.convert), then
    normalize its config so mlx-lm reads the RoPE base and scaling correctly."""
    from mlx_lm import convert

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(hf_path), mlx_path=str(tmp), dtype=dtype)
    write_normalized_config(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def run_derivation(what: str, source: Path, work) -> None:
    """Run a derivation; a failure becomes one LabError naming the source and the cause."""
    try:
        work()
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
