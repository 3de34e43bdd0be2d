"""Making the engines exist on this machine: install-time tools, never imported by ``import lablib``.

- ``python -m lablib.build.llama``: llama-cpp-python built for this CPU, probed and smoke-tested
  (:mod:`lablib.build.llama`); llama.cpp's own tools from the same tree (``--tool``);
- ``python -m lablib.build.wheelhouse``: one folder of wheels for rooms with no network;
- ``python -m lablib.build.mlx``: MLX's CPU backend on the system's OpenBLAS instead of the reference
  BLAS its wheel bundles (:mod:`lablib.build.mlx`).

All run on the standard library alone (before the lab's dependencies are installed). Run-time code
reaches this package only for :func:`lablib.build.llama.llama_tool` and the build report, lazily.
"""
