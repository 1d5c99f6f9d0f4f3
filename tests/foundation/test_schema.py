"""``schema.check_limits``: the ranges a configuration's fields declare in their metadata, checked in one place."""

from __future__ import annotations

import dataclasses
from typing import Optional

import pytest

from retrofit.foundation.errors import OptionError, RecipeError
from retrofit.foundation.schema import check_limits, field_help


@dataclasses.dataclass
class Inner:
    rate: float = field_help("a fraction", 0.5, above=0, below=1)


@dataclasses.dataclass
class Outer:
    steps: int = field_help("positive", 1, above=0)
    every: int = field_help("non-negative", 0, minimum=0)
    share: float = field_help("in [0, 1)", 0.0, minimum=0, below=1)
    cap: Optional[int] = field_help("unset or positive", None, above=0)
    inner: Inner = field_help("nested", factory=Inner)


@pytest.mark.parametrize(
    "change, said",
    [
        ({"steps": 0}, "'steps' must be > 0, got 0"),
        ({"every": -1}, "'every' must be >= 0, got -1"),
        ({"share": 1.0}, "'share' must be in [0, 1), got 1.0"),
        ({"cap": 0}, "'cap' must be > 0, got 0"),
        ({"inner": Inner(rate=1)}, "'inner.rate' must be in (0, 1), got 1"),
        ({"steps": 2.5}, "'steps' must be an integer, got 2.5"),
        ({"steps": True}, "'steps' must be a number, got True"),
    ],
)
def test_a_value_outside_its_fields_limits_is_refused_naming_the_key(change, said):
    with pytest.raises(RecipeError) as e:
        check_limits(dataclasses.replace(Outer(), **change))
    assert str(e.value) == said


def test_defaults_and_unset_keys_pass_and_the_caller_words_its_error():
    check_limits(Outer())  # defaults within; cap None has no limit
    with pytest.raises(OptionError, match=r"^calibrate: steps must be > 0, got 0$"):
        check_limits(Outer(steps=0), error=OptionError, key="calibrate: {}")
