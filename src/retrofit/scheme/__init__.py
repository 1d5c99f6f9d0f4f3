"""Positional schemes, one module each, named in the catalog (``foundation/catalog.py``) and imported on first use
through ``SCHEMES``; each subclasses the base of its kind (``base.py``), whose ``prepare`` gives the kernels its term."""

from .base import (
    SCHEMES,
    AbsoluteScheme,
    BiasScheme,
    ModelSpec,
    NoneScheme,
    RelativeScheme,
    RotaryScheme,
    Scheme,
    Site,
    Term,
)

__all__ = [
    "SCHEMES",
    "AbsoluteScheme",
    "BiasScheme",
    "ModelSpec",
    "NoneScheme",
    "RelativeScheme",
    "RotaryScheme",
    "Scheme",
    "Site",
    "Term",
]
