"""The lablib version, written once: in pyproject.toml, read here from the installed package's metadata."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("lablib")
except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
    __version__ = "0+unknown"
