"""The pytest plugin of retry_after_adapter.

Installed with the package, it is registered through the ``pytest11`` entry point (named
``retry_after_adapter``), so in every test of a project that has the package installed:

- the process-wide default cooldown store is emptied before and after each test, so a
  ``Retry-After: 120`` that one test provokes (under ``responses``, say) never makes a
  later test's request defer without reaching its mock;
- the ``fake_clock`` fixture gives a :class:`~retry_after_adapter.FakeClock`, and
  ``fake_retry(**kwargs)`` a :class:`~retry_after_adapter.RetryAfterRetry` on it: waits
  advance the clock instead of sleeping, and ``fake_clock.sleeps`` lists them.

Turn the plugin off with ``-p no:retry_after_adapter``. Outside pytest, call
:func:`~retry_after_adapter.testing.reset_default_store` yourself.

pytest loads this module in every test run of a project that has the package installed,
so it imports nothing of the package at start-up: the fixtures import what they give
when a test asks for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ._store import reset_default_store

if TYPE_CHECKING:
    from ..clock import FakeClock
    from ..retry import RetryAfterRetry

__all__ = ["fake_clock", "fake_retry", "reset_default_store"]


@pytest.fixture(autouse=True)
def _retry_after_adapter_isolated_store() -> Iterator[None]:
    reset_default_store()
    yield
    reset_default_store()


@pytest.fixture
def fake_clock() -> FakeClock:
    """A :class:`FakeClock`: it moves only when told to or when something waits on it."""
    from ..clock import FakeClock

    return FakeClock()


@pytest.fixture
def fake_retry(fake_clock: FakeClock) -> Callable[..., RetryAfterRetry]:
    """``fake_retry(**kwargs)``: a ``RetryAfterRetry(clock=fake_clock, **kwargs)``."""

    from ..retry import RetryAfterRetry

    def make(**kwargs: Any) -> RetryAfterRetry:
        kwargs.setdefault("clock", fake_clock)
        return RetryAfterRetry(**kwargs)

    return make
