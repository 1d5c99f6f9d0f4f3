"""One strict loader for every typed configuration: recipes, pipeline sections, ``key=value`` pairs.

A configuration is a dataclass whose fields carry ``metadata={"help": ...}`` (``field_help``). Loading
is strict: an unknown key (with a "did you mean"), a missing mapping or a value of the wrong type
raises the caller's error class (``RecipeError`` by default) naming the dotted key. YAML 1.1 quirks
are handled (``2e-4`` read as a string, a bare ``no`` read as false).

    section = build(EvalSection, {"budget": 4096}, prefix="eval.")
    raw = read_yaml("recipes/x.yaml"); apply_overrides(raw, ["train.steps=200"])
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import typing
from dataclasses import field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from .errors import RecipeError

MISSING = dataclasses.MISSING


def field_help(text: str, default=MISSING, factory=MISSING):
    """A dataclass field with help text (``factory`` for mutable defaults)."""
    if factory is not MISSING:
        return field(default_factory=factory, metadata={"help": text})
    return field(default=default, metadata={"help": text})


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
    if origin is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        name = " | ".join(type_name(a) for a in args)
        return name + (" | null" if type(None) in typing.get_args(tp) else "")
    return getattr(tp, "__name__", str(tp))


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
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key, error)
            except error as e:
                errors.append(e)
        if len(errors) == 1 and type(None) in args:  # Optional[X]: X's own message, "or null"
            raise error(str(errors[0]).replace(", got", " or null, got", 1))
        raise error(f"'{key}' must be {type_name(tp)}, got {type(value).__name__} ({value!r})")
    if origin is Literal:
        if value is False and "no" in args:  # YAML 1.1 reads a bare `no` as false
            value = "no"
        if value not in args:
            raise error(f"'{key}' must be one of {', '.join(map(str, args))}; got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise error(f"'{key}' must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise error(f"'{key}' must be an integer, got {type(value).__name__} ({value!r})")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 2e-4 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise error(f"'{key}' must be a number, got {type(value).__name__} ({value!r})")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise error(f"'{key}' must be a string, got {type(value).__name__} ({value!r})")
        return value
    if tp in (list, dict):
        if not isinstance(value, tp):
            raise error(f"'{key}' must be a {tp.__name__}, got {type(value).__name__} ({value!r})")
        return _deepcopy(value)
    raise TypeError(f"schema: unsupported type {tp} for {key}")  # a bug in this file


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
