"""What a person sees besides a figure: the sweep panel (:mod:`lablib.ui.widgets`), lab 05's load
panel (:mod:`lablib.ui.serving`), the self-contained HTML report (:mod:`lablib.ui.report`), tables that fit
a notebook's page (:mod:`lablib.ui.tables`) and the console's key=value lines (:mod:`lablib.ui.text`)."""
