"""``SCHEMES``: the schemes by name, as the catalog (``foundation/catalog.py``) declares them, each module imported
on first use. A new scheme is its module and one catalog line."""

from __future__ import annotations

from ..foundation import catalog
from ..foundation.registry import part_class
from .kinds import Scheme


class Schemes:
    """The schemes by name (``foundation.catalog``), each class imported on first use: ``get(name)``, ``names()``,
    ``items()`` (imports every one), ``name in SCHEMES``."""

    def get(self, name: str) -> type["Scheme"]:
        return part_class(catalog.module_of(name), Scheme, repr(name))  # an unknown name: UnknownSchemeError

    def names(self) -> list[str]:
        return sorted(catalog.CATALOG)

    def items(self) -> list[tuple[str, type["Scheme"]]]:
        return [(n, self.get(n)) for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in catalog.CATALOG


SCHEMES = Schemes()
