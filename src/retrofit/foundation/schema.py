"""One strict loader for every typed configuration: recipes, pipeline sections, ``key=value`` pairs.

A configuration is a dataclass whose fields carry ``metadata={"help": ...}`` (``field_help``, the one
maker of such fields: recipes, evaluation options, scheme options). Loading is strict: an unknown key
(with a "did you mean"), a missing mapping or a value of the wrong type raises the caller's error class
(``RecipeError`` by default) naming the dotted key. YAML 1.1 quirks are handled (``2e-4`` read as a
string, a bare ``no`` read as false). ``check`` is the one type checker, also of scheme options
(``scheme.options``), which word a mismatch their own way.

    section = build(EvalSection, {"budget": 4096}, prefix="eval.")
    raw = read_yaml("recipes/x.yaml"); apply_overrides(raw, ["train.steps=200"])
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from dataclasses import field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from .errors import RecipeError

MISSING = dataclasses.MISSING


UNIONS = (Union, types.UnionType)  # Optional[X] / Union[X, Y], and X | Y


def field_help(text: str, default=MISSING, factory=MISSING, **meta):
    """A dataclass field with help text (``factory`` for mutable defaults); ``meta``: more of its metadata
    (a scheme option's ``choices``, an evaluation option's command-line ``flag``)."""
    if factory is not MISSING:
        return field(default_factory=factory, metadata={"help": text, **meta})
    return field(default=default, metadata={"help": text, **meta})


def help_of(cls) -> dict[str, str]:
    """{field: its help text} of a dataclass whose fields were made by ``field_help``."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def from_keywords(cls, given: dict, call: str, base=None, error=TypeError):
    """``base`` (default: ``cls()``) with a function's keywords ``given`` set, ``cls`` the record of that function's
    keywords (``call``: its name, for the message); an unknown keyword is ``error`` (default: the TypeError of a
    call) naming the valid ones."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise error(
            f"{call}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; valid: {', '.join(names)}"
        )
    return dataclasses.replace(base if base is not None else cls(), **given)


def read_yaml(path: str | Path, what: str = "recipe", error=RecipeError) -> dict:
    """A YAML mapping from ``path`` (an empty file is ``{}``)."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} file {str(path)!r} not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise error(f"{what} {path} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise error(f"a {what} must be a mapping of keys, got {type(raw).__name__}")
    if what == "recipe" and {"recipe", "schemes"} <= set(raw):
        raise error(
            f"{path} is a study grid (it has 'recipe' and 'schemes'), not a recipe; run it with: retrofit study {path}"
        )
    return raw


# ---- schema walking (used by --help) -------------------------------------------------------
def iter_keys(cls, prefix: str = ""):
    """Yield (dotted key, type string, default, help) for every leaf key of the schema."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from iter_keys(tp, key + ".")
            continue
        default = f.default if f.default is not MISSING else f.default_factory()
        yield key, type_name(tp), default, f.metadata.get("help", "")


def type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(str(a) for a in typing.get_args(tp))
    if origin in UNIONS:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        name = " | ".join(type_name(a) for a in args)
        return name + (" | null" if type(None) in typing.get_args(tp) else "")
    return getattr(tp, "__name__", str(tp))


# ---- limits declared on the fields -----------------------------------------------------------
LIMITS = ("minimum", "above", "below")  # a field's metadata: value >= minimum, value > above, value < below


def check_limits(obj, prefix: str = "", error=RecipeError, key: str = "'{}'") -> None:
    """The limits every field of dataclass ``obj`` declares in its metadata (``minimum``, ``above``, ``below``:
    ``field_help(..., minimum=0)``), nested sections included; a value outside them raises ``error`` naming the
    dotted key (``key`` words it: "'{}'" quotes it). A None (an optional key left unset) has no limit. The one
    place a configuration's ranges are checked."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, name = getattr(obj, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            check_limits(value, name + ".", error, key)
            continue
        bounds = {k: f.metadata[k] for k in LIMITS if k in f.metadata}
        if not bounds or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise error(f"{key.format(name)} must be a number, got {value!r}")
        if int in _members(hints[f.name]) and float not in _members(hints[f.name]) and not isinstance(value, int):
            raise error(f"{key.format(name)} must be an integer, got {value!r}")
        if not _within(value, bounds):
            raise error(f"{key.format(name)} must be {_range_words(bounds)}, got {value}")


def _members(tp) -> tuple:
    return typing.get_args(tp) if typing.get_origin(tp) in UNIONS else (tp,)


def _within(value, bounds: dict) -> bool:
    return (
        value >= bounds.get("minimum", value)
        and ("above" not in bounds or value > bounds["above"])
        and ("below" not in bounds or value < bounds["below"])
    )


def _range_words(bounds: dict) -> str:
    """'>= 0', '> 0', 'in [0, 1)', 'in (0, 1)'."""
    low = f"[{bounds['minimum']}" if "minimum" in bounds else f"({bounds['above']}" if "above" in bounds else None
    if "below" in bounds:
        return f"in {low}, {bounds['below']})"
    return f">= {bounds['minimum']}" if "minimum" in bounds else f"> {bounds['above']}"


