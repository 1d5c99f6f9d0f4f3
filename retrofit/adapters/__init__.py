"""Architecture adapters, one small module per family, registered by name (see ``base.ADAPTERS``)."""

from . import gpt2, llama  # noqa: F401  (registration)
from . import gpt_neo  # noqa: F401
from . import opt  # noqa: F401
from . import gpt_neox  # noqa: F401
from .base import ADAPTERS, Adapter, adapter_for, register_adapter

__all__ = ["ADAPTERS", "Adapter", "adapter_for", "register_adapter"]
