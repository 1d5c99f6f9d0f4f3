"""Positional schemes, one module each, registered by name (see ``base.SCHEMES``)."""

from . import alibi, rope  # noqa: F401  (registration)
from .base import SCHEMES, ModelSpec, Scheme, register_scheme

__all__ = ["SCHEMES", "ModelSpec", "Scheme", "register_scheme"]
