# Solution · lab 04 · does every engine really slide?
#
# Gemma 3 270M's sliding layers attend their last 512 tokens only. Below 512
# tokens a sliding layer and a full one compute the same thing, so a short
# prompt cannot tell whether an engine applies the window. A prompt of 700
# tokens can: from position 512 on, an engine that ignored the window would
# attend tokens the model never saw together in training.
#
# 1. transformers and llama.cpp on 700 tokens of prose (after <bos>): the KL
#    between their next-token distributions is as small after position 512 as
#    before it. Both slide.
# 2. A what-if: transformers given a config.json without the window (every
#    layer full, as an engine that does not know Gemma 3's layer types would
#    build it). The config check names it at once (sliding_window and
#    sliding_layers differ), and the logits show the damage, only past 512.
#
# PASTE: what it printed on this machine (see the note at the end).
import json
import tempfile
from pathlib import Path

import lablib
from lablib.measure.workload import prompt_of_length
from lablib.model.formats import read_config
from lablib.studies import compare as cmp

second = lablib.prepare("gemma-3-270m")
bos = lablib.text_ids(second, "")  # the <bos> Gemma asks for before a text
ids = bos + prompt_of_length(second, 699)
window = read_config(second.hf_path)["sliding_window"]


def kl_before_after(result, engine):
    """Mean KL (nats) of ``engine`` against the reference before and after the window's edge."""
    kl = result.check("logits").details["stats"][engine]["kl"]
    before, after = float(kl[: window - 1].mean()), float(kl[window:].mean())
    print(f"  mean KL before / after position {window}: {before:.4f} / {after:.4f} nats")


both = cmp.compare(second, engines=["llama.cpp", "transformers"], ids=ids, max_new_tokens=8)
print("both engines as built:", both.verdict["layer"], "| config:", both.check("config").verdict)
kl_before_after(both, "llama.cpp")

cfg = read_config(second.hf_path)
cfg["layer_types"] = ["full_attention"] * cfg["num_hidden_layers"]  # no layer slides
folder = lablib.folder_with_config(second.hf_path, cfg, Path(tempfile.mkdtemp()) / "no-window")
blind = cmp.compare(
    second,
    engines=["llama.cpp", "transformers"],
    reference="llama.cpp",
    engine_models={"transformers": str(folder)},
    ids=ids,
    max_new_tokens=8,
)
print("transformers without the window:", blind.verdict["layer"], "|", blind.check("config").verdict)
kl_before_after(blind, "transformers")
print(json.dumps({k: v for k, v in blind.verdict.items() if k != "text"}, default=str))
