"""``python -m retry_after_adapter``: the command line (see :mod:`retry_after_adapter.cli`)."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
