"""The module paths of the flat layout, aliased to their new homes (one table, one finder).

Until the restructuring (docs/DESIGN.md, "Layers") every module sat at the top of the package:
``lablib.hardware``, ``lablib.roofline``, ``lablib.llama_build``, ... Copies of notebooks and scripts
outside this repository (a workshop laptop) may still import them. :class:`_AliasFinder` answers
those names with the *same module object* as the new path (so ``monkeypatch.setattr`` on either
patches the real module) and warns once per name with a DeprecationWarning. Nothing is imported
until an old name is asked for. ``python -m lablib.llama_build`` is not aliased: run
``python -m lablib.build.llama``.

Pattern: vLLM's compatibility shims for its moved CLI modules (``sys.modules[__name__] = _real``),
here as one ``importlib.abc.MetaPathFinder`` instead of a file per old name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old module -> new module; lablib.hardware's concepts now live in four modules of lablib.machine,
# and the package re-exports all of them
OLD = {
    "lablib.models": "lablib.model.resolve",
    "lablib.formats": "lablib.model.formats",
    "lablib.derive": "lablib.model.derive",
    "lablib.hardware": "lablib.machine",
    "lablib.devices": "lablib.machine.devices",
    "lablib.accelerators": "lablib.machine.accelerators",
    "lablib.sampling": "lablib.engines.sampling",
    "lablib.memory": "lablib.engines.memory",
    "lablib.doctor": "lablib.engines.doctor",
    "lablib.servers": "lablib.engines.servers",
    "lablib.sse": "lablib.engines.http.sse",
    "lablib.trace": "lablib.results.trace",
    "lablib.schema": "lablib.results.schema",
    "lablib.tables": "lablib.results.tables",
    "lablib.workload": "lablib.measure.workload",
    "lablib.concurrency": "lablib.measure.closed_loop",
    "lablib.loadgen": "lablib.measure.load",
    "lablib.sweep": "lablib.measure.sweep",
    "lablib.anchors": "lablib.studies.anchors",
    "lablib.compare": "lablib.studies.compare",
    "lablib.cases": "lablib.studies.cases",
    "lablib.serving": "lablib.studies.serving",
    "lablib.quant": "lablib.studies.quant",
    "lablib.quality": "lablib.studies.quality",
    "lablib.ladder": "lablib.studies.ladder",
    "lablib.roofline": "lablib.studies.roofline",
    "lablib.prefix": "lablib.studies.prefix",
    "lablib.roofline_plots": "lablib.plots.roofline",
    "lablib.quant_plots": "lablib.plots.quant",
    "lablib.prefix_plots": "lablib.plots.prefix",
    "lablib.widgets": "lablib.ui.widgets",
    "lablib.report": "lablib.ui.report",
    "lablib.serving_cli": "lablib.cli.serve",
    "lablib.roofline_cli": "lablib.cli.roofline",
    "lablib.quant_cli": "lablib.cli.quantize",
    "lablib.prefix_cli": "lablib.cli.prefix",
    "lablib.llama_build": "lablib.build.llama",
    "lablib.wheelhouse": "lablib.build.wheelhouse",
}
# lablib.results (rows on disk) and lablib.plots (the sweep figures) kept their names as packages:
# their __init__ re-exports what the old modules offered.


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new
        self.spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self.spec  # the import system set the alias's spec on the shared object


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = OLD.get(fullname)
        if new is None:
            return None
        warnings.warn(
            f"{fullname} moved to {new} (docs/DESIGN.md, 'Layers'); the old name goes in a later release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import lablib`` calls it)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())  # before an editable install's finder of an older checkout
