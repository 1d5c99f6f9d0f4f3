"""One copy trial of retrieval at distance on natural text (``evaluation.retrieval`` is the measure built on
it; the stand-ins' pretrainer probes copying with it): a held-out span ``d`` tokens before the cue that repeats
its first tokens, laid out by ``build``, scored by ``score`` (a causal LM: the span's rest at both occurrences,
one forward) or ``score_masked`` (a masked LM: masked at the second occurrence, with and without the first),
and a cell of paired trials summarised with a bootstrap interval on the copy gain (``summarize``,
``copy_cell``)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from .intervals import wilson

RESAMPLES = 2000


@dataclass(frozen=True)
class CopyTrial:
    ids: list[int]  # [L]
    first: int  # index of the target span's first occurrence
    second: int  # index of its second occurrence (the cue's start)
    span: int  # k
    cue: int  # m
    displaced: tuple[int, ...] = ()  # the text the target's first occurrence replaced (a masked LM's "without")


@dataclass(frozen=True)
class Probe:
    """How every copy trial is laid out: the same for each distance and model (paired by ``seed``)."""

    span: int = 32  # k: tokens of each span
    cue: int = 8  # m: the span's first tokens repeated before it is scored
    n_keys: int = 1  # spans in the trial: the target and n_keys - 1 distractors
    seed: int = 0
    prefix: tuple[int, ...] = ()  # tokens that start every trial (a BOS)


def build(
    text_ids: list[int], distance: int, probe: Probe = Probe(), trial: int = 0, length: int | None = None
) -> CopyTrial:
    """Trial ``trial`` at ``distance`` (see the module docstring). ``length`` (default: the least that fits)
    pads the front with more held-out text; ``probe.prefix`` (a BOS) starts the sequence."""
    span, cue, seed, n_keys, prefix = probe.span, probe.cue, probe.seed, probe.n_keys, probe.prefix
    if not 0 < cue < span:
        raise ValueError(f"the cue must be shorter than the span and at least 1 token: cue {cue}, span {span}")
    if distance < n_keys * span:
        raise ValueError(f"distance {distance} cannot hold {n_keys} span(s) of {span} tokens")
    need = len(prefix) + distance + span
    length = need if length is None else length
    if length < need:
        raise ValueError(f"a copy trial at distance {distance} needs {need} tokens, got length {length}")
    n_text = length - len(prefix) - span  # held-out text before the cue, target and distractors inside it
    need_text = n_text + n_keys * span
    if need_text > len(text_ids):
        raise ValueError(f"the eval text has {len(text_ids)} tokens; a copy trial of {length} tokens needs {need_text}")
    # the spans and the filler come from two regions of the text that do not overlap, so a span occurs in the
    # trial only where it was put (paired across models by the seed)
    rng = random.Random(f"copy:{seed}:{trial}:{distance}")
    start = rng.randrange(0, len(text_ids) - need_text + 1)
    spans_first = rng.random() < 0.5
    src = start if spans_first else start + n_text
    off = start + n_keys * span if spans_first else start
    spans = [list(text_ids[src + i * span : src + (i + 1) * span]) for i in range(n_keys)]
    filler = list(text_ids[off : off + n_text])
    first = n_text - distance  # target at exactly `distance` before the cue
    displaced = tuple(filler[first : first + span])
    filler[first : first + span] = spans[0]
    # distractors between the target and the cue, evenly spread
    gap = (distance - n_keys * span) // n_keys
    for i in range(1, n_keys):
        at = first + i * (span + gap)
        filler[at : at + span] = spans[i]
    ids = list(prefix) + filler + spans[0]
    return CopyTrial(
        ids=ids, first=len(prefix) + first, second=len(prefix) + n_text, span=span, cue=cue, displaced=displaced
    )


def nll_at(logits: torch.Tensor, ids: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Per-token NLL [stop - start] of ``ids[start:stop]`` from ``logits`` [L, V] (position p predicts p + 1)."""
    lp = logits[start - 1 : stop - 1].float().log_softmax(-1)  # [n, V]
    return -lp.gather(1, ids[start:stop, None])[:, 0]


def _logits(model, ids: list[int]) -> torch.Tensor:
    dev = next(model.parameters()).device
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids], device=dev)).logits[0].float().cpu()  # [L, V]


