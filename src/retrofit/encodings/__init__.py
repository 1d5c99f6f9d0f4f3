"""Positional schemes, one module each, registered by name (see ``base.SCHEMES``)."""

from . import (  # noqa: F401  (registration)  # noqa: F401
    alibi,
    extend,  # noqa: F401
    fire,  # noqa: F401
    nezha,
    nope,  # noqa: F401
    rope,
    shaw,  # noqa: F401
    sinusoidal,  # noqa: F401
    t5,  # noqa: F401
    xl,
)
from .base import SCHEMES, ModelSpec, Scheme, register_scheme

__all__ = ["SCHEMES", "ModelSpec", "Scheme", "register_scheme"]
