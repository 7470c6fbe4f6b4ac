"""Test utilities for code that uses retry_after_adapter.

- :class:`QuotaServer`: a throttling HTTP server on 127.0.0.1 that enforces one shared
  quota per window and answers 429 with a Retry-After (see
  ``retry_after_adapter.testing.server``);
- :class:`ScenarioServer`: a loopback HTTP server whose answers follow a script of
  phases over time (healthy, every n-th throttled, a deploy's 503s, a 429 storm, fixed
  and sliding windows; see ``retry_after_adapter.testing.scenarios``);
- :class:`RedisServer` and :class:`RedisCluster`: a real ``redis-server`` (or a 3-node
  Redis Cluster) on a free loopback port, in a temporary directory, stopped on leaving
  its ``with`` block (see ``retry_after_adapter.testing.redis``);
- :class:`FakeClock`: a clock that moves only when told to or when something waits on
  it (the same class as ``retry_after_adapter.FakeClock``);
- :func:`reset_default_store`: forget every cooldown in the process-wide default store;
- ``retry_after_adapter.testing.conformance.StoreContract``: the contract tests every
  store of the package passes, for a store of your own (subclass it with a ``store``
  fixture);
- the pytest plugin (``retry_after_adapter.testing.plugin``), which pytest loads by
  itself: the ``fake_clock`` and ``fake_retry`` fixtures, and the default store emptied
  around each test (``-p no:retry_after_adapter`` turns it off).

Importing this package imports nothing else: each name is imported on first use, and
pytest only with the plugin's fixtures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _lazy

if TYPE_CHECKING:
    from ..clock import FakeClock
    from ._store import reset_default_store
    from .plugin import fake_clock as fake_clock
    from .plugin import fake_retry as fake_retry
    from .redis import RedisCluster, RedisServer
    from .scenarios import ScenarioServer
    from .server import QuotaServer

#: This package was the plugin module before the plugin had a module of its own: loaded
#: as a plugin under its old name (an install whose entry point metadata predates the
#: move, or ``-p retry_after_adapter.testing``), it loads the plugin.
pytest_plugins = ["retry_after_adapter.testing.plugin"]

#: Where each name lives, imported on first use.
_WHERE: dict[str, str] = {
    "FakeClock": "..clock",
    "QuotaServer": ".server",
    "RedisCluster": ".redis",
    "RedisServer": ".redis",
    "fake_clock": ".plugin",
    "fake_retry": ".plugin",
    "reset_default_store": "._store",
    "ScenarioServer": ".scenarios",
}

__all__ = ["FakeClock", "QuotaServer", "RedisCluster", "RedisServer", "ScenarioServer", "reset_default_store"]


# No ``__dir__`` that lists these names: pytest and pluggy look up every name ``dir()``
# gives of a module loaded as a plugin (see ``pytest_plugins``), which would import them.
def __getattr__(name: str) -> Any:
    return _lazy.load(__name__, _WHERE, name)
