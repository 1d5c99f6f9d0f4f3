"""What every export mapping shares: the result types, the registry and its catalog lines, weight surgery and the
config copy."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..foundation.errors import RetrofitError, UnknownNameError
from ..foundation.registry import Registry
from ..foundation.schema import field_help

TOLERANCE = 1e-4  # max abs logit difference (fp32) for an export that claims to be exact


@dataclass(frozen=True)
class ExportOptions:
    """``export``'s keywords beside the model, the folder, ``native`` and ``tokenizer``: their defaults and meaning
    (``retrofit export``'s flags of the same names)."""

    max_length: int | None = field_help(
        "The longest sequence the native model should accept where its architecture has a limit (GPT-2 for NoPE: "
        "the size of the zero position table). None: a finite scheme's own reach, else max(8192, 4 x native).",
        None,
    )
    check_length: int | None = field_help(
        "Tokens of the random-id equivalence check (None: min(4 x native, native + 1024)).", None
    )
    approximate: bool = field_help(
        "Also write the closest architecture where none is exact (gpt2 + alibi with scale_bias=False -> Falcon); "
        "the result says exact: False, why, and the perplexity difference.",
        False,
    )
    tolerance: float = field_help(
        "Max abs logit difference (float32) of an export that should be exact; past it export raises and writes "
        "nothing.",
        TOLERANCE,
    )
    ppl_text: str = field_help(
        "Text (a retrofit.data.specs spec) of an inexact export's perplexity difference, read at check_length "
        "when a tokenizer is known.",
        "stdlib",
    )


class ExportResult(dict):
    """What ``export`` wrote: ``out``, ``native``, ``mapping``, ``target`` (architecture class),
    ``exact``, ``max_abs_logit_diff`` (measured on the written folder), ``check_length``, ``notes``."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class Built:
    """A mapping's output: the native model (weights copied) and what is known about its exactness."""

    model: nn.Module
    exact: bool  # equal to the patched model (within TOLERANCE in fp32) at every length up to exact_below
    notes: list[str] = field(default_factory=list)
    exact_below: int | None = None  # exactness only holds for sequences shorter than this (None: any length)
    strict: bool = True  # a measured difference above the tolerance is an error (False: reported, not raised)
    limit: int | None = None  # the exported model reads at most this many tokens (a baked table's rows)
    reach: int | None = None  # what its tokenizer may pass (default: the config's max_position_embeddings)


@dataclass(frozen=True)
class Mapping:
    """A registered export: ``build(model, info, options) -> Built`` and the target it writes."""

    build: Callable[..., Built]
    target: str


MAPPINGS: Registry[Mapping] = Registry("export mapping", UnknownNameError)  # "<adapter>+<scheme>" -> Mapping


@dataclass(frozen=True)
class Line:
    """One line of the export catalog (``native_export.CATALOG``): the function that builds (``module.function``
    under ``native_export/``), the families and schemes it takes, the target it writes, and the words of the docs
    table (docs/export.md's "Mappings", rendered by ``table``)."""

    build: str
    families: tuple[str, ...] | None  # None: every learned-absolute family (an adapter with a position table)
    schemes: tuple[str, ...]
    target: str
    written: str  # the docs table's "exported as"
    exact: str  # the docs table's "exact?"

    def pairs(self) -> list[str]:
        return [f"{family}+{scheme}" for family in self.takes() for scheme in self.schemes]

    def takes(self) -> tuple[str, ...]:
        """The families this line takes."""
        from ..adapters import ADAPTERS

        return self.families or tuple(n for n, a in ADAPTERS.items() if a.position_table is not None)


def register(lines: tuple[Line, ...]) -> None:
    """Fill ``MAPPINGS`` from the catalog's lines, each builder's module imported here."""
    for line in lines:
        module, function = line.build.rsplit(".", 1)
        fn = getattr(importlib.import_module(f"{__package__}.{module}"), function)
        for pair in line.pairs():
            MAPPINGS.register(pair)(Mapping(fn, line.target))


REFUSED = (
    "anything else (T5 buckets, Shaw, FIRE, ALiBi on a rotary model, ...)",
    "a `RetrofitError` (exit code 2) that lists the supported pairs and points to `retrofit.load`",
    "—",
)


def table(lines: tuple[Line, ...]) -> str:
    """docs/export.md's table of mappings: one row per catalog line, then what is refused."""
    rows = ["| converted model | exported as | exact? |", "|---|---|---|"]
    for line in lines:
        families = " / ".join(f"`{f}`" for f in line.takes()) + ("" if line.families else " (learned absolute)")
        schemes = ", ".join(f"`{s}`" for s in line.schemes)
        rows.append(f"| {families} + {schemes} | {line.written} | {line.exact} |")
    rows.append("| " + " | ".join(REFUSED) + " |")
    return "\n".join(rows)


def mapping(adapter: str, scheme: str, target: str):
    """Deprecated (a mapping registered from outside the package): register ``fn(model, info, options) -> Built``
    for converted (adapter, scheme) models. The package's mappings are lines of ``native_export.CATALOG``."""

    def deco(fn):
        MAPPINGS.register(f"{adapter}+{scheme}")(Mapping(fn, target))
        return fn

    return deco


def supported_pairs() -> list[str]:
    """``["gpt2+alibi -> FalconForCausalLM", "gpt2|gpt_neo|opt+nope -> same architecture ...", ...]``."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name, m in MAPPINGS.items():
        adapter, scheme = name.split("+")
        groups.setdefault((scheme, m.target), []).append(adapter)
    return [f"{'|'.join(adapters)}+{scheme} -> {target}" for (scheme, target), adapters in groups.items()]


# ---- weight surgery ----------------------------------------------------------------------------
def put(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    """Copy ``src`` into parameter/buffer ``dst`` (named ``name`` in errors) after checking the shape."""
    if tuple(dst.shape) != tuple(src.shape):
        raise RetrofitError(f"export: shape mismatch for {name}: target {tuple(dst.shape)}, source {tuple(src.shape)}")
    with torch.no_grad():
        dst.copy_(src.to(dtype=dst.dtype, device=dst.device))


def per_head_qkv(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """GPT-2 fused attention (Conv1D, (E, 3E) = [q | k | v] columns) -> a Linear weight (3E, E) whose
    rows are interleaved per head [q_h, k_h, v_h] (Falcon, GPT-NeoX). A bias (3E,) works the same way."""
    out = weight.T if weight.dim() == 2 else weight  # (3E, E) or (3E,)
    three_e = out.shape[0]
    head_dim = three_e // (3 * num_heads)
    rest = out.shape[1:]
    return out.reshape(3, num_heads, head_dim, *rest).transpose(0, 1).reshape(three_e, *rest)


def copy_lm_head(dst_model, src_model) -> None:
    """Tied models share the embedding; an untied source head is copied. A model without an LM head (a classifier,
    a bare encoder) has none to copy: its head's weights are copied by name like the rest."""
    src, dst = src_model.get_output_embeddings(), dst_model.get_output_embeddings()
    if src is None and dst is None:
        return
    if src.weight is src_model.get_input_embeddings().weight:
        if dst.weight is not dst_model.get_input_embeddings().weight:
            raise RetrofitError("export: the source ties its lm_head to the embeddings but the target does not")
        return
    put(dst.weight, src.weight, "lm_head.weight")


def check_surgery(dst_model, copied: set[int]) -> None:
    """Every parameter of the target must have been written (no silently random weight)."""
    missing = [n for n, p in dst_model.named_parameters() if id(p) not in copied]
    if missing:
        raise RetrofitError(f"export: target parameters left unset: {missing[:8]}")


class Surgery:
    """Tracks which target parameters were written."""

    def __init__(self, dst_model):
        self.dst = dst_model
        self.done: set[int] = set()

    def __call__(self, dst: torch.Tensor, src: torch.Tensor, name: str):
        put(dst, src, name)
        self.done.add(id(dst))

    def finish(self, src_model):
        copy_lm_head(self.dst, src_model)
        if self.dst.get_output_embeddings() is not None:
            self.done.add(id(self.dst.get_output_embeddings().weight))
        check_surgery(self.dst, self.done)
        return self.dst


def plain_config(model):
    """A copy of the model's config without the retrofit block, remote-code map or attention override."""
    d = model.config.to_dict()
    base = (d.get("retrofit") or {}).get("base_config") or {}
    d.update({k: v for k, v in base.items() if k not in ("model_type", "architectures")})  # the original length
    for key in ("retrofit", "auto_map", "_attn_implementation", "_attn_implementation_autoset", "transformers_version"):
        d.pop(key, None)
    return type(model.config).from_dict(d)
