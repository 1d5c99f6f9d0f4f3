"""Retrieval at distance on natural text: does a model *use* what it read ``d`` tokens ago?

One trial of length ``L`` at distance ``d`` with ``n_keys`` spans, in tokens:

    <held-out text ... [span_1] ... [span_2] ... [span_K] ...> <cue: span_t's first m tokens> | <span_t's rest>
                         '-- span_t starts d tokens before the cue --'

* **The spans** are ``k`` consecutive tokens of held-out natural text taken from elsewhere in the text
  (not random tokens): a model's language knowledge predicts them somewhat, and only copying predicts them
  well. The target span ``t`` starts exactly ``d`` tokens before its second occurrence; the other
  ``n_keys - 1`` spans (distractors, each with its own beginning) sit between it and the cue, so a model
  that copies the most recent span it saw fails: the cue picks one.
* **Scored**: the target's last ``k - m`` tokens, once after the cue (second occurrence) and once where
  the span first stood (first occurrence, same model, same forward pass). ``copy_gain`` = mean NLL first
  / mean NLL second (1: no use of the first occurrence; large: copied). ``exact``: every teacher-forced
  argmax of the second occurrence right, which is greedy decoding reproducing the rest of the span.

Trials are paired across models: trial ``j`` at distance ``d`` uses the same text and spans for every
model and every length, so differences between rows are the models'. ``L = d + k + tail`` at least:
the sequence is cut from the left so that it is as short as the distance allows (``length=None``) or a
given length (the rest is filler before the target).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CopyTrial:
    ids: list[int]  # [L]
    first: int  # index of the target span's first occurrence
    second: int  # index of its second occurrence (the cue's start)
    span: int  # k
    cue: int  # m


def build(text_ids: list[int], distance: int, span: int, cue: int, seed: int, trial: int, n_keys: int = 1,
          length: int | None = None, prefix: list[int] = ()) -> CopyTrial:
    """Trial ``trial`` at ``distance`` (see the module docstring). ``length`` (default: the least that fits)
    pads the front with more held-out text; ``prefix`` (a BOS) starts the sequence."""
    if not 0 < cue < span:
        raise ValueError(f"the cue must be shorter than the span and at least 1 token: cue {cue}, span {span}")
    if distance < n_keys * span:
        raise ValueError(f"distance {distance} cannot hold {n_keys} span(s) of {span} tokens")
    need = len(prefix) + distance + span
    length = need if length is None else length
    if length < need:
        raise ValueError(f"a copy trial at distance {distance} needs {need} tokens, got length {length}")
    n_text = length - len(prefix) - span  # held-out text before the cue, target and distractors inside it
    if n_text + n_keys * span > len(text_ids):
        raise ValueError(f"the eval text has {len(text_ids)} tokens; a copy trial of {length} needs more")
    rng = random.Random(f"copy:{seed}:{trial}:{distance}")
    # the spans come from one region of the text, the filler from another (paired across models by the seed)
    span_src = random.Random(f"copy-spans:{seed}:{trial}").randrange(0, len(text_ids) - n_keys * span + 1)
    spans = [list(text_ids[span_src + i * span : span_src + (i + 1) * span]) for i in range(n_keys)]
    off = rng.randrange(0, len(text_ids) - n_text + 1)
    filler = list(text_ids[off : off + n_text])
    first = n_text - distance  # target at exactly `distance` before the cue
    filler[first : first + span] = spans[0]
    # distractors between the target and the cue, evenly spread
    gap = (distance - n_keys * span) // n_keys
    for i in range(1, n_keys):
        at = first + i * (span + gap)
        filler[at : at + span] = spans[i]
    ids = list(prefix) + filler + spans[0]
    return CopyTrial(ids=ids, first=len(prefix) + first, second=len(prefix) + n_text, span=span, cue=cue)


def nll_at(logits: torch.Tensor, ids: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Per-token NLL [stop - start] of ``ids[start:stop]`` from ``logits`` [L, V] (position p predicts p + 1)."""
    lp = logits[start - 1 : stop - 1].float().log_softmax(-1)  # [n, V]
    return -lp.gather(1, ids[start:stop, None])[:, 0]


def score(model, trial: CopyTrial) -> dict:
    """One forward: ``{"nll_first", "nll_second", "exact", "tokens_right", "tokens"}`` over the span's rest."""
    dev = next(model.parameters()).device
    x = torch.tensor(trial.ids, device=dev)  # [L]
    with torch.inference_mode():
        logits = model(input_ids=x[None]).logits[0]  # [L, V]
    a, b, k, m = trial.first, trial.second, trial.span, trial.cue
    first = nll_at(logits, x, a + m, a + k)  # [k - m]
    second = nll_at(logits, x, b + m, b + k)  # [k - m]
    right = logits[b + m - 1 : b + k - 1].argmax(-1) == x[b + m : b + k]
    return {"nll_first": float(first.mean()), "nll_second": float(second.mean()), "exact": bool(right.all()),
            "tokens_right": int(right.sum()), "tokens": k - m}


def summarize(rows: list[dict]) -> dict:
    """Trials of one cell -> copy gain (mean NLL first / second), exact rate with its Wilson interval."""
    n = len(rows)
    first = sum(r["nll_first"] for r in rows) / n
    second = sum(r["nll_second"] for r in rows) / n
    exact = sum(r["exact"] for r in rows)
    lo, hi = wilson(exact, n)
    return {"trials": n, "nll_first": round(first, 4), "nll_second": round(second, 4),
            "copy_gain": round(first / max(second, 1e-6), 3), "second_over_first": round(second / max(first, 1e-6), 4),
            "exact": exact, "exact_rate": round(exact / n, 4), "exact_ci": [round(lo, 4), round(hi, 4)]}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of ``k`` successes in ``n`` trials."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def copy_cell(model, text_ids: list[int], distance: int, trials: int, span: int = 32, cue: int = 8,
              n_keys: int = 1, seed: int = 0, length: int | None = None, prefix: list[int] = ()) -> dict:
    """``trials`` paired trials at one distance, summarised (``summarize``)."""
    rows = [score(model, build(text_ids, distance, span, cue, seed, j, n_keys, length, prefix))
            for j in range(trials)]
    return {"distance": distance, "n_keys": n_keys, **summarize(rows)}
