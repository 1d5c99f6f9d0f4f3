"""The scheme interface: one positional mechanism, one module.

A scheme is an ``nn.Module`` attached to the converted model as ``model.retrofit_positions``
(so its learned parameters are ordinary parameters: saved, optimised, visible to PEFT).
It is one of five kinds:

- ``"bias"``: a per-head additive score bias, ``bias(layer, h, q_pos, k_pos)``, written
  elementwise so the same definition serves the query-chunked kernel (``h`` (H, 1, 1),
  ``q_pos`` (1, C, 1), ``k_pos`` (1, 1, Tk) -> (H, C, Tk)) and FlexAttention's ``score_mod``
  (0-d tensors -> 0-d). A learned bias is a gather (``table[layer, h, bucket(q_pos - k_pos)]``),
  never an H x N x N tensor.
- ``"relative"``: a query-dependent positional term (Transformer-XL, NEZHA): ``relative_queries(layer, q)``
  gives the content and position queries, ``relative_keys(layer, n, dtype, device, start)`` one vector per
  distance start .. start + n - 1 (H or 1, n, D; an encoder's keys after the query have negative distances);
  the kernel adds ``q_pos[i] . keys[i - j - start]`` per query chunk.
- ``"rotary"``: rotates q and k, ``rotate(layer, x, pos)``.
- ``"absolute"``: adds to the embeddings, ``embed(position_ids, dtype)``.
- ``"none"``: nothing (the causal mask alone carries order).

Options are a dataclass (``Options``) whose fields carry ``metadata={"help": ...}`` (made by ``option``,
through ``schema.field_help``) and are checked by the one type checker, ``schema.check``.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from ..foundation import catalog
from ..foundation.errors import OptionError
from ..foundation.schema import UNIONS, Mismatch, check, field_help, help_of


class Schemes:
    """The schemes by name (``foundation.catalog``), each class imported on first use: ``get(name)``, ``names()``,
    ``items()`` (imports every one), ``name in SCHEMES``."""

    def get(self, name: str) -> type["Scheme"]:
        module = importlib.import_module(catalog.module_of(name))  # an unknown name: UnknownSchemeError
        found = [
            c
            for c in vars(module).values()
            if isinstance(c, type) and issubclass(c, Scheme) and getattr(c, "name", None) == name
        ]
        if len(found) != 1:
            raise TypeError(f"{module.__name__} defines {len(found)} Scheme subclasses named {name!r}; it needs one")
        return found[0]

    def names(self) -> list[str]:
        return sorted(catalog.CATALOG)

    def items(self) -> list[tuple[str, type["Scheme"]]]:
        return [(n, self.get(n)) for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in catalog.CATALOG


SCHEMES = Schemes()


@dataclass(frozen=True)
class ModelSpec:
    """What a scheme needs to know about the model it is installed in (filled by the adapter)."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    native_length: int  # positions the model was trained on
    native_kind: str  # "learned_absolute" | "rope" | "alibi"
    native_rope: dict | None = None  # {"theta", "fraction", "rope_type", "inv_freq" (tensor), "attention_scaling"}
    embedding_rms: float | None = (
        None  # RMS of the input token embeddings (filled by convert; absolute schemes scale to it)
    )
    # learned-absolute families: the native table's rows for positions 0 .. native - 1 (filled by convert)
    native_table: Any = field(default=None, compare=False, repr=False)
    # its attention sees the keys after the query (an encoder): a scheme with a learned table per offset keeps one
    # for each side (T5's bidirectional buckets)
    bidirectional: bool = False


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
    values = {k: _check_type("(every scheme)", k, v, hints[k], None) for k, v in given.items() if k in fields}
    common = CommonOptions(**values)
    if common.temperature_length is None:
        common.temperature_length = spec.native_length
    if common.temperature < 0:
        raise OptionError(f"option 'temperature' must be >= 0; got {common.temperature}")
    if common.temperature_length <= 0:
        raise OptionError(f"option 'temperature_length' must be > 0; got {common.temperature_length}")
    return common, {k: v for k, v in given.items() if k not in fields}


