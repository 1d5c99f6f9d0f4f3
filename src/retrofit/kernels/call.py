"""One attention call as one record: q, k, v and every hint a kernel may use (``Call``).
``patch/attention.py`` builds it once per call, from the ``Term`` a scheme kind's ``prepare`` gives; the table
(``src/retrofit/kernels/__init__.py``) hands it to the first kernel that serves it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

BiasFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (h, q_pos, k_pos) -> bias
CHUNK_ELEMENTS = 1 << 25  # max elements of one chunk's (H, C, Tk) score tensor (128 MiB in fp32)


class Unavailable(RuntimeError):
    """A kernel that cannot run in this process (flex: no compiler, or it failed); ``label`` says which."""

    def __init__(self, label: str, message: str):
        super().__init__(message)
        self.label = label


@dataclass
class Relative:
    """A query-dependent positional term (Transformer-XL, NEZHA): the logit of query i and key j gains
    ``query[i] . keys[d - first]`` (times ``scaling``), d = pos[i] - pos[j]. Built per query chunk from the chunk's
    distances only: (B, H, C, C + Tc) logits, never H x N x N, so memory stays linear in N."""

    query: torch.Tensor  # (B, H, Tq, D) the position-side query (Transformer-XL: q + v), scaled like q
    keys: torch.Tensor  # (H or 1, n, D) one vector per distance 0 .. n - 1
    positions: torch.Tensor | None = None  # (Tk,) the key slots' positions (a block's own); None: slot indices
    # (proj (H, D, dim), freqs (dim / 2,)) when keys[h, d] == proj[h] @ R(d) exactly, R(d) the sin (even) and cos
    # (odd channels) of d * freqs (Transformer-XL): the term then factorises into functions of i and of j
    sinusoid: tuple[torch.Tensor, torch.Tensor] | None = None
    reach: int | None = None  # keys[d] == keys[reach] for every d >= reach (NEZHA's clipped table)
    first: int = 0  # the distance of keys[:, 0]: -(n - 1) where keys after the query count (an encoder)


@dataclass
class Far:
    """A two-view rotary scheme's second view (SelfExtend, STRING): the logit of query i and key j with
    ``pos_i - pos_j >= reach`` is ``q[i] . k[j]`` of these tensors (rotated at the far view's positions) instead
    of the call's own."""

    q: torch.Tensor  # (B, H, Tq, D)
    k: torch.Tensor  # (B, H or Hkv, Tk, D)
    reach: int


@dataclass
class Term:
    """What a scheme kind's ``prepare`` hands the kernels: q and k as the scores read them and the positional term,
    each by the name of the ``Call`` field it fills (``patch/attention.py`` builds the ``Call`` from it)."""

    q: torch.Tensor  # (B, H, Tq, D)
    k: torch.Tensor  # (B, H or Hkv, Tk, D)
    bias: Any = None  # bias(h, i, j) of slot indices
    bias_params: tuple = ()  # the tensors ``bias`` is computed from
    slopes: torch.Tensor | None = None  # ALiBi's (H,), scaled
    band: torch.Tensor | None = None  # T5's / Shaw's (H, K + 1), scaled
    distance_only: bool = False  # the bias reads i - j alone for every query of the call
    row_scale: torch.Tensor | None = None  # the temperature left to the row scale (None once folded into the bias)
    relative: Relative | None = None  # a relative scheme's position side
    far: Far | None = None  # a two-view rotary scheme's far view
    row_shifts: torch.Tensor | None = None  # (B,) per-row shifts where rows sit at different positions
    bias_at: Any = None  # bias_at(moved): the bias of rows moved by ``moved``

    def fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass
class Call:
    """Attention of q over k, v; query i sits at key slot ``q_start + i``; ``causal``: keys up to the query's
    slot (a decoder), else every key (an encoder's bidirectional attention). Normalised on creation:
    an all-real padding mask, a window every key of the call is within, and a row scale without a bias
    are dropped; half-precision q with a row scale drops the slopes (the dims kernel would round tau)."""

    q: torch.Tensor  # (B, H, Tq, D)
    k: torch.Tensor  # (B, H or Hkv, Tk, D): grouped-query keys (Hkv < H) as they are
    v: torch.Tensor  # (B, H or Hkv, Tk, D)
    scaling: float
    bias: BiasFn | None = None  # bias(h, i, j) added to the scores, i and j slot indices
    bias_params: tuple[torch.Tensor, ...] = ()  # the tensors ``bias`` is computed from (for their gradients)
    slopes: torch.Tensor | None = None  # (H,) when bias(h, i, j) == -slopes[h] * (i - j) exactly (ALiBi)
    band: torch.Tensor | None = None  # (H, K + 1) when bias(h, i, j) == band[h, min(i - j, K)] exactly (T5, Shaw)
    # bias(h, i, j) depends on i - j alone for every query of the call (i >= j): one value per distance
    distance_only: bool = False
    row_scale: torch.Tensor | None = None  # (B or 1, Tq) multiplies query row i's bias (a temperature) -> (B, Tq)
    relative: Relative | None = None  # a query-dependent term added to the logits
    key_padding: torch.Tensor | None = None  # (B, Tk) bool, True = real token
    window: int | None = None  # keys with i - j >= window are masked
    q_start: int = 0
    dropout: float = 0.0
    causal: bool = True  # False: keys after the query too (bidirectional); a window then spans |i - j| < window
    # the model's own score terms (gemma2's softcap, gpt_oss's sinks): only a kernel that ``scores`` applies them
    softcap: float | None = None  # content logits s -> softcap * tanh(s / softcap), before any positional term
    sinks: torch.Tensor | None = None  # (H,) one extra logit per head in every softmax, its value dropped
    far: Far | None = None  # a second view for the far keys (SelfExtend, STRING): only a kernel that ``two_view``s
    # rows at different positions (left padding, position ids, under a bias that reads them): (B,) each row's shift,
    # and bias_at(shift) the bias of rows moved by it; ``attend`` runs one call per group of rows that share one
    row_shifts: torch.Tensor | None = None
    bias_at: Callable[[int], BiasFn] | None = None

    @property
    def scored(self) -> str | None:
        """What of the model's own score terms this call carries (None: nothing)."""
        said = [
            w
            for w, x in (("attention-logit softcapping", self.softcap), ("attention sinks", self.sinks))
            if x is not None
        ]
        return " and ".join(said) or None

    def __post_init__(self):
        if self.row_scale is not None and self.bias is not None:
            if self.q.dtype not in (torch.float32, torch.float64):
                self.slopes = None  # the dims kernel's q side would round tau in half precision
            self.row_scale = self.row_scale.to(torch.float32).expand(self.q.shape[0], self.Tq)  # (B, Tq)
        else:
            self.row_scale = None
        if self.key_padding is not None and bool(self.key_padding.all()):
            self.key_padding = None
        if self.window and self.causal and self.q_start + self.Tq <= self.window:  # every key is within the window
            self.window = None

    @property
    def Tq(self) -> int:
        return self.q.shape[-2]

    @property
    def Tk(self) -> int:
        return self.k.shape[-2]

    @property
    def positional(self) -> bool:
        """A positional term enters the scores (a bias, its slopes or band, a relative term): the model's kernel
        choice applies."""
        return any(x is not None for x in (self.bias, self.slopes, self.band, self.relative, self.far))

    @property
    def masked(self) -> bool:
        return self.key_padding is not None or bool(self.window)

    @property
    def full(self) -> bool:
        """Full causal self-attention: no cached prefix, more than one query."""
        return self.q_start == 0 and self.Tq == self.Tk > 1

    @property
    def grad(self) -> bool:
        return torch.is_grad_enabled() and self.q.requires_grad

    def rows(self, idx: torch.Tensor, bias: BiasFn) -> Call:
        """The call of batch rows ``idx`` with a bias of their own (rows moved by the same shift)."""
        pick = lambda t: None if t is None else t[idx] if t.shape[0] > 1 else t  # noqa: E731
        return dataclasses.replace(
            self,
            q=self.q[idx],
            k=self.k[idx],
            v=self.v[idx],
            bias=bias,
            row_shifts=None,
            bias_at=None,
            key_padding=pick(self.key_padding),
            row_scale=pick(self.row_scale),
            far=None if self.far is None else Far(self.far.q[idx], self.far.k[idx], self.far.reach),
        )

    def full_heads(self) -> Call:
        """Grouped-query keys repeated per head: (B, Hkv, Tk, D) -> (B, H, Tk, D)."""
        H, Hkv = self.q.shape[1], self.k.shape[1]
        if H == Hkv:
            return self
        k, v = (x.repeat_interleave(H // Hkv, dim=1) for x in (self.k, self.v))
        far = self.far
        if far is not None and far.k is self.k:  # STRING: the far view's keys are the call's own, repeated once
            far = Far(far.q, k, far.reach)
        elif far is not None and far.k.shape[1] != H:
            far = Far(far.q, far.k.repeat_interleave(H // far.k.shape[1], dim=1), far.reach)
        return dataclasses.replace(self, k=k, v=v, far=far)


def chunk_rows(H: int, Tq: int, Tk: int) -> int:
    """Query rows per chunk so that one (H, C, Tk) score tensor stays under ``CHUNK_ELEMENTS`` (at least 16)."""
    return max(16, min(Tq, CHUNK_ELEMENTS // max(1, H * Tk)))
