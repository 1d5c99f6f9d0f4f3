"""FIRE (Li et al., 2023, "Functional Interpolation for Relative Positions Improves Long Context
Transformers"): a learned function of the log-transformed, length-normalised offset,

    b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(c x + 1),

with f_theta an MLP 1 -> ``width`` -> H (ReLU), c a learned scalar (init 0.1, as the paper's
reference code) and L a threshold that is learned as |s x L0| (``learned_threshold``, s init 1)
or fixed at L0 = ``threshold`` (default: the native length). Normalising by the query position
maps every offset into [0, 1], so longer inputs interpolate rather than extrapolate.

Initialisation (``init="alibi"``, default): f_theta is fitted, in closed form, to ALiBi's
-slope_h x (i - j) for queries inside the threshold (where the normaliser is fixed at psi(L)):
the first layer is a fixed hinge basis relu(x - k / width), the second layer its least-squares
fit. It is deterministic and needs no training loop; the converted model starts with ALiBi's
recency instead of a random bias. ``init="random"``: the usual Linear init (seeded).

Parameters, per layer (``per_layer=True``, default) or shared: ``w1``, ``b1`` (L, width),
``w2`` (L, H, width), ``b2`` (L, H), ``c`` (L,), and ``threshold_scale`` (L,) when learned;
about (H + 2) x width scalars per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..foundation.errors import OptionError
from .alibi import alibi_slopes
from .kinds import BiasScheme, gather_per_head
from .options import option
from .spec import ModelSpec

INITS = ("alibi", "random")
INIT_C = 0.1


def alibi_fit(width: int, slopes: list[float], threshold: float, c: float = INIT_C):
    """Hinge-basis MLP weights whose output approximates -slope_h x d for d in [0, threshold]
    (where x = psi(d) / psi(threshold)). Returns w1 (width,), b1 (width,), w2 (H, width), b2 (H,)."""
    x = torch.linspace(0, 1, 4 * max(width, 256), dtype=torch.float64)  # (S,)
    distance = ((c * threshold + 1) ** x - 1) / c  # psi^-1(x psi(L)): the offset that maps to x
    knots = torch.arange(width, dtype=torch.float64) / width
    basis = torch.cat([torch.ones_like(x)[:, None], torch.relu(x[:, None] - knots[None, :])], 1)  # (S, 1 + width)
    coef = torch.linalg.lstsq(basis, distance[:, None]).solution[:, 0]  # (1 + width,)
    s = torch.tensor(slopes, dtype=torch.float64)
    return torch.ones(width), (-knots).float(), (-s[:, None] * coef[None, 1:]).float(), (-s * coef[0]).float()


def normalised_distance(c: torch.Tensor, threshold, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """psi(i - j) / (psi(max(L, i)) + eps), psi(x) = log(|c| x + 1); c 0-d, threshold 0-d or a float."""
    c = c.abs()
    rel = (q_pos - k_pos).clamp(min=0).to(torch.float32)  # future keys are masked anyway
    q = q_pos.to(torch.float32)
    q = torch.maximum(q, threshold) if isinstance(threshold, torch.Tensor) else q.clamp(min=threshold)
    # eps 1e-6 (the paper's) as a literal: torch.compile(dynamic=True) lifts a float global to a tensor + .item()
    return torch.log(c * rel + 1) / (torch.log(c * q + 1) + 1e-6)


class FIRE(BiasScheme):
    bidirectional = False  # defined for keys before the query only (a decoder); refused on an encoder

    @dataclass
    class Options:
        width: int = option(32, "hidden width of the MLP f_theta (the paper's 32)")
        threshold: int | None = option(
            None, "L: queries before it share the normaliser psi(L); default: the native length"
        )
        learned_threshold: bool = option(True, "learn L (as |s x threshold|, s init 1), as in the paper")
        per_layer: bool = option(True, "one FIRE module per layer (False: one shared by all layers)")
        init: str = option("alibi", "alibi: fit f_theta to ALiBi's recency at convert time; random: Linear init", INITS)

    @classmethod
    def resolve_defaults(cls, spec, opts):
        if opts.threshold is None:
            opts.threshold = spec.native_length
        if opts.threshold < 1 or opts.width < 1:
            raise OptionError(f"fire: threshold and width must be >= 1; got {opts.threshold}, {opts.width}")
        return opts

    def __init__(self, spec: ModelSpec, options):
        super().__init__(spec, options)
        n, H, W = (spec.num_layers if options.per_layer else 1), spec.num_heads, options.width
        if options.init == "alibi":
            w1, b1, w2, b2 = alibi_fit(W, alibi_slopes(H), float(options.threshold))
        else:
            g = torch.Generator().manual_seed(0)
            w1, b1 = torch.rand(W, generator=g) * 2 - 1, torch.rand(W, generator=g) * 2 - 1  # fan_in 1
            bound = 1 / math.sqrt(W)
            w2, b2 = (torch.rand(H, W, generator=g) * 2 - 1) * bound, (torch.rand(H, generator=g) * 2 - 1) * bound
        self.w1 = nn.Parameter(w1.repeat(n, 1))  # (L, W)
        self.b1 = nn.Parameter(b1.repeat(n, 1))  # (L, W)
        self.w2 = nn.Parameter(w2.repeat(n, 1, 1))  # (L, H, W)
        self.b2 = nn.Parameter(b2.repeat(n, 1))  # (L, H)
        self.c = nn.Parameter(torch.full((n,), INIT_C))  # (L,)
        if options.learned_threshold:
            self.threshold_scale = nn.Parameter(torch.ones(n))  # (L,)

    def threshold(self, li: int) -> torch.Tensor | float:
        if self.options.learned_threshold:
            return (self.threshold_scale[li] * self.options.threshold).abs()
        return float(self.options.threshold)

    def distance_only(self, layer: int, last: int) -> bool:
        """Queries before the threshold share the normaliser psi(L): their bias is a function of i - j alone."""
        with torch.no_grad():
            return last < float(self.threshold(layer if self.options.per_layer else 0))

    def normalised_distance(self, li: int, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """psi(i - j) / psi(max(L, i)), in [0, 1] for causal pairs (broadcast shape of q_pos, k_pos)."""
        return normalised_distance(self.c[li], self.threshold(li), q_pos, k_pos)

    def mlp(self, li: int, x: torch.Tensor) -> torch.Tensor:
        """f_theta: (...,) -> (..., H)."""
        hidden = torch.relu(x[..., None] * self.w1[li] + self.b1[li])  # (..., W)
        return nn.functional.linear(hidden, self.w2[li], self.b2[li])  # (..., H)

    def segments(self, li: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """f_theta as the piecewise-linear function it is (a 1-D ReLU MLP): sorted breakpoints (W,) and,
        per segment, slopes and intercepts (W + 1, H), so f(x) = slope[s] x + intercept[s] with
        s = searchsorted(breakpoints, x). Exact, with the MLP's gradients (the active set is locally constant)."""
        w1, b1 = self.w1[li], self.b1[li]  # (W,)
        with torch.no_grad():
            safe = torch.where(w1 == 0, torch.ones_like(w1), w1)
            brk = torch.where(w1 == 0, torch.full_like(w1, 1e6), -b1 / safe).sort().values  # (W,); w1 = 0: no break
            mid = torch.cat(
                [brk[:1] - 1, (brk[1:] + brk[:-1]) / 2, brk[-1:] + 1]
            )  # (W + 1,) a point inside each segment
            active = (mid[:, None] * w1 + b1 > 0).to(w1.dtype)  # (W + 1, W)
        slope = (active * w1) @ self.w2[li].T  # (W + 1, H)
        intercept = (active * b1) @ self.w2[li].T + self.b2[li]  # (W + 1, H)
        return brk, slope, intercept

    def bias(self, layer, h, q_pos, k_pos):
        li = layer if self.options.per_layer else 0
        x = self.normalised_distance(li, q_pos, k_pos)
        if h.dim() == 0:  # FlexAttention score_mod: scalars, the MLP itself
            # written pointwise, unrolled over the hidden units (flex cannot lower a reduction in a score_mod)
            w1, b1, w2 = self.w1[li], self.b1[li], self.w2[li][h]  # (W,), (W,), (W,)
            out = self.b2[li][h]
            for k in range(self.options.width):
                out = out + w2[k] * torch.relu(x * w1[k] + b1[k])
            return out
        # chunked kernel: h (H', 1, 1), x (1, C, Tk) -> (H', C, Tk): two gathers and one multiply-add per
        # element instead of a (C, Tk, W) hidden layer
        if x.dim() != h.dim() or x.shape[0] != 1 or any(s != 1 for s in h.shape[1:]):
            raise ValueError(
                f"fire.bias expects h (H, 1, ..., 1) and positions (1, ...); got {tuple(h.shape)}, {tuple(x.shape)}"
            )
        brk, slope, intercept = self.segments(li)
        seg = torch.searchsorted(brk, x.contiguous())  # (1, C, Tk) segment index
        return gather_per_head(intercept.T, h, seg).addcmul_(gather_per_head(slope.T, h, seg), x)  # (H', C, Tk)
