"""``python -m retry_after_adapter.cli``: the same command line as ``python -m retry_after_adapter``."""

from __future__ import annotations

from . import main

raise SystemExit(main())
