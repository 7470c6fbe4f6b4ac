"""The store failure policy: a shared store that fails never crashes a call.

:class:`GuardedStore` wraps any :class:`CooldownStore`. Every cooldown is also kept in a
local in-process copy, so while the shared store is unreachable a cooldown this process
learned is never forgotten and never shortened. One warning is logged when an outage
starts and one line when it ends, not one per request.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any

from ..errors import ConfigurationError, CooldownUnavailable
from .base import CooldownStore
from .memory import MemoryCooldownStore

#: "Not given": an adapter or pool manager without ``cooldown=`` uses the process-wide
#: default store.
DEFAULT: Any = type("_Default", (), {"__repr__": lambda self: "DEFAULT"})()


def check_store_failure(value: object) -> str:
    """Validate a ``store_failure`` argument: ``"open"`` or ``"closed"``."""
    if value not in ("open", "closed"):
        raise ConfigurationError("store_failure must be 'open' or 'closed'")
    return str(value)


def failure_layer(cooldown: object, store_failure: str) -> CooldownStore | None:
    """The store a call talks to for ``cooldown`` (None: no sharing): a memory store
    as it is when failing open (it cannot fail), else a :class:`GuardedStore`."""
    if cooldown is None:
        return None
    if not isinstance(cooldown, CooldownStore):
        raise ConfigurationError("cooldown must be a CooldownStore (get and extend) or None")
    if isinstance(cooldown, MemoryCooldownStore) and store_failure == "open":
        return cooldown
    return GuardedStore(cooldown, fail_closed=store_failure == "closed")

log = logging.getLogger("retry_after_adapter")


class GuardedStore:
    """Fail-open (default) or fail-closed wrapper around a shared store.

    - fail open: on a store error ``get`` returns the local copy and ``extend`` keeps
      the time locally; requests go on.
    - fail closed (``fail_closed=True``): ``get`` raises :class:`CooldownUnavailable`
      while the store fails, and the adapter defers with reason ``"cooldown-unknown"``.
    """

    def __init__(self, inner: CooldownStore, *, fail_closed: bool = False) -> None:
        self.inner = inner
        self.fail_closed = fail_closed
        self._local = MemoryCooldownStore()
        self._lock = threading.Lock()
        self._down = False
        self.outages = 0

    def get(self, scope: str) -> datetime | None:
        local = self._local.get(scope)
        try:
            remote = self.inner.get(scope)
        except Exception as exc:
            self._failed(exc)
            if self.fail_closed:
                raise CooldownUnavailable("the shared cooldown store is unavailable") from None
            return local
        self._healthy()
        if remote is None or (local is not None and local > remote):
            return local
        return remote

    def extend(self, scope: str, until: datetime) -> datetime:
        local = self._local.extend(scope, until)
        try:
            remote = self.inner.extend(scope, until)
        except Exception as exc:
            self._failed(exc)
            return local
        self._healthy()
        return max(local, remote)

    @property
    def down(self) -> bool:
        """Whether the last store operation failed."""
        return self._down

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            if self._down:
                return
            self._down = True
            self.outages += 1
        log.warning(
            "cooldown store %s failed (%s); %s until it recovers",
            type(self.inner).__name__,
            type(exc).__name__,
            "deferring calls" if self.fail_closed else "keeping cooldowns in this process",
            extra={"store": type(self.inner).__name__, "error": type(exc).__name__},
        )

    def _healthy(self) -> None:
        if not self._down:
            return
        with self._lock:
            if not self._down:
                return
            self._down = False
        log.info("cooldown store %s recovered", type(self.inner).__name__)

    def __repr__(self) -> str:
        return f"GuardedStore({self.inner!r}, fail_closed={self.fail_closed})"
