"""Shared pytest set-up: quick mode for everything, including notebook kernels (nbval)."""
import os

os.environ.setdefault("LABLIB_QUICK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
