"""Small models of other architectures, made at test time: a transformers config, random weights, the default
model's tokenizer, converted to GGUF by llama.cpp's own converter (the source tree the lab's llama.cpp was built
from). A few MB each; the lab then meets them as a user with a GGUF file would (``lablib prepare FILE.gguf``).

The weights are random (seed 0) with a wide initialisation (``initializer_range`` 0.5), so that the logits
are peaked enough for greedy decoding to be decided by the model, not by rounding: a model of near-uniform
logits would flip between engines at every position.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

# the three architectures, each with what sets it apart from the default model (a llama)
ARCHITECTURES = {
    # Qwen 3: per-head RMSNorm on q and k, heads narrower than the config class's default (transformers' GGUF
    # loader maps no head size: lablib.model.derive.restore_gguf_settings)
    "qwen3": "Qwen3Config",
    # Phi-3: fused qkv and gate_up projections, an untied output head
    "phi3": "Phi3Config",
    # Gemma 3: five sliding-window layers of 16 tokens before each full one, a RoPE base per layer type,
    # embeddings scaled by sqrt(hidden), norms stored as an offset from 1
    "gemma3": "Gemma3TextConfig",
}
COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    initializer_range=0.5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
EXTRA = {
    "qwen3": dict(num_hidden_layers=2, rope_theta=1_000_000.0),
    "phi3": dict(num_hidden_layers=2, tie_word_embeddings=False, sliding_window=None),
    "gemma3": dict(num_hidden_layers=6, sliding_window=16, query_pre_attn_scalar=16),
}
GEMMA3_WINDOW = EXTRA["gemma3"]["sliding_window"]


def make_hf(arch: str, out: Path, tokenizer_folder: str, dtype: str = "float32", chat_template: bool = True) -> Path:
    """A Hugging Face folder of ``arch`` (a key of :data:`ARCHITECTURES`) at ``out``: random weights saved in
    ``dtype``, the tokenizer of ``tokenizer_folder`` (its vocabulary sizes the model), without its chat
    template when ``chat_template`` is False (a base model)."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_folder)
    cfg_cls = getattr(transformers, ARCHITECTURES[arch])
    cfg = cfg_cls(**{**COMMON, "vocab_size": len(tok), **EXTRA[arch]})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(getattr(torch, dtype))
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    tc = out / "tokenizer_config.json"
    d = json.loads(tc.read_text())
    d["tokenizer_class"] = "GPT2Tokenizer"  # what SmolLM2's tokenizer is (llama.cpp's Phi-3 converter asks)
    d.pop("chat_template", None) if not chat_template else None
    tc.write_text(json.dumps(d, indent=1))
    if not chat_template:
        (out / "chat_template.jinja").unlink(missing_ok=True)
    return out


# general.name of the GGUFs: llama.cpp's vocabulary loader marks "</s>", "<s>" and "<unk>" of a model whose
# *name* says phi-3 (llama-vocab.cpp), tokens a SmolLM2 vocabulary does not have ("unordered_map::at")
GGUF_NAME = "lab tiny model"


def to_gguf(hf: Path, out: Path, outtype: str = "f32") -> Path:
    """``hf`` converted to GGUF at ``out`` by llama.cpp's ``convert_hf_to_gguf.py`` (the lab's source tree);
    raises AssertionError with the converter's last lines when it fails."""
    from lablib.build.llama import converter_path

    p = subprocess.run(
        [
            sys.executable,
            str(converter_path()),
            str(hf),
            "--outfile",
            str(out),
            "--outtype",
            outtype,
            "--model-name",
            GGUF_NAME,
        ],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0 and out.is_file(), (p.stderr or p.stdout)[-2000:]
    return out


def made_up_gguf(out: Path) -> Path:
    """A GGUF file of an architecture no engine knows ("made-up-arch"): a header, a tokenizer and two small
    tensors, written with the gguf package."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(out), arch="made-up-arch")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(16)])
    w.add_token_types([1] * 16)
    w.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
