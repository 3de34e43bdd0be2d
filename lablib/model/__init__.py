"""A model file and what it states: resolve it, derive its other formats once, read its facts.

- :mod:`lablib.model.resolve`: a model (default, path, hub id) to a :class:`ResolvedModel`, cached;
- :mod:`lablib.model.formats`: detect a format; configs; the one GGUF reader; the model's shape;
- :mod:`lablib.model.derive`: GGUF -> Hugging Face folder -> MLX folder.
"""

from __future__ import annotations

from lablib.model.resolve import ResolvedModel, prepare, resolve  # noqa: F401
