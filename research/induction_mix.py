"""The stand-ins' induction data, shared by the pilots of docs/results.md ("Stand-ins that copy"): the copy mix
(rows that repeat spans of themselves), the induction toy (random tokens repeated) and a copy curve recorded
while pretraining. ``InductionConfig`` is a ``retrofit.models.standin.StandinConfig`` with the fields of both;
it feeds them to the package's trainer through the config's extension points (``mixer``, ``probe``) and keeps
them in its cache key (``key_fields``), so a mixed stand-in is cached under its own folder and one with the mix
off under the plain config's.

    from induction_mix import InductionConfig
    from retrofit.training.standin import pretrain
    path = pretrain(InductionConfig(name="pilot-gpt2", copy_fraction=0.5, copy_warmup=800, copy_eval_every=80))
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from retrofit.foundation.errors import OptionError
from retrofit.models.standin import ENCODERS, StandinConfig
from retrofit.training.standin import copy_probe

# the induction fields at these values leave the key alone: a config with the mix off is the plain config
KEY_DEFAULTS = {
    "copy_fraction": 0.0,
    "copy_random": 0.5,
    "copy_max_span": 64,
    "copy_warmup": 0,
    "copy_toy_share": 0.0,
    "copy_toy_min_period": 0,
}


@dataclass(frozen=True)
class InductionConfig(StandinConfig):
    """A stand-in config with the copy mix and the induction toy."""

    # the copy mix: this share of training blocks repeats spans of the block later in it, at uniform
    # distances; of those spans, ``copy_random`` repeat random tokens rather than the block's text
    copy_fraction: float = 0.0
    copy_random: float = 0.5
    copy_max_span: int = 64  # spans of 8..copy_max_span tokens (at most a quarter of the block)
    copy_warmup: int = 0  # the first steps train on the induction toy alone: random sequences repeated to fill a row
    copy_toy_share: float = 0.0  # after the warm-up, this share of every batch's rows stays the toy (keeps the heads)
    copy_toy_min_period: int = 0  # 0: the toy's second half repeats its first; else a period of min..L/2, tiled
    copy_eval_every: int = 0  # measure copying on held-out text every this many steps (0: at the end only)

    def __post_init__(self):
        super().__post_init__()
        if not all(0.0 <= v <= 1.0 for v in (self.copy_fraction, self.copy_random, self.copy_toy_share)):
            raise OptionError("copy_fraction, copy_random and copy_toy_share are shares in [0, 1]")
        if self.arch in ENCODERS and (self.copy_fraction or self.copy_warmup or self.copy_toy_share):
            raise OptionError(
                f"the copy mix and the induction toy are next-token data; the {self.arch} stand-in has none"
            )

    def key_fields(self) -> dict:
        fields = super().key_fields()
        fields = {k: v for k, v in fields.items() if not (k in KEY_DEFAULTS and v == KEY_DEFAULTS[k])}
        fields.pop("copy_eval_every", None)  # when copying is measured does not change the weights
        return fields

    def mixer(self, blocks: torch.Tensor):
        gen = torch.Generator().manual_seed(self.seed + 3)
        pool = torch.unique(blocks)  # [P]: the tokens the training text holds

        def mix(x: torch.Tensor, step: int) -> torch.Tensor:
            if step < self.copy_warmup:
                return induction_rows(x.shape, gen, pool, self.copy_toy_min_period)
            if self.copy_fraction:
                x = add_repeats(x, self, gen, pool)
            k = round(self.copy_toy_share * x.shape[0])
            if k:
                x = torch.cat([induction_rows((k, x.shape[1]), gen, pool, self.copy_toy_min_period), x[k:]])
            return x  # [batch, n_positions]

        return mix

    def probe(self, model, held: torch.Tensor, step: int) -> dict | None:
        every = self.copy_eval_every
        if not every or step % every or self.arch in ENCODERS:
            return None
        return copy_probe(model, held, self.n_positions)


def plain(cfg: StandinConfig) -> InductionConfig:
    """``cfg`` (a preset) as an InductionConfig with the mix off: the same key, ready for ``dataclasses.replace``."""
    return InductionConfig(**dataclasses.asdict(cfg))


def add_repeats(x: torch.Tensor, cfg: InductionConfig, gen: torch.Generator, pool: torch.Tensor) -> torch.Tensor:
    """The copy mix: a copy of ``x`` [B, L] where each row, with probability ``cfg.copy_fraction``, repeats
    spans of its own later in the row, until about a quarter of the row is second occurrences. A span of
    ``s`` tokens (8 <= s <= min(copy_max_span, L/4)) at ``a`` is written again at ``b`` (a + s <= b <= L - s,
    so the distance b - a is spread over the whole block). With probability ``cfg.copy_random`` the span is
    first replaced by random tokens of ``pool`` (no language knowledge predicts those; only copying does)."""
    x = x.clone()
    B, L = x.shape
    top = max(8, min(cfg.copy_max_span, L // 4))
    for r in range(B):
        if torch.rand((), generator=gen) >= cfg.copy_fraction:
            continue
        copied = 0
        while copied < L // 4:
            s = int(torch.randint(8, top + 1, (), generator=gen))
            b = int(torch.randint(s, L - s + 1, (), generator=gen))  # second occurrence
            a = int(torch.randint(0, b - s + 1, (), generator=gen))  # first occurrence, ends before b
            if torch.rand((), generator=gen) < cfg.copy_random:
                x[r, a : a + s] = pool[torch.randint(0, len(pool), (s,), generator=gen)]
            x[r, b : b + s] = x[r, a : a + s]
            copied += s
    return x


def induction_rows(
    shape: tuple[int, int], gen: torch.Generator, pool: torch.Tensor, min_period: int = 0
) -> torch.Tensor:
    """[B, L] rows of the induction toy (Olsson et al.'s repeated random tokens): random tokens of ``pool``
    repeated, so every token after the first period is predictable by copying alone. ``min_period`` 0: the
    second half repeats the first; else each row tiles a random sequence of min_period <= p <= L/2 tokens
    (many repeats at many distances: an easier signal for a body whose positions start random)."""
    B, L = shape
    if not min_period:
        half = pool[torch.randint(0, len(pool), (B, L // 2), generator=gen)]  # [B, L/2]
        return torch.cat([half, half, half[:, : L % 2]], 1)  # [B, L]
    rows = []
    for _ in range(B):
        p = int(torch.randint(min(min_period, L // 2), L // 2 + 1, (), generator=gen))
        seq = pool[torch.randint(0, len(pool), (p,), generator=gen)]  # [p]
        rows.append(seq.repeat(L // p + 1)[:L])
    return torch.stack(rows)  # [B, L]
