"""Evaluation lengths: token counts (``512``) or multiples of a model's native length (``"4x"``).
Every entry point (``retrofit eval``, ``retrofit.evaluate``, recipes) resolves them here."""

from __future__ import annotations

import re

from ..foundation.errors import LengthError, OptionError

_MULTIPLE = re.compile(r"^(\d+(?:\.\d+)?)x$")


def parse_item(x, what: str = "lengths"):
    """``512`` -> 512, ``"4x"`` -> ``"4x"``; anything else (``"512"`` included) is an OptionError."""
    if isinstance(x, str):
        text = x.strip()
        if _MULTIPLE.match(text) and float(_MULTIPLE.match(text).group(1)) > 0:
            return text
    if isinstance(x, int) and not isinstance(x, bool) and x >= 2:
        return x
    raise OptionError(
        f"{what}: each length must be an integer >= 2 (tokens) or a multiple of the native length like '4x'; got {x!r}"
    )


def parse_list(text: str, what: str = "--lengths") -> list:
    """``"1x,2x,4096"`` -> ``["1x", "2x", 4096]``."""
    items = [t for t in str(text).split(",") if t.strip()]
    if not items:
        raise OptionError(f"{what}: give at least one length")
    return [parse_item(int(t) if t.strip().isdigit() else t, what) for t in items]


def resolve(items, native: int | None, what: str = "lengths") -> list[int]:
    """``['1x', '2x', 512]`` with native 128 -> ``[128, 256, 512]`` (sorted, unique)."""
    if isinstance(items, (int, str)):
        items = [items]
    out = set()
    for x in items:
        x = parse_item(x, what)
        if isinstance(x, str):
            if not native:
                raise OptionError(f"{what}: {x!r} needs the model's native length, which is unknown; give token counts")
            out.add(round(float(_MULTIPLE.match(x).group(1)) * native))
        else:
            out.add(x)
    return sorted(out)


def past_limit(name: str, mechanism: str, limit: int | None, lengths: list[int], what: str) -> None:
    """A LengthError when ``lengths`` (of ``what``: lengths, passkey lengths, ...) go past the evaluated model's
    ``limit`` (``mechanism``: what sets it): said from its config before loading, and by the measures after."""
    too_long = [L for L in lengths if limit is not None and L > limit]
    if too_long:
        raise LengthError(
            f"{what} {', '.join(map(str, too_long))} exceed what {name!r} supports ({mechanism}: at most {limit} "
            "tokens). Drop those lengths, convert to a scheme without a limit, or evaluate this model as a "
            "baseline (it then gets a sliding-window figure)."
        )


def reads_past(name: str, limit: int | None, lengths: list[int]) -> None:
    """A classifier's or an embedding model's lengths past what it reads whole: an OptionError."""
    if limit is not None and max(lengths) > limit:
        raise OptionError(f"{name} reads at most {limit} tokens; the longest length is {max(lengths)}")
