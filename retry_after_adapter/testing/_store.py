"""Emptying the process-wide default cooldown store without importing it."""

from __future__ import annotations

import sys

__all__ = ["reset_default_store"]

#: The module of the default store: nothing here imports it (a test run that never uses
#: it pays for nothing), and a store that was never imported holds nothing to forget.
_MEMORY = "retry_after_adapter.cooldown.memory"


def reset_default_store() -> None:
    """Forget every cooldown in the process-wide default store (what adapters and
    pool managers use when given no ``cooldown=``, and what ``memory://`` names)."""
    memory = sys.modules.get(_MEMORY)
    if memory is not None:
        memory.DEFAULT_STORE.clear()
