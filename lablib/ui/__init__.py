"""What a person sees besides a figure: widget panels (:mod:`lablib.ui.widgets`) and the
self-contained HTML report (:mod:`lablib.ui.report`)."""
