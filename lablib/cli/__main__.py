"""``python -m lablib.cli ...``: the same as the ``lablib`` command."""

from lablib.cli import main

raise SystemExit(main())
