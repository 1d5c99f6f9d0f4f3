"""The export mappings are said in one place, ``native_export.CATALOG``: ``MAPPINGS`` is filled from it and
docs/export.md's table is what it renders (``base.table``); the package's docstring lists none of its own."""

from __future__ import annotations

import re
from pathlib import Path

from retrofit import native_export
from retrofit.native_export import CATALOG, MAPPINGS
from retrofit.native_export.base import table

DOC = Path(__file__).resolve().parents[2] / "docs" / "export.md"


def test_the_docs_table_is_what_the_catalog_renders():
    rendered = table(CATALOG)
    assert rendered in DOC.read_text(), (
        "docs/export.md's mappings table differs from native_export.CATALOG; paste this:\n" + rendered
    )


def test_mappings_are_the_catalog_lines_pairs():
    pairs = [pair for line in CATALOG for pair in line.pairs()]
    assert sorted(pairs) == MAPPINGS.names() and len(set(pairs)) == len(pairs)
    assert "gpt2+alibi" in MAPPINGS and MAPPINGS.get("gpt2+alibi").target == "FalconForCausalLM"
    assert {"bert+extend", "opt+nope", "gpt_bigcode+sinusoidal"} <= set(MAPPINGS.names())  # every learned table


def test_the_package_docstring_points_to_the_catalog_and_lists_no_pair():
    doc = native_export.__doc__
    listed = re.findall(r"^\s+[a-z0-9_| ]+\+ *[a-z]+.*->", doc, re.M)  # "gpt2 | opt + nope -> ..." lines
    assert "CATALOG" in doc and not listed, listed
