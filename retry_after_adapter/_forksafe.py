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

__all__ = ["ForkSafe", "at_fork", "forked_child", "register"]


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


#: The process that imported the package: a forked child of it has another id.
_IMPORTED_IN = os.getpid()


def forked_child() -> bool:
    """Whether this process is a forked child of the one that imported the package (a
    ``multiprocessing`` or Celery prefork worker, which may end by ``os._exit`` right
    after a call: what it gives back must be written before the call returns)."""
    return os.getpid() != _IMPORTED_IN


def _in_child() -> None:
    for hook in _HOOKS:
        hook()
    for owner in list(_OWNERS):
        owner._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
