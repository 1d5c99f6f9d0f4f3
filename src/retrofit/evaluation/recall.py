"""Recall: copy a random span of tokens seen earlier in the context (an induction test).

Passkey asks a model to follow an instruction and read out a number, which models of a few million
parameters cannot do even at their native length. Recall asks only for copying, the behaviour of
induction heads (Olsson et al., 2022). Each trial of length ``L`` is, in tokens:

    [BOS] <text> <span: k random tokens> <text> <the span's first m tokens> | <the span's last k - m tokens>
    '----------- filler of the eval text, the span at depth d -----------'   '------ continuation ------'

* **The span** is ``k`` (``span``) random token ids, drawn uniformly, with replacement, from the distinct
  non-special tokens of the eval text. Random order: no language knowledge predicts it, only copying
  does. The pool is the eval text's tokens rather than the whole vocabulary so that every token is one
  the model was trained on (a vocabulary also holds tokens no training text reached, whose
  embeddings are noise: a failure to copy those says little about positions).
* **The filler** is a window of the eval text (the tokens the perplexity rows score) at a seeded
  offset; the span is inserted at depth ``d`` of it (0 = first, 1 = just before the cue).
* **The cue** is the span's first ``m`` (``cue``) tokens, at the very end; the model must continue with the
  other ``k - m``.

Scoring takes **one forward pass** over the whole ``L`` tokens (prompt and continuation), teacher
forced: at each continuation position, the argmax given the true previous tokens, and the
log-probability of the true token. Greedy decoding produces the same tokens as these argmaxes for as
long as every earlier one was right, so "every argmax right" (``exact``) is exactly "greedy decoding
produces the whole continuation": the exact-match accuracy equals greedy generation's at the cost of
one forward instead of ``k - m``. ``token_accuracy`` (share of continuation tokens whose teacher-forced
argmax is right) and ``mean_logprob`` (mean log-probability per continuation token, natural log) are
graded measures beside it: they still move when no trial is exactly right.

Trials are paired: trial ``j`` of every cell (every model, length and depth) copies the same span,
so the cells differ only in where it sits and how much text surrounds it.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass

import torch

from .passkey import bos_prefix


@dataclass(frozen=True)
class RecallPrompt:
    ids: list[int]  # [length]: prompt then continuation
    span: list[int]
    depth: float
    span_index: int  # where the span starts, in tokens
    cue: int  # m

    @property
    def continuation_start(self) -> int:
        """Index of the first continuation token (the model predicts it from the position before)."""
        return len(self.ids) - (len(self.span) - self.cue)


def token_pool(text_ids: list[int], tokenizer) -> list[int]:
    """The distinct non-special token ids of the eval text, sorted (the spans' alphabet)."""
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    pool = sorted(set(text_ids) - special)
    if len(pool) < 2:
        raise ValueError(f"the eval text has {len(pool)} distinct ordinary token(s); recall needs at least 2")
    return pool


def make_spans(seed: int, n: int, k: int, pool: list[int]) -> list[list[int]]:
    """``n`` reproducible spans of ``k`` tokens drawn uniformly (with replacement) from ``pool``."""
    rng = random.Random(f"recall-spans:{seed}")
    return [[rng.choice(pool) for _ in range(k)] for _ in range(n)]


def offsets(seed: int, length: int, n: int, filler: int, available: int) -> list[int]:
    """Where each trial's filler starts in the eval text (``filler`` tokens of ``available``)."""
    rng = random.Random(f"recall-offsets:{seed}:{length}")
    return [rng.randrange(0, available - filler + 1) for _ in range(n)]


def room(tokenizer, span: int) -> int:
    """The shortest length a recall prompt fits in: BOS (when the tokenizer adds one), span and its repeat."""
    return len(bos_prefix(tokenizer)) + 2 * span


def build(
    text_ids: list[int], length: int, depth: float, span: list[int], cue: int, offset: int, prefix: list[int] = ()
) -> RecallPrompt:
    """A recall sequence of exactly ``length`` tokens (see the module docstring)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    if not 0 < cue < len(span):
        raise ValueError(f"the cue must be shorter than the span and at least 1 token: cue {cue}, span {len(span)}")
    n = length - len(prefix) - 2 * len(span)
    if n < 0:
        raise ValueError(
            f"a recall prompt with a {len(span)}-token span needs at least {length - n} tokens, got length {length}"
        )
    if offset + n > len(text_ids):
        raise ValueError(f"the eval text has {len(text_ids)} tokens; a filler of {n} from {offset} does not fit")
    filler = list(text_ids[offset : offset + n])
    cut = round(depth * n)
    before = list(prefix) + filler[:cut]
    ids = before + list(span) + filler[cut:] + list(span)
    return RecallPrompt(ids=ids, span=list(span), depth=depth, span_index=len(before), cue=cue)


def _keeps_logits(model) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def score(model, prompt: RecallPrompt) -> dict:
    """One teacher-forced forward: ``{"exact", "tokens_right", "tokens", "logprob"}`` (``logprob``: mean
    natural-log probability per continuation token)."""
    dev = next(model.parameters()).device
    x = torch.tensor([prompt.ids], device=dev)  # [1, L]
    start = prompt.continuation_start
    n = len(prompt.ids) - start  # continuation tokens
    kw = {"logits_to_keep": n + 1} if _keeps_logits(model) else {}
    with torch.inference_mode():
        logits = model(input_ids=x, **kw).logits[0]  # [L or n + 1, V]
    logits = logits[-(n + 1) : -1].float()  # [n, V]: the positions that predict the continuation
    target = x[0, start:]  # [n]
    right = logits.argmax(-1) == target
    logprob = logits.log_softmax(-1).gather(1, target[:, None])[:, 0]
    return {
        "exact": bool(right.all()),
        "tokens_right": int(right.sum()),
        "tokens": n,
        "logprob": round(float(logprob.mean()), 4),
    }
