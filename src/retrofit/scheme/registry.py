"""``SCHEMES``: the schemes by name, as the catalog (``foundation/catalog.py``) declares them, each module imported
on first use. A new scheme is its module and one catalog line."""

from __future__ import annotations

import importlib

from ..foundation import catalog
from .kinds import Scheme


class Schemes:
    """The schemes by name (``foundation.catalog``), each class imported on first use: ``get(name)``, ``names()``,
    ``items()`` (imports every one), ``name in SCHEMES``."""

    def get(self, name: str) -> type["Scheme"]:
        module = importlib.import_module(catalog.module_of(name))  # an unknown name: UnknownSchemeError
        found = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, Scheme)]
        found = [c for c in found if c.__module__ == module.__name__]  # its own, not one it imports
        leaves = [c for c in found if not any(o is not c and issubclass(o, c) for o in found)]  # not a helper base
        if len(leaves) != 1:
            names = ", ".join(c.__name__ for c in leaves) or "none"
            raise TypeError(f"{module.__name__} must define one scheme class for {name!r}; it defines {names}")
        return leaves[0]

    def names(self) -> list[str]:
        return sorted(catalog.CATALOG)

    def items(self) -> list[tuple[str, type["Scheme"]]]:
        return [(n, self.get(n)) for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in catalog.CATALOG


SCHEMES = Schemes()
