"""Name -> object registries that fail loudly, and the one way a part registers.

A part (a scheme, an architecture adapter, a kernel, an export mapping) is its module and one line in its folder's
catalog (``foundation/catalog.py`` for the schemes, ``adapters.FAMILIES``, ``kernels.KERNELS``,
``native_export.MAPPINGS``): the line names the module, which the catalog imports (``part_class`` finds the class
a module defines); no decorator, no hand-written import line. ``Registry.get(name)`` raises an error that lists
every registered name when the name is unknown.
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, TypeVar

from .errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, error: type[UnknownNameError] = UnknownNameError):
        self.kind = kind
        self.error = error
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        if not isinstance(name, str):
            raise self.error(f"{self.kind} must be a string, got {type(name).__name__}")
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise self.error(f"unknown {self.kind} {name!r}; registered: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def items(self):
        return sorted(self._items.items())

    def __contains__(self, name: object) -> bool:
        return name in self._items


def part_class(module: str, base: type, what: str) -> type:
    """The one subclass of ``base`` that ``module`` (a dotted name, imported here) defines itself (not one it imports,
    not a helper base of another it defines); TypeError naming them otherwise."""
    loaded = importlib.import_module(module)
    found = [c for c in vars(loaded).values() if isinstance(c, type) and issubclass(c, base) and c is not base]
    found = [c for c in found if c.__module__ == loaded.__name__]
    leaves = [c for c in found if not any(o is not c and issubclass(o, c) for o in found)]
    if len(leaves) != 1:
        names = ", ".join(c.__name__ for c in leaves) or "none"
        raise TypeError(f"{module} must define one {base.__name__} subclass for {what}; it defines {names}")
    return leaves[0]
