"""Architecture adapters, one small module per family, registered by name (see ``base.ADAPTERS``): a family is its
module and one line of ``FAMILIES`` (its name, the module's; the module defines one ``Adapter`` subclass). The other
modules of this folder (``SHARED``) are what the families' modules use."""

from .base import ADAPTERS, Adapter, PositionTable, adapter_class, adapter_for, register_adapter, register_family

FAMILIES = (  # one line each: a family's name and module (adapters/<name>.py)
    "bert",
    "bloom",
    "falcon",
    "gpt2",
    "gpt_bigcode",
    "gpt_neo",
    "gpt_neox",
    "gptj",
    "llama",
    "mpt",
    "opt",
)
SHARED = ("base", "inputs", "neutral", "quirks")  # what the families' modules use
for _name in FAMILIES:
    register_family(_name)

__all__ = ["ADAPTERS", "FAMILIES", "Adapter", "PositionTable", "adapter_class", "adapter_for", "register_adapter"]
