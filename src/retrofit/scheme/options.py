"""Scheme options: ``option`` (a field with help text and allowed values), the options every scheme takes
(``CommonOptions``: they act on the logits, not on the positions) and the one way an option's value is checked
(``check_type``, through ``foundation.schema.check``)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from ..foundation.errors import OptionError
from ..foundation.schema import UNIONS, Mismatch, check, field_help, help_of
from .spec import ModelSpec


def option(default, help: str, choices: tuple | None = None):
    """A dataclass field with help text (and allowed values) for a scheme option: ``schema.field_help``, in
    the argument order docs/CORE_API.md gives scheme authors."""
    return field_help(help, default, **({"choices": choices} if choices else {}))


@dataclass
class CommonOptions:
    """Options every scheme takes: they act on the attention logits rather than on the positions."""

    temperature: float = option(
        0.0,
        "length-aware softmax temperature beta (every scheme): the logits of the query at position i are "
        "multiplied by 1 + beta * ln(max(1, (i + 1) / temperature_length)); 0 = off",
    )
    temperature_length: int | None = option(None, "where the temperature starts growing (default: the native length)")
    qk_norm: bool = option(
        False,
        "RMSNorm on each head's q and k before the positions act (learned gains, started at the RMS of q and k "
        "measured by a calibration pass at the native length, so the scores start close to the original's)",
    )


COMMON_OPTIONS = tuple(f.name for f in dataclasses.fields(CommonOptions))


def common_option_help() -> dict[str, str]:
    return help_of(CommonOptions)


def common_defaults(spec: ModelSpec | None = None) -> dict[str, Any]:
    """The common options' values when not given (temperature_length: the model's native length)."""
    out = dataclasses.asdict(CommonOptions())
    if spec is not None:
        out["temperature_length"] = spec.native_length
    return out


def parse_common(spec: ModelSpec, given: dict[str, Any]) -> tuple[CommonOptions, dict[str, Any]]:
    """Split the common options out of ``given``; returns (CommonOptions, the scheme's own options)."""
    fields = {f.name: f for f in dataclasses.fields(CommonOptions)}
    hints = typing.get_type_hints(CommonOptions)
    values = {k: check_type("(every scheme)", k, v, hints[k], None) for k, v in given.items() if k in fields}
    common = CommonOptions(**values)
    if common.temperature_length is None:
        common.temperature_length = spec.native_length
    if common.temperature < 0:
        raise OptionError(f"option 'temperature' must be >= 0; got {common.temperature}")
    if common.temperature_length <= 0:
        raise OptionError(f"option 'temperature_length' must be > 0; got {common.temperature_length}")
    return common, {k: v for k, v in given.items() if k not in fields}


def check_type(scheme: str, key: str, value, hint, choices):
    """``value`` for the option ``key`` of ``scheme``, by ``schema.check`` (no numeric strings: a float option
    takes a number), a mismatch worded as an option's."""
    try:
        return check(value, hint, choices=choices, float_strings=False)
    except Mismatch as m:
        if m.choices:
            words = f"must be one of {', '.join(m.choices)}; got {value!r}"
        else:
            members = typing.get_args(hint) if typing.get_origin(hint) in UNIONS else (hint,)
            names = " or ".join(getattr(t, "__name__", str(t)) for t in members if t is not type(None))
            words = f"must be {names}; got {value!r} ({type(value).__name__})"
    raise OptionError(f"option {key!r} of scheme {scheme!r} {words}")
