"""The scheme catalog: every positional scheme by name, with its kind, its module and a one-line summary, readable
without importing torch (``retrofit --help``, ``retrofit convert --help`` and argument errors answer at once).

It is the registry and the one place a scheme's name is declared: the module ``retrofit.scheme.<module>``
defines one ``Scheme`` subclass, which takes its name and kind from its line here when the module loads
(``scheme.root.Scheme.__init_subclass__``); ``retrofit.scheme.SCHEMES`` imports a scheme's module the first
time the scheme is used. A new scheme is its module and one line here (docs/ARCHITECTURE.md, "Add a scheme")."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UnknownSchemeError

PACKAGE = "retrofit.scheme"  # where the schemes' modules live
KINDS = ("bias", "relative", "rotary", "absolute", "none")  # what a kind's term acts on: scheme/kinds.py


@dataclass(frozen=True)
class Entry:
    kind: str  # one of KINDS
    summary: str  # one line for the help
    module: str = ""  # the module under PACKAGE; "": the scheme's name
    limit: str = ""  # the option whose value is the longest input the scheme runs ("": no limit)


CATALOG: dict[str, Entry] = {
    "alibi": Entry("bias", "score bias linear in the distance, one slope per head (Press et al.)"),
    "extend": Entry(
        "absolute",
        "the learned table stretched to a longer one: rows copied (Longformer) or interpolated",
        limit="length",
    ),
    "fire": Entry("bias", "learned MLP of the log-transformed, length-normalised distance (Li et al. 2023)"),
    "nezha": Entry("relative", "fixed sinusoidal relative vectors of the clipped offset, query-dependent (NEZHA)"),
    "nope": Entry("none", "no positions: the causal mask alone carries order"),
    "rope": Entry("rotary", "rotary q/k, optionally rescaled: PI, NTK, YaRN, dynamic"),
    "shaw": Entry("bias", "learned per-offset bias clipped at max_distance (Shaw et al.)"),
    "sinusoidal": Entry("absolute", "fixed absolute sinusoids added to the embeddings"),
    "t5": Entry("bias", "learned bucketed relative bias (T5)"),
    "xl": Entry("relative", "Transformer-XL relative positions: query-dependent sinusoid projection, u and v biases"),
}


def entry(name: str) -> Entry:
    """The catalog line of ``name``; an UnknownSchemeError (exit 2) naming every scheme otherwise."""
    if not isinstance(name, str):
        raise UnknownSchemeError(f"scheme must be a string, got {type(name).__name__}")
    if name not in CATALOG:
        raise UnknownSchemeError(f"unknown scheme {name!r}; registered: {', '.join(sorted(CATALOG))}")
    return CATALOG[name]


def limit_of(name: str, options: dict) -> int | None:
    """The longest input scheme ``name`` runs with ``options`` (a converted checkpoint's saved, resolved options),
    None when it has no limit: what ``Scheme.max_length`` says, read without torch (from a config.json)."""
    key = entry(name).limit
    value = options.get(key) if key else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def module_of(name: str) -> str:
    """The dotted module that defines scheme ``name``."""
    return f"{PACKAGE}.{entry(name).module or name}"


def name_of(module: str) -> str | None:
    """The scheme a module defines (``retrofit.scheme.alibi`` -> ``alibi``), None for any other module."""
    return next((n for n in CATALOG if module_of(n) == module), None)


def schemes_help() -> str:
    width = max(map(len, CATALOG))
    lines = ["schemes (retrofit convert MODEL --to SCHEME; a scheme's options: retrofit convert --help --to SCHEME):"]
    lines += [f"  {name:<{width}}  {e.summary} [{e.kind}]" for name, e in CATALOG.items()]
    return "\n".join(lines)
