"""The native length of a model, read here only: from a config object or a config.json mapping.

A converted model's config advertises its new reach, so its native length comes from the
``retrofit`` block that ``convert`` wrote; an unconverted config is read through the standard names.
"""

from __future__ import annotations

from typing import Any

LENGTH_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length", "max_seq_len")


def native_length(config: Any) -> int | None:
    """The positions a model was trained on (None when the config does not say)."""
    get = config.get if isinstance(config, dict) else (lambda k: getattr(config, k, None))
    candidates = [((get("retrofit") or {}).get("native") or {}).get("length"), *(get(k) for k in LENGTH_KEYS)]
    return next((n for n in candidates if isinstance(n, int) and not isinstance(n, bool) and n > 0), None)


def rows_of(value, native: int, what: str = "extend: length") -> int:
    """A length as given (an int, or a multiple of the native length such as ``"16x"``) -> positions; torch-free,
    so that a recipe's ``convert.options`` are read before any weights load."""
    import re

    from .errors import OptionError

    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*x\s*", str(value))
    if not m:
        raise OptionError(f"{what} must be a number of positions or a multiple such as '16x'; got {value!r}")
    return int(round(float(m.group(1)) * native))


def converted_limit(config: dict) -> tuple[str, int] | None:
    """(scheme, the longest input it runs) of a retrofit checkpoint's config.json mapping whose scheme has a limit
    (``extend``'s table), read without torch; None for any other config."""
    from .catalog import CATALOG, limit_of

    block = config.get("retrofit")
    scheme = block.get("scheme") if isinstance(block, dict) else None
    if scheme not in CATALOG:
        return None
    limit = limit_of(scheme, block.get("options") or {})
    return None if limit is None else (scheme, limit)
