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


class MaskedCopier(torch.nn.Module):
    """A 'masked LM' that copies exactly: at a run of masked tokens, it takes the ``match`` real tokens just
    before the run, finds their latest other occurrence (either side, within ``window`` of the run when given)
    and predicts the tokens that followed it; elsewhere a flat distribution."""

    def __init__(self, vocab: int, mask_id: int, window: int | None = None, match: int = 2, confidence: float = 12.0):
        super().__init__()
        self.vocab, self.mask_id, self.window, self.match, self.confidence = vocab, mask_id, window, match, confidence
        self.anchor = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, **kw):
        B, L = input_ids.shape
        logits = torch.zeros(B, L, self.vocab)
        for b in range(B):
            ids = input_ids[b].tolist()
            t = 0
            while t < L:
                if ids[t] != self.mask_id or t < self.match:
                    t += 1
                    continue
                end = t
                while end < L and ids[end] == self.mask_id:
                    end += 1
                key = ids[t - self.match : t]
                found = [
                    j
                    for j in range(L - self.match + 1)
                    if j != t - self.match
                    and ids[j : j + self.match] == key
                    and (self.window is None or abs(t - self.match - j) < self.window)
                ]
                if found:
                    j = max(found, key=lambda j: (j < t, j))  # the latest occurrence before, else after
                    for o in range(end - t):
                        p = j + self.match + o
                        if p < L and ids[p] != self.mask_id:
                            logits[b, t + o, ids[p]] = self.confidence
                t = end
        return SimpleNamespace(logits=logits)
