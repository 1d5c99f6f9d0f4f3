"""The root ``Scheme`` and the base of each kind (a scheme's catalog line names its kind, ``foundation/catalog.py``).

The root carries what every kind has: its catalog name and kind, its options and the common ones, QK-norm, the
length-aware temperature, the direction check, a length limit. Each kind's base adds what its schemes define and
how its ``prepare`` turns a call's ``Site``, q and k into the kernels' ``Term``; the facts a kernel may exploit live
on the one kind they are about (``BiasScheme.linear_slopes``, ``RotaryScheme.far_reach``, ...). (One module: a
call's ``prepare`` runs the root's steps and its kind's, and a converted layer's forward enters few files.)

- ``"bias"`` (``BiasScheme``): a per-head additive score bias, ``bias(layer, h, q_pos, k_pos)``, written
  elementwise so the same definition serves the query-chunked kernel (``h`` (H, 1, 1),
  ``q_pos`` (1, C, 1), ``k_pos`` (1, 1, Tk) -> (H, C, Tk)) and FlexAttention's ``score_mod``
  (0-d tensors -> 0-d). A learned bias is a gather (``table[layer, h, bucket(q_pos - k_pos)]``,
  ``gather_per_head``), never an H x N x N tensor. ``prepare``: the bias function, slopes or band, per-row shifts.
- ``"relative"`` (``RelativeScheme``): a query-dependent positional term (Transformer-XL, NEZHA):
  ``relative_queries(layer, q)`` gives the content and position queries, ``relative_keys(layer, n, dtype, device,
  start)`` one vector per distance start .. start + n - 1 (H or 1, n, D; an encoder's keys after the query have
  negative distances); the kernel adds ``q_pos[i] . keys[i - j - start]`` per query chunk.
- ``"rotary"`` (``RotaryScheme``): rotates q and k, ``rotate(layer, x, pos)``; ``prepare`` also builds a two-view
  scheme's far view.
- ``"absolute"`` (``AbsoluteScheme``): adds to the embeddings, ``embed(position_ids, dtype)``.
- ``"none"`` (``NoneScheme``): nothing (the causal mask alone carries order).

Every kind's ``prepare`` applies the common options too (QK-norm, the length-aware temperature: ``Scheme``).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ..foundation import catalog
from ..foundation.errors import OptionError, RetrofitError
from ..foundation.schema import help_of
from ..kernels.call import Far, Relative, Term
from .options import COMMON_OPTIONS, CommonOptions, check_type, parse_common
from .site import Site
from .spec import ModelSpec


class Scheme(nn.Module):
    name: ClassVar[str]  # both from the scheme's catalog line (foundation/catalog.py), set when its module loads
    kind: ClassVar[str]  # "bias" | "relative" | "rotary" | "absolute" | "none"
    # why the scheme has nothing to calibrate, when it has no position parameters (retrofit convert --calibrate)
    fixed_because: ClassVar[str] = "the scheme defines no learned parameters"
    # True when scores depend only on distances i - j (shifting every position changes nothing)
    shift_invariant: ClassVar[bool] = False
    # its scores are defined for keys after the query too (an encoder's bidirectional attention): every rotary,
    # absolute and position-free scheme's are; a bias may be defined for keys before the query only (FIRE's)
    bidirectional: ClassVar[bool] = True
    # the option whose value is the longest input (its catalog line's ``limit``; "": no limit), set when it loads
    limit_option: ClassVar[str] = ""

    @dataclass
    class Options:
        pass

    def __init_subclass__(cls, **kwargs):
        """A scheme's module in the catalog names the scheme it defines: its name and kind come from there."""
        super().__init_subclass__(**kwargs)
        name = catalog.name_of(cls.__module__)
        if name is not None:
            kind = catalog.CATALOG[name].kind
            if not issubclass(cls, KIND_BASES[kind]):
                raise TypeError(
                    f"{cls.__name__}: scheme {name!r} is of kind {kind}; subclass {KIND_BASES[kind].__name__}"
                )
            cls.name, cls.kind, cls.limit_option = name, kind, catalog.CATALOG[name].limit

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
            values[key] = check_type(cls.name, key, value, hints[key], fields[key].metadata.get("choices"))
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

    # ---- behaviour ---------------------------------------------------------------------
    def max_length(self) -> int | None:
        """Longest sequence this scheme supports (None: no limit): its catalog line's ``limit`` option's value (read
        as ``catalog.limit_of`` reads a saved config)."""
        value = getattr(self.options, self.limit_option, None) if self.limit_option else None
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    # ---- the call ----------------------------------------------------------------------------
    def prepare(self, site: Site, q: torch.Tensor, k: torch.Tensor) -> Term:
        """The call's q, k and positional term, as its kernels read them (the kind's base overrides it). This
        one: no term in the scores (an absolute scheme's acts on the embeddings), the common options only."""
        q, k = self.normed(site, q, k)
        times, tau = self.tempered(site, q)
        return Term(q if times is None else q * times, k, row_scale=tau)

    def normed(self, site: Site, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """QK-norm before the positions act (when on). Keys in a cache that were already normalised (and, for a
        rotary scheme writing through the cache, rotated) are left as they are: only the new rows are normalised.
        Calibrating (``site.calibration``): record each head's RMS, leave q and k as they are."""
        if not self.common.qk_norm:
            return q, k
        if site.calibration is not None:
            for which, x in (("q", q), ("k", k)):
                site.calibration[(site.layer, which)] = x.float().pow(2).mean(dim=(0, 2, 3)).sqrt()
            return q, k
        q = self.qk_normed(site.layer, q, "q")
        if site.in_place(k):
            k[:, :, site.q_start :] = self.qk_normed(site.layer, k[:, :, site.q_start :], "k")  # the cache keeps them
            return q, k
        return q, self.qk_normed(site.layer, k, "k")

    def tempered(self, site: Site, q: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The length-aware temperature (when on): (times (B or 1, 1, Tq, 1) in q's dtype, to multiply every
        logit of query i with, its positional terms' too; tau (B or 1, Tq)), read at the queries' own positions
        (padding-aware); (None, None) when off."""
        if not self.common.temperature:
            return None, None
        tau = self.temperature(site.place(site.token_positions(q.device)))
        return tau.to(q.dtype)[:, None, :, None], tau

    def check_direction(self, site: Site) -> None:
        """A term defined for keys before the query only refuses an attention that sees keys after it."""
        if not site.causal and not self.bidirectional:
            raise RetrofitError(
                f"scheme {self.name!r} has no bidirectional form; this attention sees keys after the query"
            )

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.options_dict().items())


class BiasScheme(Scheme):
    """The ``"bias"`` kind: a per-head additive score bias ``bias(layer, h, q_pos, k_pos)``; ``prepare`` gives the
    kernels the bias function of slot indices and, where they are exact, what the fused kernels read instead."""

    #: Falcon-style: the bias is added before the 1/sqrt(d) scaling (so it is scaled with the scores)
    bias_scaled_with_scores: bool = False

    def bias(self, layer: int, h: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"scheme {self.name!r} defines no bias")

    # ---- facts a kernel may exploit (None / False: no) ---------------------------------------
    def linear_slopes(self, layer: int) -> torch.Tensor | None:
        """(H,) slopes m when ``bias(layer, h, i, j) == -m[h] * (i - j)`` exactly for every i >= j (the fused
        kernels serve such a bias on causal calls without building it); None for any other bias."""
        return None

    def distance_band(self, layer: int) -> torch.Tensor | None:
        """(H, K + 1) values b when ``bias(layer, h, i, j) == b[h, min(i - j, K)]`` for every i >= j exactly (a
        distance bias flat from K on: the ``cpu-flash-band`` kernel serves it through the CPU flash op); None
        otherwise."""
        return None

    def distance_only(self, layer: int, last: int) -> bool:
        """``bias(layer, h, i, j)`` depends on ``i - j`` alone for every query at a position up to ``last`` (i >= j):
        a kernel may then read it as one value per distance (``cpu-flash-mask``'s distance table)."""
        return self.shift_invariant

    def prepare(self, site: Site, q: torch.Tensor, k: torch.Tensor) -> Term:
        """The bias function (at a block's own positions, or moved by a cache's shift), ALiBi's slopes or T5/Shaw's
        band for the fused kernels where they are exact, per-row shifts where left padding or position ids move rows
        off their slots, and the temperature folded into the bias where it is the slots'."""
        self.check_direction(site)
        q, k = self.normed(site, q, k)
        times, tau = self.tempered(site, q)
        t = Term(q if times is None else q * times, k, row_scale=tau, bias_params=tuple(self.parameters()))
        layer = site.layer_index(q.device)  # a 0-d tensor: compiled score_mods keep it
        scale = site.scaling if self.bias_scaled_with_scores else None
        moved = site.shift + site.offset  # a distance-only bias ignores it; FIRE's normaliser reads i
        if not (self.shift_invariant or site.placed):  # left padding / position_ids move a row's tokens off their slots
            rows = site.row_shifts(q.device)
            t.row_shifts = None if rows is None or bool((rows == site.shift).all()) else rows + site.offset  # (B,)
            t.bias_at = lambda moved: self._bias_fn(layer, None, moved, scale)  # noqa: E731
        t.bias = self._bias_fn(layer, site.place if site.placed else None, moved, scale)
        t.slopes = None if site.placed else self.linear_slopes(site.layer)  # ALiBi: the fused kernels' own
        if t.slopes is not None and scale:
            t.slopes = t.slopes * scale
        # T5 / Shaw: a distance bias flat past a reach (not with a block's own positions or a temperature)
        t.band = None if site.placed or tau is not None else self.distance_band(site.layer)
        if t.band is not None and scale:
            t.band = t.band * scale
        t.distance_only = not (site.placed or t.row_shifts is not None or tau is not None) and self.distance_only(
            site.layer, moved + site.q_start + site.Tq - 1
        )
        plain = t.slopes is None and t.row_shifts is None and not (site.placed or moved)
        if tau is not None and plain and self._tau_of_slots(tau, site.q_start, site.Tk):
            # the temperature read from the query's own position inside the bias: a compiled flex score_mod
            # that loads a per-row tensor fails inductor's CPU template (torch 2.13); this one compiles
            tempered, temperature = t.bias, self.temperature_fn(q.device)
            t.bias = lambda h, i, j: tempered(h, i, j) * temperature(i)  # noqa: E731
            t.row_scale = None
        return t

    def _bias_fn(self, layer, place, moved: int, scale):
        """The bias of slot indices i, j: at a block's own positions (``place``), else moved by ``moved``.
        (The common unmoved case passes i, j as they are: a Python int added inside a compiled flex score_mod is
        specialised per value and hits the same inductor C++ error as a per-layer int.)"""
        if place is not None:
            bias = lambda h, i, j: self.bias(layer, h, place(i), place(j))  # noqa: E731
        elif moved:
            bias = lambda h, i, j: self.bias(layer, h, i + moved, j + moved)  # noqa: E731
        else:
            bias = lambda h, i, j: self.bias(layer, h, i, j)  # noqa: E731
        if scale:
            return lambda h, i, j: bias(h, i, j) * scale  # noqa: E731
        return bias

    def _tau_of_slots(self, tau, q_start, Tk) -> bool:
        """The rows' temperature is the one of their slot indices (no padding, no caller's position ids)."""
        return bool((tau == self.temperature(torch.arange(q_start, Tk, device=tau.device))[None]).all())


class RotaryScheme(Scheme):
    """The ``"rotary"`` kind: rotates q and k, ``rotate(layer, x, pos, seq_len, start)``; a two-view scheme
    (SelfExtend, STRING) scores far keys through a second rotation (``far_reach``, ``far_positions``)."""

    #: the rotation of a position changes with the sequence length (dynamic RoPE)
    rotation_depends_on_length: bool = False
    #: each key is read at a second position too (SelfExtend): the cache keeps keys unrotated
    keys_reread: bool = False

    def rotate(self, layer, x: torch.Tensor, pos: torch.Tensor, seq_len: int | None = None, start: int | None = None):
        raise NotImplementedError(f"scheme {self.name!r} defines no rotation")

    def far_reach(self, layer: int) -> int | None:
        """A two-view scheme (SelfExtend, STRING): keys at distance >= this are scored with the rotations of
        ``far_positions``; None: one view."""
        return None

    def prepare(self, site: Site, q: torch.Tensor, k: torch.Tensor) -> Term:
        """q and k rotated at their positions; SelfExtend / STRING's far view from q and k before the rotation
        (a sliding-window layer whose window is within native never reads past it, so it keeps its exact
        positions)."""
        q, k = self.normed(site, q, k)
        local = site.window is not None and site.window <= self.spec.native_length
        reach = None if local else self.far_reach(site.layer)
        far = None if reach is None else self._far_view(site, q, k, reach)
        k_pos = site.place(torch.arange(site.Tk, device=q.device) + site.shift)
        length = self._length(site, k_pos)
        first = None if site.placed else site.shift + site.offset  # consecutive positions: cos/sin from a table
        new = None if first is None else first + site.q_start
        q = self.rotate(site.layer, q, k_pos[site.q_start :], length, start=new)
        if self.rotate_once(site, k):  # the cache keeps rotated keys, as a native RoPE model's: the new rows, in place
            new_rows = k[:, :, site.q_start :]
            k[:, :, site.q_start :] = self.rotate(site.layer, new_rows, k_pos[site.q_start :], length, start=new)
        else:
            k = self.rotate(site.layer, k, k_pos, length, start=first)
        if far is not None and far.k is None:  # STRING: the far view's keys are where they are
            far = Far(far.q, k, far.reach)
        times, tau = self.tempered(site, q)
        if times is not None:
            q = q * times
            far = None if far is None else Far(far.q * times, far.k, far.reach)
        return Term(q, k, far=far, row_scale=tau)

    def rotate_once(self, site: Site, k: torch.Tensor) -> bool:
        """Rotate each key once, as it enters the cache: a plain DynamicCache holds this very tensor, no
        gradient flows through it, and the scheme rotates a position the same way at every length (dynamic
        RoPE rescales with the length: its whole cache is re-rotated every step, exactly)."""
        return site.in_place(k) and not (self.rotation_depends_on_length or self.keys_reread)

    def _length(self, site: Site, k_pos: torch.Tensor) -> int:
        """The sequence length a length-dependent rotation (dynamic RoPE) is sized on: as transformers'
        ``dynamic_rope_update``, max(position_ids) + 1 over the batch, so left padding does not count (positions
        from the caller or counted over the 2D mask's real tokens); otherwise the keys' own positions ``k_pos``
        (a fine-tune's placed positions, as PoSE hands them to a native model, or a uniform offset)."""
        if not self.rotation_depends_on_length:
            return site.Tk + site.shift
        if site.placed:
            return int(k_pos.max()) + 1
        if site.position_inputs:
            return int(site.token_positions(k_pos.device).max()) + 1
        return site.Tk + site.shift + site.offset  # k_pos's last + 1, without reading the tensor back

    def _far_view(self, site: Site, q, k, reach: int) -> Far:
        """The second view of a two-view rotary scheme: q (and, for SelfExtend, k) rotated at ``far_positions`` of
        each token's absolute position (per batch row where left padding moves a row's tokens off their slots:
        SelfExtend's grouping is not shift-invariant). Keys in the cache are unrotated (``keys_reread``)."""
        if site.placed:
            raise RetrofitError(
                f"rope extension {self.options.extension!r} is training-free: it takes no fine-tune's PoSE or "
                "randomized positions"
            )
        if not site.causal:
            raise RetrofitError(f"rope extension {self.options.extension!r} needs causal attention (a decoder)")
        Tk, device = k.shape[-2], q.device
        slots = site.place(torch.arange(Tk, device=device) + site.shift)  # (Tk,) positions without padding
        moves = site.row_shifts(device) if self.keys_reread else None
        if moves is None or bool((moves == moves[0]).all()):  # every row at the same positions: no copy per row
            pos = slots if moves is None else torch.arange(Tk, device=device) + int(moves[0]) + site.offset
            q_pos, k_pos = self.far_positions(pos[site.q_start :], pos)
            far_k = self.rotate(None, k, k_pos, Tk) if self.keys_reread else None
            return Far(self.rotate(None, q, q_pos, Tk), far_k, reach)
        far_q, far_k = torch.empty_like(q), torch.empty_like(k)
        for moved in moves.unique().tolist():
            rows = (moves == moved).nonzero()[:, 0]
            pos = torch.arange(Tk, device=device) + moved + site.offset
            q_pos, k_pos = self.far_positions(pos[site.q_start :], pos)
            far_q[rows] = self.rotate(None, q[rows], q_pos, Tk)
            far_k[rows] = self.rotate(None, k[rows], k_pos, Tk)
        return Far(far_q, far_k, reach)


class RelativeScheme(Scheme):
    """The ``"relative"`` kind: a query-dependent positional term (Transformer-XL, NEZHA): ``relative_queries``
    gives the content and position queries, ``relative_keys`` one vector per distance; ``prepare`` gives the
    kernels the position side (``kernels.Relative``)."""

    def relative_queries(self, layer: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError(f"scheme {self.name!r} defines no relative queries")

    def relative_keys(
        self, layer: int, n: int, dtype: torch.dtype, device: torch.device, start: int = 0
    ) -> torch.Tensor:
        raise NotImplementedError(f"scheme {self.name!r} defines no relative keys")

    # ---- facts a kernel may exploit (None: no) ------------------------------------------------
    def relative_sinusoid(self, layer: int, device=None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(proj (H, D, dim), freqs (dim / 2,)) when ``relative_keys(layer, n)[h, d] == proj[h] @ R(d)`` exactly,
        R(d) interleaving sin and cos of ``d * freqs`` (the ``sdpa-relative-dims`` kernel serves it), on ``device``;
        else None."""
        return None

    def relative_reach(self) -> int | None:
        """K when ``relative_keys`` is flat from distance K on (the ``cpu-flash-relative-band`` kernel serves
        it); else None."""
        return None

    def prepare(self, site: Site, q: torch.Tensor, k: torch.Tensor) -> Term:
        """The content query (Transformer-XL: q + u) and the position side: the position query (q + v) with one key
        vector per distance this call can meet (distances only, so a sliding-window cache's shift does not enter;
        a block's own positions may span more), the negative ones too where keys after the query count."""
        self.check_direction(site)
        q, k = self.normed(site, q, k)
        q, rel_q = self.relative_queries(site.layer, q)
        times, tau = self.tempered(site, q)
        if times is not None:
            q, rel_q = q * times, rel_q * times
        positions = site.place(torch.arange(site.Tk, device=q.device)) if site.placed else None
        n = int(positions.max() - positions.min()) + 1 if site.placed else site.Tk
        first = 0 if site.causal else -(n - 1)
        keys = self.relative_keys(site.layer, n - first, rel_q.dtype, rel_q.device, start=first)  # (H or 1, ., D)
        sinusoid = self.relative_sinusoid(site.layer, rel_q.device)
        relative = Relative(rel_q, keys, positions, sinusoid=sinusoid, reach=self.relative_reach(), first=first)
        return Term(q, k, relative=relative, row_scale=tau)


class AbsoluteScheme(Scheme):
    """The ``"absolute"`` kind: adds to the embeddings, ``embed(position_ids, dtype)``; no term in the scores."""

    def embed(self, position_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError(f"scheme {self.name!r} defines no embedding")


class NoneScheme(Scheme):
    """The ``"none"`` kind: nothing (the causal mask alone carries order)."""


# the base a scheme of each kind subclasses (its kind is its catalog line's: foundation/catalog.py)
KIND_BASES: dict[str, type[Scheme]] = {
    "bias": BiasScheme,
    "relative": RelativeScheme,
    "rotary": RotaryScheme,
    "absolute": AbsoluteScheme,
    "none": NoneScheme,
}


def gather_per_head(table: torch.Tensor, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``table[h, idx]`` for a per-head table (H, E), elementwise-broadcast like a bias: ``h`` (H', 1, ..., 1)
    with ``idx`` (1, ...) gives (H', ...) through one ``index_select`` over the flattened indices (no
    broadcast index tensors of the output's size); 0-d ``h`` and ``idx`` (FlexAttention) give a 0-d value."""
    if h.dim() == 0 or idx.dim() != h.dim() or idx.shape[0] != 1 or any(s != 1 for s in h.shape[1:]):
        return table[h, idx]
    rows = table.index_select(0, h.reshape(-1))  # (H', E)
    return rows.index_select(1, idx.reshape(-1)).view(rows.shape[0], *idx.shape[1:])
