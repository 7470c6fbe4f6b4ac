"""Module attributes imported on first use (a module ``__getattr__``, PEP 562)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["load"]


def load(module: str, where: Mapping[str, str], name: str) -> Any:
    """Attribute ``name`` of ``module``, imported from the module ``where[name]`` (relative
    to ``module``) and kept in ``module``, so that the next look-up is a plain global.
    AttributeError for a name ``where`` does not have."""
    source = where.get(name)
    if source is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source, module), name)
    setattr(sys.modules[module], name, value)
    return value
