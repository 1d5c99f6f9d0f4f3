"""Architecture adapters, one small module per family, registered by name (see ``base.ADAPTERS``). Every module of
this folder but the shared ones (``SHARED``) is a family's and is imported here, so a new family is its module."""

import importlib
import pkgutil

from .base import ADAPTERS, Adapter, PositionTable, adapter_class, adapter_for, register_adapter

SHARED = {"base", "inputs", "neutral", "quirks"}  # what the families' modules use
for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _m not in SHARED:
        importlib.import_module(f"{__name__}.{_m}")  # registration: @register_adapter in the module

__all__ = ["ADAPTERS", "Adapter", "PositionTable", "adapter_class", "adapter_for", "register_adapter"]
