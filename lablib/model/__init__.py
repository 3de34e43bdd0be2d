"""A model file and what it states: resolve it, derive its other formats once, read its facts.

- :mod:`lablib.model.resolve`: a model (default, path, hub id) to a :class:`ResolvedModel`, cached;
- :mod:`lablib.model.formats`: detect a format; configs; the one GGUF reader;
- :mod:`lablib.model.shape`: the model's shape and per-token counts (FLOPs, KV bytes);
- :mod:`lablib.model.tokenizer`: the one tokenizer the lab uses for text;
- :mod:`lablib.model.derive`: GGUF -> Hugging Face folder -> MLX folder.
"""

from __future__ import annotations

from lablib.model.resolve import ResolvedModel, prepare  # noqa: F401
