"""``demo``: a fleet of workers through a local throttling server, stock urllib3
``Retry`` against ``RetryAfterAdapter``, side by side."""

from __future__ import annotations

import argparse
import sys
from typing import IO

from ._output import EX_OK, EX_USAGE, err


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import DemoConfig, format_report, report_json, run_demo
    from ..errors import ConfigurationError

    try:
        config = DemoConfig(
            workers=args.workers,
            items=args.items,
            quota=args.quota,
            window=args.window,
            deadline=args.deadline,
            form=args.form,
        )
    except ConfigurationError as exc:
        err(f"error: {exc}")
        return EX_USAGE
    human: IO[str] = sys.stderr if args.json else sys.stdout
    _progress(
        f"Running {config.workers} workers over {config.items} items, first with stock urllib3 Retry, "
        f"then with RetryAfterAdapter (each run stops by itself within {config.limit:g} s)..."
    )
    results = run_demo(config, progress=_progress)
    human.write(format_report(results, config) + "\n")
    human.flush()
    if args.json:
        sys.stdout.write(report_json(results, config) + "\n")
        sys.stdout.flush()
    return EX_OK


def _progress(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
