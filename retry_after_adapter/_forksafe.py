"""Locks a forked child finds free.

``fork()`` copies a process with one thread: a lock that another thread of the parent
held at that moment stays held in the child for good, and the child's first call that
needs it never returns. Every object of the package that owns a lock registers here and
gets :meth:`ForkSafe._after_fork` called in the child, where it makes new locks (and
drops whatever else belongs to the parent: helper threads, executors). Module-level
locks are remade by :func:`at_fork`.

The state a lock guarded is kept: each mutation under it is a few dict or deque
operations, each atomic under the GIL, so nothing is half-written.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = ["ForkSafe", "at_fork", "register"]


class ForkSafe(Protocol):
    """An object that owns locks: ``_after_fork`` makes new ones in a forked child."""

    def _after_fork(self) -> None: ...


_OWNERS: weakref.WeakSet[ForkSafe] = weakref.WeakSet()
_HOOKS: list[Callable[[], None]] = []


def register(owner: ForkSafe) -> None:
    """Have ``owner._after_fork()`` called in every forked child while it lives."""
    _OWNERS.add(owner)


def at_fork(hook: Callable[[], None]) -> None:
    """Have ``hook()`` called in every forked child (for module-level locks)."""
    _HOOKS.append(hook)


def _in_child() -> None:
    for hook in _HOOKS:
        hook()
    for owner in list(_OWNERS):
        owner._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
