"""``export()``'s keywords are one record (``ExportOptions``: defaults and help): an unknown keyword is a TypeError
naming the valid ones, said before the model is read; ``retrofit export``'s flags are its fields."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from retrofit.cli import build_parser
from retrofit.native_export import TOLERANCE, ExportOptions, export


def test_an_unknown_keyword_is_a_type_error_naming_the_valid_ones_before_anything_is_read(tmp_path):
    with pytest.raises(TypeError) as e:  # the folder does not exist: reading it would be a RetrofitError
        export(tmp_path / "no-such-run", tmp_path / "out", native=True, max_lenght=4096)
    said = str(e.value)
    assert "'max_lenght'" in said and all(f.name in said for f in dataclasses.fields(ExportOptions))
    assert not (tmp_path / "out").exists()


def test_the_record_holds_the_documented_defaults_and_the_flags_are_its_fields():
    o = ExportOptions()
    assert (o.max_length, o.check_length, o.approximate, o.tolerance, o.ppl_text) == (
        None,
        None,
        False,
        TOLERANCE,
        "stdlib",
    )
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {a.dest for a in sub.choices["export"]._actions}
    assert {f.name for f in dataclasses.fields(ExportOptions)} - flags == {"tolerance"}  # the one not a flag
