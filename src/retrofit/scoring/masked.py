"""A masked LM's per-token losses over a token stream: one seeded draw of masked tokens (``masking``: BERT's
rule) scored in non-overlapping windows (``full_nll``) or each token from the window where it is most
central (``sliding_nll``, ``windows.centred_spans``); NaN where a token is not masked."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .masking import IGNORE, Masker
from .windows import centred_spans

SEED = 1234  # the one draw of masked tokens every model and length scores
RATE = 0.15  # BERT's share of masked tokens


@dataclass
class MaskedStream:
    inputs: torch.Tensor  # (n,) the stream with masked tokens replaced
    labels: torch.Tensor  # (n,) the original id where masked, IGNORE elsewhere
    chars_per_token: float


def masked_stream(ids: torch.Tensor, tokenizer, vocab_size: int, rate: float = RATE, seed: int = SEED):
    """The token stream ``ids`` (n,) masked once (BERT's rule); its characters per token for BPC."""
    masker = Masker.of(tokenizer, vocab_size, rate)
    inputs, labels = masker(ids[None], seed)  # (1, n) each
    chars = len(tokenizer.decode(ids.tolist()))
    return MaskedStream(inputs[0], labels[0], chars / max(1, ids.numel()))


def _scored(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """NLL (float64) at ``y``'s masked positions, NaN elsewhere; x, y (B, T)."""
    dev = next(model.parameters()).device
    logits = model(input_ids=x.to(dev)).logits.float()  # (B, T, V)
    nll = F.cross_entropy(logits.transpose(1, 2), y.to(dev), reduction="none", ignore_index=IGNORE)  # (B, T)
    return torch.where(y.to(dev) == IGNORE, torch.nan, nll).double().cpu()


def full_nll(model, s: MaskedStream, length: int, on_window: Callable[[int], None] | None = None) -> np.ndarray:
    """(n,) NLL of each masked token read in its non-overlapping window of ``length`` tokens (the last window
    shorter where ``length`` does not divide n: every row scores every masked token; NaN: not masked)."""
    n = s.inputs.numel()
    out = np.full(n, np.nan)
    with torch.inference_mode():
        for a in range(0, n, length):
            out[a : a + length] = _scored(model, s.inputs[None, a : a + length], s.labels[None, a : a + length])[0]
            if on_window:
                on_window(1)
    return out


def sliding_nll(
    model, s: MaskedStream, window: int, stride: int | None = None, on_window: Callable[[int], None] | None = None
) -> np.ndarray:
    """(n,) NLL of each masked token read from the window where it is most central (``centred_spans``)."""
    n, out = s.inputs.numel(), np.full(s.inputs.numel(), np.nan)
    with torch.inference_mode():
        for start, end, a, b in centred_spans(n, window, stride or max(1, window // 2)):
            nll = _scored(model, s.inputs[None, start:end], s.labels[None, start:end])[0]  # (end - start,)
            out[a:b] = nll[a - start : b - start]
            if on_window:
                on_window(1)
    return out


def summary(nll: np.ndarray, chars_per_token: float) -> dict:
    """Masked-token NLL, perplexity and bits per character over the masked tokens of ``nll``."""
    mean = float(np.nanmean(nll))
    return {
        "nll": mean,
        "ppl": math.exp(mean),
        "bpc": mean / math.log(2) / chars_per_token,
        "masked_tokens": int(np.sum(~np.isnan(nll))),
    }
