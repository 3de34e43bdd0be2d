"""Inference Engine Lab: one model through transformers, llama.cpp and MLX, one clock.

``import lablib`` stays light: engines (torch, llama_cpp, mlx) import only when
loaded. The verbs: :func:`prepare` a model, :func:`load_engine`, generate, and
read the :class:`RequestTrace`.
"""
__version__ = "0.1.0"

from .errors import ContextOverflowError, FormatError, LabError  # noqa: E402
from .trace import RequestTrace  # noqa: E402


def prepare(model=None, **kw):
    """Resolve a model and derive its formats (see :func:`lablib.models.prepare`)."""
    from .models import prepare as _prepare

    return _prepare(model, **kw)


def load_engine(name, model=None, **kw):
    """Load engine ``name`` on ``model`` (see :func:`lablib.engines.load_engine`)."""
    from .engines import load_engine as _load

    return _load(name, model, **kw)


__all__ = ["ContextOverflowError", "FormatError", "LabError", "RequestTrace", "__version__",
           "load_engine", "prepare"]