class Scheme(nn.Module):
    name: ClassVar[str]  # both from the scheme's catalog line (foundation/catalog.py), set when its module loads
    kind: ClassVar[str]  # "bias" | "relative" | "rotary" | "absolute" | "none"
    # why the scheme has nothing to calibrate, when it has no position parameters (retrofit convert --calibrate)
    fixed_because: ClassVar[str] = "the scheme defines no learned parameters"
    # an absolute scheme exported as a position table: the table in words, and how to get a longer one
    table_words: ClassVar[str] = ""  # "": "a fixed <name>"
    longer_table: ClassVar[str] = "re-export with a larger max_length (--max-length)"
    # True when scores depend only on distances i - j (shifting every position changes nothing)
    shift_invariant: ClassVar[bool] = False
    # its scores are defined for keys after the query too (an encoder's bidirectional attention)
    bidirectional: ClassVar[bool] = True

    @dataclass
    class Options:
        pass

    def __init_subclass__(cls, **kwargs):
        """A scheme's module in the catalog names the scheme it defines: its name and kind come from there."""
        super().__init_subclass__(**kwargs)
        name = catalog.name_of(cls.__module__)
        if name is not None:
            cls.name, cls.kind = name, catalog.CATALOG[name].kind

    def __init__(self, spec: ModelSpec, options):
        super().__init__()
        self.spec = spec
        self.options = options
        self.common = parse_common(spec, {})[0]  # convert sets the given ones

    # ---- options -------------------------------------------------------------------------
    @classmethod
    def parse_options(cls, spec: ModelSpec, given: dict[str, Any]):
        """Validate user options (unknown keys and wrong types are errors) and fill model-dependent defaults."""
        fields = {f.name: f for f in dataclasses.fields(cls.Options)}
        unknown = sorted(set(given) - set(fields))
        if unknown:
            valid = ", ".join(sorted(fields)) or "(none)"
            raise OptionError(
                f"scheme {cls.name!r} takes no option {', '.join(map(repr, unknown))}; its options: {valid} "
                f"(and, for every scheme: {', '.join(COMMON_OPTIONS)})"
            )
        hints = typing.get_type_hints(cls.Options)
        values = {}
        for key, value in given.items():
            values[key] = _check_type(cls.name, key, value, hints[key], fields[key].metadata.get("choices"))
        opts = cls.Options(**values)
        return cls.resolve_defaults(spec, opts)

    @classmethod
    def resolve_defaults(cls, spec: ModelSpec, opts):
        """Fill options left as None from the model (override per scheme)."""
        return opts

    @classmethod
    def option_help(cls) -> dict[str, str]:
        return help_of(cls.Options)

    def options_dict(self) -> dict[str, Any]:
        """The scheme's options, and the common ones when the temperature is on (saved in the config)."""
        common = dataclasses.asdict(self.common)
        if not self.common.temperature:
            common = {"qk_norm": True} if self.common.qk_norm else {}
        elif not self.common.qk_norm:
            common.pop("qk_norm")
        return {**dataclasses.asdict(self.options), **common}

    def set_common(self, common: CommonOptions) -> None:
        """Install the common options (convert calls this); QK-norm adds its gains (L, H|Hkv, D), ones until
        calibrated, as parameters of this module (saved, trained and loaded like a scheme's own)."""
        self.common = common
        if common.qk_norm:
            s = self.spec
            self.q_gain = nn.Parameter(torch.ones(s.num_layers, s.num_heads, s.head_dim))
            self.k_gain = nn.Parameter(torch.ones(s.num_layers, s.num_kv_heads, s.head_dim))

    def qk_normed(self, layer: int, x: torch.Tensor, which: str) -> torch.Tensor:
        """RMSNorm over the head dim of q or k (B, H, T, D), times the layer's per-head gains."""
        gain = (self.q_gain if which == "q" else self.k_gain)[layer]  # (H, D)
        normed = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=1e-6)
        return (normed * gain[:, None, :].float()).to(x.dtype)

    def temperature(self, q_pos: torch.Tensor) -> torch.Tensor | None:
        """Per-query logit multiplier for absolute query positions ``q_pos`` (None when off)."""
        fn = self.temperature_fn(q_pos.device)
        return None if fn is None else fn(q_pos)

    def temperature_fn(self, device) -> typing.Callable[[torch.Tensor], torch.Tensor] | None:
        """``temperature`` as a function of the positions alone, its constants 0-d tensors made here: a
        compiled score_mod (flex, dynamic=True) turns float attributes into .item() calls inductor cannot lower."""
        if not self.common.temperature:
            return None
        beta, length = (
            torch.tensor(float(x), device=device) for x in (self.common.temperature, self.common.temperature_length)
        )
        return lambda q_pos: 1 + beta * torch.log(((q_pos.to(torch.float32) + 1) / length).clamp(min=1.0))

    # ---- behaviour -----------------------------------------------------------------------
    def max_length(self) -> int | None:
        """Longest sequence this scheme supports (None: no limit)."""
        return None

    def bias(self, layer: int, h: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        raise TypeError(f"scheme {self.name!r} is not a bias scheme")

    def linear_slopes(self, layer: int) -> torch.Tensor | None:
        """(H,) slopes m when ``bias(layer, h, i, j) == -m[h] * (i - j)`` exactly for every i >= j (the fused
        kernels serve such a bias on causal calls without building it); None for any other bias."""
        return None

    def distance_band(self, layer: int) -> torch.Tensor | None:
        """(H, K + 1) values b when ``bias(layer, h, i, j) == b[h, min(i - j, K)]`` for every i >= j exactly (a
        distance bias flat from K on: the ``cpu-flash-band`` path serves it through the CPU flash op); None otherwise."""
        return None

    def rotate(self, layer: int, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        raise TypeError(f"scheme {self.name!r} is not a rotary scheme")

    def relative_queries(self, layer: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise TypeError(f"scheme {self.name!r} is not a relative scheme")

    def relative_keys(
        self, layer: int, n: int, dtype: torch.dtype, device: torch.device, start: int = 0
    ) -> torch.Tensor:
        raise TypeError(f"scheme {self.name!r} is not a relative scheme")

    def relative_sinusoid(self, layer: int, device=None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(proj (H, D, dim), freqs (dim / 2,)) when ``relative_keys(layer, n)[h, d] == proj[h] @ R(d)`` exactly,
        R(d) interleaving sin and cos of ``d * freqs`` (the ``sdpa-relative-dims`` path serves it), on ``device``;
        else None."""
        return None

    def relative_reach(self) -> int | None:
        """K when ``relative_keys`` is flat from distance K on (the ``cpu-flash-relative-band`` path serves
        it); else None."""
        return None

    def embed(self, position_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        raise TypeError(f"scheme {self.name!r} is not an absolute scheme")

    #: a rotary scheme whose rotation of a position changes with the sequence length (dynamic RoPE)
    rotation_depends_on_length: bool = False

    #: a rotary scheme that reads each key at a second position too (SelfExtend): the cache keeps keys unrotated
    keys_reread: bool = False

    def far_reach(self, layer: int) -> int | None:
        """A two-view rotary scheme (SelfExtend, STRING): keys at distance >= this are scored with the rotations
        of ``far_positions``; None: one view."""
        return None

    #: Falcon-style: the bias is added before the 1/sqrt(d) scaling (so it is scaled with the scores)
    bias_scaled_with_scores: bool = False

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.options_dict().items())


def gather_per_head(table: torch.Tensor, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``table[h, idx]`` for a per-head table (H, E), elementwise-broadcast like a bias: ``h`` (H', 1, ..., 1)
    with ``idx`` (1, ...) gives (H', ...) through one ``index_select`` over the flattened indices (no
    broadcast index tensors of the output's size); 0-d ``h`` and ``idx`` (FlexAttention) give a 0-d value."""
    if h.dim() == 0 or idx.dim() != h.dim() or idx.shape[0] != 1 or any(s != 1 for s in h.shape[1:]):
        return table[h, idx]
    rows = table.index_select(0, h.reshape(-1))  # (H', E)
    return rows.index_select(1, idx.reshape(-1)).view(rows.shape[0], *idx.shape[1:])


def _check_type(scheme: str, key: str, value, hint, choices):
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
