"""The engine: one loop runs every call, one step judges every attempt.

A newcomer reads it in this order (each module one concern, higher ones import lower):

- ``override``: ``budget()``, the limits a caller sets around calls (a context variable).
- ``state``: the records a call is made of (``Terms``, ``Progress``, ``Ticket``,
  ``Heard``, ``Slot``), the ``Policy`` settings the engine reads of a
  ``RetryAfterRetry``, and ``CallState``, what the plan reads of a call.
- ``meters``: this process's attempts per scope (for quota headers).
- ``buckets``: what providers' dialects teach a plan (Discord's routes, GitHub's
  secondary-limit streaks), kept per plan.
- ``plan``: :class:`Plan`, what every call of one adapter needs that does not change
  per call (the store, the quota, the cap), worked out once; the store operations a
  call makes through it (one per attempt for admission).
- ``call``: :class:`Call`, one call's state (time, counts, what the server said) and
  its deferrals.
- ``learn``: what an answer teaches (Retry-After, quota headers, freshness, a route's
  bucket).
- ``verdict``: :func:`judge`, learn, count as urllib3 does, then the pure policy decides.
- ``admission``: :func:`admitted` and :func:`admit_slowly`, before every attempt: take
  what it needs, or wait, or defer.
- ``ops``: what the engine asks its drivers to do, as typed values (``Sleep``,
  ``Send``, ``Keep``, ``Close``, ``Follow``; the store's ``Admit``, ``ReadCooldown``,
  ``Settle``, ``Judge``).
- ``loop``: :func:`steps`, admit, send one attempt, judge, then the slow path, written
  once as a generator that does no I/O: it asks its driver for each wait, each
  transport operation and each store operation;
  :func:`run` drives it here (requests, urllib3, httpx), ``httpx`` drives it on an
  event loop.
"""

from __future__ import annotations

# The engine's interface to the front ends (requests, urllib3, httpx, httpx2), the
# policy's stock-loop mode and the settings: what they import of it, nothing more.
from .admission import STORE_STEPS, admitted, carry_out_store, drive, wait_until
from .call import MIN_ATTEMPT_TIMEOUT, Call
from .learn import refine_call, refine_gemini
from .loop import SINGLE_ATTEMPT, Outcome, judge_redirect, run, steps
from .ops import Close, Follow, Keep, Op, Send, Sleep, StoreOp
from .override import budget, current_override
from .plan import Plan
from .state import Heard, Policy, Terms
from .verdict import REDIRECT, Verdict, judge, plan_wait

__all__ = [
    "MIN_ATTEMPT_TIMEOUT",
    "REDIRECT",
    "SINGLE_ATTEMPT",
    "STORE_STEPS",
    "Call",
    "Close",
    "Follow",
    "Heard",
    "Keep",
    "Op",
    "Outcome",
    "Plan",
    "Policy",
    "Send",
    "Sleep",
    "StoreOp",
    "Terms",
    "Verdict",
    "admitted",
    "budget",
    "carry_out_store",
    "current_override",
    "drive",
    "judge",
    "judge_redirect",
    "plan_wait",
    "refine_call",
    "refine_gemini",
    "run",
    "steps",
    "wait_until",
]
