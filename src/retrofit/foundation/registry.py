"""Name -> object registries that fail loudly.

``Registry.register(name)`` is a decorator; ``Registry.get(name)`` raises an error that
lists every registered name when the name is unknown.
"""

from __future__ import annotations

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
