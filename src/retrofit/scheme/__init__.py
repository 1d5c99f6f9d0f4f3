"""Positional schemes, one module each, named in the catalog (``foundation/catalog.py``) and imported on first use
through ``SCHEMES`` (``registry.py``); each subclasses the base of its kind (``kinds.py``, over the root ``Scheme`` of
``root.py``), whose ``prepare`` turns a call's ``Site`` (``site.py``) into the kernels' ``Term`` (``kernels/call.py``). A
scheme's options: ``options.py``; what it knows of the model: ``ModelSpec`` (``spec.py``)."""

from ..kernels.call import Term
from .kinds import AbsoluteScheme, BiasScheme, NoneScheme, RelativeScheme, RotaryScheme, Scheme
from .registry import SCHEMES
from .site import Site
from .spec import ModelSpec

SHARED = {"kinds", "options", "registry", "site", "spec"}  # what the schemes' modules share: no scheme's

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
