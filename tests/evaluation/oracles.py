"""Models built to a known behaviour, for the evaluation's measures: one that copies perfectly (an exact
induction head over its whole context, or over a window), one that ignores its context."""

from __future__ import annotations

from types import SimpleNamespace

import torch


class Copier(torch.nn.Module):
    """Predicts the token that followed the latest earlier occurrence of the last ``match`` tokens (an
    induction head, exact), within the last ``window`` tokens (None: the whole context); elsewhere a flat
    distribution. ``confidence`` nats separate the copied token from the rest."""

    def __init__(self, vocab: int, window: int | None = None, match: int = 2, confidence: float = 12.0):
        super().__init__()
        self.vocab, self.window, self.match, self.confidence = vocab, window, match, confidence
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # a device and a dtype to read
        self.config = SimpleNamespace(max_position_embeddings=window or 1 << 30)

    def forward(self, input_ids, **kw):
        B, L = input_ids.shape
        logits = torch.zeros(B, L, self.vocab)
        for b in range(B):
            ids = input_ids[b].tolist()
            last = {}  # tuple of `match` tokens -> the latest position after which it ended
            for t in range(L):
                if t + 1 >= self.match:
                    key = tuple(ids[t + 1 - self.match : t + 1])
                    j = last.get(key)
                    if j is not None and (self.window is None or t - j < self.window) and j + 1 <= t:
                        logits[b, t, ids[j + 1]] = self.confidence
                    if t + 1 < L:
                        last[key] = t
        return SimpleNamespace(logits=logits)