# ---- strict construction -------------------------------------------------------------------
def build(cls, raw: Any, prefix: str = "", error=RecipeError):
    """An instance of dataclass ``cls`` from the mapping ``raw``, strictly (see the module doc)."""
    where = prefix.rstrip(".") or "recipe"
    if not isinstance(raw, dict):
        raise error(f"'{where}' must be a mapping, got {type(raw).__name__} ({raw!r})")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = (
                f"; did you mean '{prefix}{close[0]}'?"
                if close
                else f"; known keys: {', '.join(prefix + n for n in names)}"
            )
            raise error(f"unknown recipe key '{prefix}{key}'{hint}")
    kwargs = {}
    for name in names:
        if name in raw:
            kwargs[name] = _coerce(raw[name], hints[name], prefix + name, error)
    return cls(**kwargs)


def _coerce(value, tp, key: str, error=RecipeError):
    if dataclasses.is_dataclass(tp):
        return build(tp, {} if value is None else value, key + ".", error)

    def nested(cls, v):  # a dataclass member of a union: built here, its error one more mismatch
        try:
            return _coerce(v, cls, key, error)
        except error as e:
            raise Mismatch(v, cls, said=str(e)) from None

    try:
        return check(value, tp, nested=nested)
    except Mismatch as m:
        words = _recipe_words(key, m)
    raise error(words)


class Mismatch(Exception):
    """What ``check`` found: ``value`` is not a ``tp`` (for a union, ``misses`` holds each member's
    Mismatch), or ``choices`` when it is a string none of them. The caller words it (``said``: already
    worded, by a nested dataclass's build)."""

    def __init__(self, value, tp, misses=(), choices=None, said: str | None = None):
        super().__init__(value, tp)
        self.value, self.tp, self.misses, self.choices, self.said = value, tp, list(misses), choices, said


def check(value, tp, *, choices=None, float_strings: bool = True, nested=None):
    """``value`` as the type ``tp``, strictly; raises Mismatch. ``tp``: bool; int (not a bool); float (an int
    or a float, not a bool; with ``float_strings`` a string such as ``2e-4``, which YAML 1.1 reads as one);
    str (one of ``choices`` when given); list or dict (deep-copied); a Literal (a bare ``no``, which YAML 1.1
    reads as false, matches ``"no"``); a dataclass (``nested(tp, value)`` builds it); or a Union, Optional or
    ``X | Y`` of these: None where it allows None, else the first member that takes the value."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in UNIONS:
        if value is None and type(None) in args:
            return None
        misses = []
        for a in args:
            if a is type(None):
                continue
            try:
                return check(value, a, choices=choices, float_strings=float_strings, nested=nested)
            except Mismatch as m:
                if m.choices:  # a string, but none of the choices: that is what to say
                    raise
                misses.append(m)
        raise Mismatch(value, tp, misses)
    if dataclasses.is_dataclass(tp) and nested is not None:
        return nested(tp, value)
    if origin is Literal:
        if value is False and "no" in args:  # YAML 1.1 reads a bare `no` as false
            value = "no"
        if value not in args:
            raise Mismatch(value, tp)
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise Mismatch(value, tp)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Mismatch(value, tp)
        return value
    if tp is float:
        if float_strings and isinstance(value, str):  # YAML 1.1 reads 2e-4 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Mismatch(value, tp)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise Mismatch(value, tp)
        if choices and value not in choices:
            raise Mismatch(value, tp, choices=choices)
        return value
    if tp in (list, dict):
        if not isinstance(value, tp):
            raise Mismatch(value, tp)
        return _deepcopy(value)
    raise TypeError(f"schema: unsupported type {tp}")  # a bug in the schema


def _recipe_words(key: str, m: Mismatch) -> str:
    """A mismatch in a recipe's words, naming the dotted key."""
    tp, value = m.tp, m.value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if m.said:
        return m.said
    if origin in UNIONS:
        if len(m.misses) == 1 and type(None) in args:  # Optional[X]: X's own message, "or null"
            return _recipe_words(key, m.misses[0]).replace(", got", " or null, got", 1)
        return f"'{key}' must be {type_name(tp)}, got {type(value).__name__} ({value!r})"
    if origin is Literal or m.choices:
        return f"'{key}' must be one of {', '.join(map(str, m.choices or args))}; got {value!r}"
    if tp is bool:
        return f"'{key}' must be true or false, got {value!r}"
    what = {int: "an integer", float: "a number", str: "a string"}.get(tp) or f"a {tp.__name__}"
    return f"'{key}' must be {what}, got {type(value).__name__} ({value!r})"


def parse_overrides(overrides, error=RecipeError) -> dict:
    """``["train.steps=200", ...]`` (or a dict) -> {dotted key: value parsed as YAML}."""
    if not overrides:
        return {}
    if isinstance(overrides, dict):
        return dict(overrides)
    out = {}
    for item in overrides:
        if "=" not in item:
            raise error(f"override {item!r} must look like key.path=value")
        key, value = item.split("=", 1)
        key = key.strip()
        if not key:
            raise error(f"override {item!r} has an empty key")
        try:
            out[key] = yaml.safe_load(value) if value.strip() != "" else ""
        except yaml.YAMLError as e:
            raise error(f"override {item!r}: value is not a YAML scalar: {e}") from e
    return out


def set_dotted(raw: dict, key: str, value, error=RecipeError) -> None:
    parts = key.split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise error(f"cannot set '{key}': '{'.'.join(parts[: i + 1])}' is not a mapping")
        node = child
    node[parts[-1]] = value


def apply_overrides(raw: dict, overrides, error=RecipeError) -> dict:
    """Set every ``dotted.key=value`` of ``overrides`` in ``raw`` (in place); returns ``raw``."""
    for key, value in parse_overrides(overrides, error).items():
        set_dotted(raw, key, value, error)
    return raw


def _deepcopy(x):
    return copy.deepcopy(x)
