"""Positional schemes, one module each, named in the catalog (``foundation/catalog.py``) and imported on first use
through ``SCHEMES``."""

from .base import SCHEMES, ModelSpec, Scheme

__all__ = ["SCHEMES", "ModelSpec", "Scheme"]