def score(model, trial: CopyTrial, limit: int | None = None) -> dict:
    """``{"nll_first", "nll_second", "exact", "tokens_right", "tokens"}`` over the span's rest. One forward,
    or, for a model that reads at most ``limit`` tokens and a longer trial, its sliding window: the last
    ``limit`` tokens before each occurrence's end (the first occurrence may then be out of its sight)."""
    a, b, k, m = trial.first, trial.second, trial.span, trial.cue
    x = torch.tensor(trial.ids)  # [L]
    if limit is None or len(trial.ids) <= limit:
        logits = _logits(model, trial.ids)  # [L, V]
        first, second, off_a, off_b, la, lb = nll_at(logits, x, a + m, a + k), None, 0, 0, logits, logits
        second = nll_at(logits, x, b + m, b + k)
    else:
        off_a, off_b = max(0, a + k - limit), max(0, b + k - limit)
        la, lb = _logits(model, trial.ids[off_a : a + k]), _logits(model, trial.ids[off_b : b + k])
        first = nll_at(la, x[off_a : a + k], a + m - off_a, a + k - off_a)
        second = nll_at(lb, x[off_b : b + k], b + m - off_b, b + k - off_b)
    right = lb[b + m - 1 - off_b : b + k - 1 - off_b].argmax(-1) == x[b + m : b + k]
    return {
        "nll_first": float(first.mean()),
        "nll_second": float(second.mean()),
        "exact": bool(right.all()),
        "tokens_right": int(right.sum()),
        "tokens": k - m,
    }


def score_masked(model, trial: CopyTrial, mask_id: int, limit: int | None = None) -> dict:
    """A masked LM's trial: the target's last ``k - m`` tokens masked at its second occurrence (the end of the
    sequence), NLL with the first occurrence in the context (``nll_second``) and with the displaced text back in
    its place (``nll_first``: what the model predicts with no copy to read). A model that reads at most ``limit``
    tokens reads the last ``limit`` (the first occurrence may then be out of its sight). Same keys as ``score``."""
    a, b, k, m = trial.first, trial.second, trial.span, trial.cue
    x = torch.tensor(trial.ids)  # [L]
    masked = x.clone()
    masked[b + m : b + k] = mask_id
    without = masked.clone()
    without[a : a + k] = torch.tensor(trial.displaced)
    off = 0 if limit is None else max(0, len(trial.ids) - limit)
    nll, right = [], None
    for seq in (without, masked):
        logits = _logits(model, seq[off:].tolist())[b + m - off : b + k - off]  # [k - m, V]
        nll.append(float(torch.nn.functional.cross_entropy(logits, x[b + m : b + k])))
        right = logits.argmax(-1) == x[b + m : b + k]  # the last: with the copy
    return {
        "nll_first": nll[0],
        "nll_second": nll[1],
        "exact": bool(right.all()),
        "tokens_right": int(right.sum()),
        "tokens": k - m,
    }


def summarize(rows: list[dict], seed: int = 0) -> dict:
    """Trials of one cell -> the copy gain in nats per token (mean NLL first - second: what the first
    occurrence saves; 0 = no use of it) with a bootstrap 95% interval over trials, the ratio of the NLLs, and
    the exact rate with its Wilson interval."""
    n = len(rows)
    first = sum(r["nll_first"] for r in rows) / n
    second = sum(r["nll_second"] for r in rows) / n
    saved = [r["nll_first"] - r["nll_second"] for r in rows]
    g = torch.Generator().manual_seed(seed)
    boot = torch.tensor(saved)[torch.randint(0, n, (RESAMPLES, n), generator=g)].mean(1)  # [RESAMPLES]
    lo_g, hi_g = (float(q) for q in torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=boot.dtype)))
    exact = sum(r["exact"] for r in rows)
    lo, hi = wilson(exact, n)
    return {
        "trials": n,
        "nll_first": round(first, 4),
        "nll_second": round(second, 4),
        "copy_gain": round(first - second, 4),
        "copy_gain_ci": [round(lo_g, 4), round(hi_g, 4)],
        "second_over_first": round(second / max(first, 1e-6), 4),
        "exact": exact,
        "exact_rate": round(exact / n, 4),
        "exact_ci": [round(lo, 4), round(hi, 4)],
    }


def copy_cell(model, text_ids: list[int], distance: int, trials: int, probe: Probe = Probe(), limit=None) -> dict:
    """``trials`` paired trials at one distance, summarised (``summarize``)."""
    rows = [score(model, build(text_ids, distance, probe, j), limit) for j in range(trials)]
    return {"distance": distance, "n_keys": probe.n_keys, **summarize(rows, probe.seed)}
