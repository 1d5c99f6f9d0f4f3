"""A document of text: what every data source yields (``retrofit.data.specs``, ``retrofit.models.assets``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Document:
    name: str
    text: str
