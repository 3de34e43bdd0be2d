"""``python -m lablib.build.llama``."""

from lablib.build.llama.main import main

raise SystemExit(main())
