"""Cooldown stores: where workers share a scope's next eligible time."""

from __future__ import annotations

from .base import CooldownStore
from .memory import MemoryCooldownStore

__all__ = ["CooldownStore", "MemoryCooldownStore"]
