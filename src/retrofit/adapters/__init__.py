"""Architecture adapters, one small module per family, registered by name (see ``base.ADAPTERS``)."""

from . import (  # noqa: F401  (registration)
    bert,
    bloom,
    falcon,
    gpt2,
    gpt_bigcode,
    gpt_neo,
    gpt_neox,
    gptj,
    llama,
    mpt,
    opt,
)
from .base import ADAPTERS, Adapter, PositionTable, adapter_class, adapter_for, register_adapter

__all__ = ["ADAPTERS", "Adapter", "PositionTable", "adapter_class", "adapter_for", "register_adapter"]
