"""``explain VALUE``: how a Retry-After value is parsed and what the policy would decide."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from ._output import EX_FAILED, EX_OK, print_json

if TYPE_CHECKING:
    from ..errors import InvalidRetryAfter
    from ..header import RetryAfter
    from ..policy import Decision

_REASONS = {
    "beyond_max": "the wait is longer than --max-retry-after: rejected, never obeyed or shortened",
    "empty": "the value is empty",
    "too_long": "the value is longer than 128 characters",
    "control": "the value contains a control character",
    "repeated": "a list or repeated field (only one value is allowed)",
    "malformed": "neither delay-seconds (ASCII digits) nor an HTTP-date",
    "zone": "an HTTP-date must be in GMT",
    "out_of_range": "no such date or time",
    "weekday": "the day name does not match the date",
    "type": "not a string",
}

_CONSEQUENCE = "the adapter would stop (on_invalid='stop') or use local backoff (on_invalid='backoff')"


def cmd_explain(args: argparse.Namespace) -> int:
    from ..errors import InvalidRetryAfter
    from ..header import parse_retry_after
    from ..policy import TOO_LONG, beyond_bound

    value: str = args.value
    received_at: datetime = args.received_at or datetime.now(timezone.utc)
    date_valid = _date_valid(args.date, received_at)
    try:
        parsed = parse_retry_after(value, received_at=received_at, date=args.date)
        if beyond_bound(parsed.delay, args.max_retry_after):
            raise InvalidRetryAfter(TOO_LONG, value)
    except InvalidRetryAfter as exc:
        return _explain_invalid(args, exc, received_at, date_valid)

    decision = _decide(args, parsed.delay)
    if args.json:
        print_json(
            {
                **_common_json(args, received_at, date_valid),
                "valid": True,
                "form": parsed.form,
                "delay": parsed.delay,
                "eligible_at": parsed.eligible_at.isoformat(),
                "clock_skew": parsed.clock_skew,
                "decision": _decision_dict(decision, received_at),
            }
        )
        return EX_OK
    _print_parsed(args, parsed, received_at, date_valid)
    _print_decision(args, decision, received_at)
    return EX_OK


def _date_valid(date: str | None, received_at: datetime) -> bool | None:
    """Whether ``--date`` is a valid HTTP-date (None: not given)."""
    from ..errors import InvalidRetryAfter
    from ..header import parse_http_date

    if date is None:
        return None
    try:
        parse_http_date(date, received_at=received_at)
    except InvalidRetryAfter:
        return False
    return True


def _decide(args: argparse.Namespace, server_delay: float | None) -> Decision:
    from ..policy import decide

    return decide(
        server_delay=server_delay,
        backoff=args.backoff,
        cooldown_left=0.0,
        jitter=0.0,
        elapsed=args.elapsed,
        deadline=args.deadline,
        max_wait=args.max_wait,
    )


def _common_json(args: argparse.Namespace, received_at: datetime, date_valid: bool | None) -> dict[str, Any]:
    return {
        "value": args.value,
        "received_at": received_at.isoformat(),
        "date": args.date,
        "date_valid": date_valid,
        "policy": {
            "deadline": args.deadline,
            "max_wait": args.max_wait,
            "elapsed": args.elapsed,
            "backoff": args.backoff,
            "max_retry_after": args.max_retry_after,
        },
    }


def _explain_invalid(
    args: argparse.Namespace, exc: InvalidRetryAfter, received_at: datetime, date_valid: bool | None
) -> int:
    from ..policy import TOO_LONG

    stop_reason = "retry_after_too_long" if exc.reason == TOO_LONG else "invalid_retry_after"
    fallback = _decide(args, None)
    details = (
        f"stop: no retry, the response is returned with stop_reason '{stop_reason}'; "
        f"backoff: {_describe_action(fallback.action, fallback.reason, fallback.wait)} "
        f"(local backoff {_secs(args.backoff)})"
    )
    if args.json:
        print_json(
            {
                **_common_json(args, received_at, date_valid),
                "valid": False,
                "reason": exc.reason,
                "error": str(exc),
                "on_invalid": {
                    "stop": {"action": "stop", "reason": stop_reason},
                    "backoff": _decision_dict(fallback, received_at),
                },
                "consequence": _CONSEQUENCE,
                "details": details,
            }
        )
    else:
        print(f"Retry-After: {_show(args.value)}")
        print(f"  invalid       {exc.reason}: {_REASONS.get(exc.reason, str(exc))}")
        print(f"  consequence   {_CONSEQUENCE}")
        print(f"                {details}")
    return EX_FAILED


def _print_parsed(
    args: argparse.Namespace, parsed: RetryAfter, received_at: datetime, date_valid: bool | None
) -> None:
    received_note = "" if args.received_at else " (now)"
    print(f"Retry-After: {_show(args.value)}")
    print(f"  form          {'delay-seconds' if parsed.form == 'seconds' else 'HTTP-date'} ({parsed.form})")
    print(f"  received at   {received_at.isoformat()}{received_note}")
    if args.date is not None:
        if date_valid:
            print(f"  server Date   {_show(args.date)}: {_skew_text(parsed.clock_skew)}")
        else:
            print(f"  server Date   {_show(args.date)}: invalid, ignored")
    if parsed.form == "date":
        basis = "the server's Date" if parsed.clock_skew is not None else "the receipt time"
        print(f"  delay         {_secs(parsed.delay)} (measured against {basis})")
    else:
        print(f"  delay         {_secs(parsed.delay)}")
    print(f"  eligible at   {parsed.eligible_at.isoformat()}")


def _print_decision(args: argparse.Namespace, decision: Decision, received_at: datetime) -> None:
    from ..policy import DEFER

    decided_at = _plus(received_at, decision.wait)
    print(
        f"  policy        max_wait {_limit(args.max_wait)}, deadline {_limit(args.deadline)}, "
        f"elapsed {_secs(args.elapsed)}, local backoff {_secs(args.backoff)}"
    )
    if decision.action != DEFER:
        print(f"  decision      retry after {_secs(decision.wait)} (at {decided_at.isoformat()})")
        return
    if decision.reason == "max_wait":
        why = f"the wait of {_secs(decision.wait)} is longer than max_wait {_limit(args.max_wait)}"
    else:
        why = (
            f"elapsed {_secs(args.elapsed)} + wait {_secs(decision.wait)} is past the deadline "
            f"{_limit(args.deadline)}"
        )
    print(f"  decision      defer ({decision.reason}): {why}")
    when = decided_at.isoformat()
    print(f"                the call returns at once with a deferral; nothing is sent before {when}")


def _decision_dict(decision: Decision, received_at: datetime) -> dict[str, Any]:
    return {
        "action": decision.action,
        "reason": decision.reason,
        "wait": decision.wait,
        "eligible_at": _plus(received_at, decision.wait).isoformat(),
    }


def _describe_action(action: str, reason: str | None, wait: float) -> str:
    if action == "retry":
        return f"retry after {_secs(wait)}"
    return f"{action} ({reason}) for {_secs(wait)}"


def _plus(moment: datetime, seconds: float) -> datetime:
    try:
        return moment + timedelta(seconds=seconds)
    except OverflowError:
        return datetime.max.replace(tzinfo=timezone.utc)


def _secs(value: float) -> str:
    return f"{value:g} s"


def _limit(value: float | None) -> str:
    return "none" if value is None else _secs(value)


def _skew_text(skew: float | None) -> str:
    if skew is None:
        return "no clock skew measured"
    if skew == 0:
        return "the local clock agrees with the server (skew 0 s)"
    side = "ahead of" if skew > 0 else "behind"
    return f"the local clock is {abs(skew):g} s {side} the server (skew {skew:+g} s)"


def _show(value: str) -> str:
    """A value as a quoted, escaped string, shortened past 200 characters."""
    text = json.dumps(value[:200], ensure_ascii=True)
    return text + (" (shortened)" if len(value) > 200 else "")
