"""Architecture adapters, one small module per family, registered by name (see ``base.ADAPTERS``)."""

from . import gpt2, llama  # noqa: F401  (registration)
from .base import ADAPTERS, Adapter, adapter_for, register_adapter

__all__ = ["ADAPTERS", "Adapter", "adapter_for", "register_adapter"]
