"""Positional schemes, one module each, registered by name (see ``base.SCHEMES``)."""

from . import alibi, rope  # noqa: F401  (registration)
from . import t5  # noqa: F401
from . import shaw  # noqa: F401
from . import nope  # noqa: F401
from . import sinusoidal  # noqa: F401
from . import fire  # noqa: F401
from . import xl, nezha  # noqa: F401
from . import extend  # noqa: F401
from .base import SCHEMES, ModelSpec, Scheme, register_scheme

__all__ = ["SCHEMES", "ModelSpec", "Scheme", "register_scheme"]
