"""Transformer-XL relative positions (Dai et al., 2019, "Transformer-XL: Attentive Language Models beyond
a Fixed-Length Context", sec. 3.3). The score of query i and key j is

    A_ij = q_i . k_j  +  q_i . W_R R_{i-j}  +  u . k_j  +  v . W_R R_{i-j}
         = (q_i + u) . k_j  +  (q_i + v) . r_{i-j},        r_d = W_R R_d,

(times the usual 1/sqrt(d)): content, query-dependent position, global content bias ``u`` and global
position bias ``v`` (per head), with R_d a fixed sinusoid of the distance and W_R a learned projection
to every head's key space. The positional term depends on the query, so this is a ``"relative"`` scheme:
the kernel builds each query chunk's (B, H, C, C + Tc) distance logits and gathers them (``kernels.Relative``),
never an H x N x N tensor.

Options: ``dim`` (width of R; default the head dim, where the paper used the model width: a smaller
projection, (L, H x D, dim)), ``per_layer`` (W_R, u, v per layer, default; False: shared, as the paper's
tied u, v), ``init``: ``"zero"`` (default) starts W_R, u and v at zero, so a freshly converted model is the
content term alone (the original's attention without its positions) and the positional terms grow from
there (the gradient of W_R is (q_i + v) R^T, non-zero from the first step); ``"random"``: N(0, 0.02) as
the paper's code. R interleaves sin and cos channels (the reference code concatenates them: the same
function up to a permutation of W_R's columns).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..foundation.errors import OptionError
from .kinds import RelativeScheme
from .options import option
from .sinusoidal import frequencies, sinusoids
from .spec import ModelSpec

INITS = ("zero", "random")
INIT_STD = 0.02


class TransformerXL(RelativeScheme):
    shift_invariant = True

    @dataclass
    class Options:
        dim: int | None = option(
            None,
            "width of the sinusoidal distance encoding R (even); default: the head dim (the paper: the model width)",
        )
        base: float = option(10000.0, "wavelength base of R (the paper's 10000)")
        per_layer: bool = option(True, "W_R, u and v per layer (False: one set shared by all layers)")
        init: str = option(
            "zero",
            "zero: W_R, u, v start at 0 (the content term alone, no positional noise); "
            "random: N(0, 0.02) as the paper's code",
            INITS,
        )

    @classmethod
    def resolve_defaults(cls, spec, opts):
        if opts.dim is None:
            opts.dim = spec.head_dim + spec.head_dim % 2
        if opts.dim < 2 or opts.dim % 2:
            raise OptionError(f"xl: dim must be an even number >= 2; got {opts.dim}")
        if opts.base <= 1:
            raise OptionError(f"xl: base must be > 1; got {opts.base}")
        return opts

    def __init__(self, spec: ModelSpec, options):
        super().__init__(spec, options)
        n, H, D = (spec.num_layers if options.per_layer else 1), spec.num_heads, spec.head_dim
        shapes = {"proj": (n, H * D, options.dim), "u": (n, H, D), "v": (n, H, D)}
        g = torch.Generator().manual_seed(0)
        for key, shape in shapes.items():
            value = torch.zeros(shape) if options.init == "zero" else torch.randn(shape, generator=g) * INIT_STD
            setattr(self, key, nn.Parameter(value))
        self._tables: dict[int, tuple] = {}  # inference cache of r per layer (see relative_keys)

    def _li(self, layer: int) -> int:
        return layer if self.options.per_layer else 0

    def relative_queries(self, layer: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, H, T, D) -> the content query q + u and the position query q + v."""
        li = self._li(layer)
        return q + self.u[li][:, None, :].to(q.dtype), q + self.v[li][:, None, :].to(q.dtype)

    def relative_keys(
        self, layer: int, n: int, dtype: torch.dtype, device: torch.device, start: int = 0
    ) -> torch.Tensor:
        """r_d = W_R R_d for distances d = start .. start + n - 1 -> (H, n, D) (an encoder's keys after the query:
        negative d, the same sinusoid). Without grad the table from 0 is kept per layer (grown by doubling,
        rebuilt when W_R changes), so decoding does not re-project every distance each step."""
        li = self._li(layer)
        W = self.proj[li].to(device)  # (H * D, dim)
        if start or (torch.is_grad_enabled() and W.requires_grad):
            return self._project(W, n, dtype, start)
        key = (W._version, W.device, dtype)
        cached = self._tables.get(li)
        if cached is None or cached[0] != key or cached[1].shape[1] < n:
            size = max(n, 2 * cached[1].shape[1]) if cached is not None and cached[0] == key else n
            cached = (key, self._project(W, size, dtype))
            self._tables[li] = cached
        return cached[1][:, :n]

    def relative_sinusoid(self, layer: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """r_d = W_R R_d per head: (W_R as (H, D, dim), R's frequencies), on ``device`` (default: the table's)."""
        W = self.proj[self._li(layer)].to(device or self.proj.device)
        return W.view(self.spec.num_heads, self.spec.head_dim, -1), frequencies(
            self.options.dim, self.options.base, W.device
        )

    def _project(self, W: torch.Tensor, n: int, dtype: torch.dtype, start: int = 0) -> torch.Tensor:
        R = sinusoids(torch.arange(start, start + n, device=W.device), self.options.dim, self.options.base)  # (n, dim)
        r = R @ W.float().T  # (n, H * D)
        return r.view(n, self.spec.num_heads, self.spec.head_dim).transpose(0, 1).to(dtype)  # (H, n, D)
