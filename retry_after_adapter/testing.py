"""Helpers for testing code that uses retry_after_adapter, and a pytest plugin.

Installed with the package, the plugin is registered through the ``pytest11`` entry
point, so in every test of a project that has the package installed:

- the process-wide default cooldown store is emptied before and after each test, so a
  ``Retry-After: 120`` that one test provokes (under ``responses``, say) never makes a
  later test's request defer without reaching its mock;
- the ``fake_clock`` fixture gives a :class:`~retry_after_adapter.FakeClock`, and
  ``fake_retry(**kwargs)`` a :class:`~retry_after_adapter.RetryAfterRetry` on it: waits
  advance the clock instead of sleeping, and ``fake_clock.sleeps`` lists them.

Turn the plugin off with ``-p no:retry_after_adapter``. Outside pytest, call
:func:`reset_default_store` yourself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .clock import FakeClock
    from .retry import RetryAfterRetry

__all__ = ["fake_clock", "fake_retry", "reset_default_store"]

#: The module of the default store: the plugin imports nothing of the package at
#: start-up (a test run that never uses it pays for nothing), and a store that was
#: never imported holds nothing to forget.
_MEMORY = "retry_after_adapter.cooldown.memory"


def reset_default_store() -> None:
    """Forget every cooldown in the process-wide default store (what adapters and
    pool managers use when given no ``cooldown=``, and what ``memory://`` names)."""
    memory = sys.modules.get(_MEMORY)
    if memory is not None:
        memory.DEFAULT_STORE.clear()


@pytest.fixture(autouse=True)
def _retry_after_adapter_isolated_store() -> Iterator[None]:
    reset_default_store()
    yield
    reset_default_store()


@pytest.fixture
def fake_clock() -> FakeClock:
    """A :class:`FakeClock`: it moves only when told to or when something waits on it."""
    from .clock import FakeClock

    return FakeClock()


@pytest.fixture
def fake_retry(fake_clock: FakeClock) -> Callable[..., RetryAfterRetry]:
    """``fake_retry(**kwargs)``: a ``RetryAfterRetry(clock=fake_clock, **kwargs)``."""

    from .retry import RetryAfterRetry

    def make(**kwargs: Any) -> RetryAfterRetry:
        kwargs.setdefault("clock", fake_clock)
        return RetryAfterRetry(**kwargs)

    return make
