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
  - mean NLL second, in nats per token (0: no use of the first occurrence), with a bootstrap interval over
  trials. ``exact``: every teacher-forced argmax of the second occurrence right, which is greedy decoding
  reproducing the rest of the span.
* **Effective reach** (``effective_reach``): the longest distance at which the gain keeps at least half of
  its value at the shortest distance (1/4 native by default).
* A model that reads at most ``limit`` tokens (the original, past its table) is scored through its sliding
  window: the first occurrence is out of its sight once ``d + k > limit``. It is the floor.

**A masked LM** (an encoder) reads both sides, so the same trial is scored by masking instead: the target's
last ``k - m`` tokens are masked at its second occurrence and scored twice, with its first occurrence in the
context and with that occurrence given back the text it displaced (``score_masked``). ``copy_gain`` is the
NLL without the copy minus the NLL with it; ``exact``: every masked token's argmax right.

Trials are paired across models: trial ``j`` at distance ``d`` uses the same text and spans for every
model and every length, so differences between rows are the models'. ``L = d + k + tail`` at least:
the sequence is cut from the left so that it is as short as the distance allows (``length=None``) or a
given length (the rest is filler before the target).
"""

from __future__ import annotations

import logging

from ..foundation.errors import LengthError, OptionError
from ..scoring.copying import Probe, build, score, score_masked, summarize
from .lengths import resolve as resolve_lengths
from .measure import Measure, Planned, Setup, check_lengths
from .options import DEFAULTS, QUICK, eval_options
from .passkey import bos_prefix
from .recall import eval_text

log = logging.getLogger(__name__)


def effective_reach(cells: list[dict], native: int) -> dict:
    """The longest distance up to which retrieval keeps at least half of the gain at the shortest distance
    (the model's own gain at 1/4 native by default): ``reach`` from the gains, ``reach_low`` / ``reach_high``
    from their intervals' lower / upper ends, in tokens and as multiples of ``native``. Distances are taken
    in order and the first that falls short ends the reach (a later spike is noise, not reach). A model
    whose gain at the shortest distance holds 0 in its interval copies nothing: its reach is 0."""
    cells = sorted(cells, key=lambda c: c["distance"])
    ref = cells[0]
    half = ref["copy_gain"] / 2

    def longest(value) -> int:
        if ref["copy_gain_ci"][0] <= 0:
            return 0
        out = 0
        for c in cells:
            if value(c) < half:
                break
            out = c["distance"]
        return out

    reach = {
        "reach": longest(lambda c: c["copy_gain"]),
        "reach_low": longest(lambda c: c["copy_gain_ci"][0]),
        "reach_high": longest(lambda c: c["copy_gain_ci"][1]),
    }
    return {
        **reach,
        **{f"{k}_x": round(v / native, 3) for k, v in reach.items()},
        "native": native,
        "reference_distance": ref["distance"],
        "reference_gain": ref["copy_gain"],
        "copies": ref["copy_gain_ci"][0] > 0,
        "distances": [c["distance"] for c in cells],
    }


def run(setup: Setup, planned: Planned, bar, mask_id=None) -> dict:
    """The report's ``copy`` section: a cell per (model, distance), paired across models, and each model's
    effective reach. A model with a limit (the original, past its table) reads a longer trial through its
    sliding window, said in the cell's note: the floor, which cannot see past its window. ``planned.state``: the
    options, the distances, the eval text and the trials' prefix (``Copy.plan``); ``mask_id``: the models are
    masked LMs, scored by ``score_masked``."""
    o, distances, text_ids, prefix = planned.state
    probe, trials = Probe(o.copy_span, o.copy_cue, o.copy_keys, o.seed, tuple(prefix)), o.copy_trials
    cells, reaches = [], []
    for m in setup.models:
        native = (m.info.get("native") or {}).get("length")
        mine = []
        for d in distances:
            limit = m.max_length
            longer = limit is not None and len(probe.prefix) + d + probe.span > limit
            bar.set_description(f"{m.name[-24:]} copy d={d}")
            rows = []
            for j in range(trials):
                trial = build(text_ids, d, probe, j)
                rows.append(
                    score(m.model, trial, limit) if mask_id is None else score_masked(m.model, trial, mask_id, limit)
                )
                bar.update(1)
            cell = {
                "model": m.name,
                "role": m.role,
                "distance": d,
                "n_keys": probe.n_keys,
                "distance_x": round(d / native, 3) if native else None,
                "note": f"through its sliding window of {limit}" if longer else None,
                **summarize(rows, probe.seed),
            }
            cells.append(cell)
            mine.append(cell)
        if mine and native:
            reaches.append({"model": m.name, "role": m.role, **effective_reach(mine, native)})
    return {"cells": cells, "reach": reaches}


def sizes(o, native: int | None):
    """The options with the copy span and cue resolved (defaults: min(32, native / 4) and a quarter of it),
    checked."""
    span = o.copy_span or min(32, max(4, (native or 128) // 4))
    cue = o.copy_cue or max(1, span // 4)
    for name, v in (("copy_trials", o.copy_trials), ("copy_span", span), ("copy_cue", cue), ("copy_keys", o.copy_keys)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise OptionError(f"{name} must be a positive integer, got {v!r}")
    if not cue < span:
        raise OptionError(f"copy_cue ({cue}) must be smaller than copy_span ({span})")
    return eval_options(o, copy_span=span, copy_cue=cue)


def distances(items, native: int | None, lengths: list[int], o) -> list[int]:
    """The copy distances in tokens: as given, or (the defaults, --quick's too) those up to the longest length."""
    distances = resolve_lengths(items, native, "copy distances")
    if o.copy_distances in (DEFAULTS.copy_distances, QUICK["copy_distances"]):
        distances = [d for d in distances if d <= max(lengths)]
    small = [d for d in distances if d < o.copy_keys * o.copy_span]
    if small:
        raise LengthError(f"copy distance {small[0]} cannot hold {o.copy_keys} span(s) of {o.copy_span} tokens")
    return distances


def work(distances: list[int], models: int, o) -> list[tuple[int, int]]:
    """(sequence length, forward passes) of the copy cells: the cost line's and the progress bar's."""
    return [(d + o.copy_span, models * o.copy_trials) for d in distances]


def settings(distances: list[int], o) -> dict:
    """The report's ``settings.copy``: what the measure ran with (``o``: the options, span and cue resolved)."""
    return {
        "distances": distances,
        "trials": o.copy_trials,
        "span": o.copy_span,
        "cue": o.copy_cue,
        "keys": o.copy_keys,
        "text": "the eval text (natural)",
    }


class Copy(Measure):
    """Retrieval at distance (``copy``): the copy gain at each distance and the effective reach, a causal LM's
    continuation scored."""

    name = "copy"

    def asked(self, o) -> list | None:
        return check_lengths(o.copy_distances, "copy distances") if o.copy else None

    def sized(self, setup: Setup, asked) -> tuple:
        """(the options with the span and cue resolved, the distances in tokens), checked."""
        o = sizes(setup.o, setup.native)
        return o, distances(asked, setup.native, setup.lengths, o)

    def check(self, setup: Setup, asked) -> None:
        if asked is not None:
            self.sized(setup, asked)

    def plan(self, setup: Setup, asked) -> Planned:
        if asked is None:
            return Planned(settings={"copy": None})
        o, found = self.sized(setup, asked)
        if not found:
            return Planned(settings={"copy": None})
        longest = max(found) + (o.copy_keys + 1) * o.copy_span
        what = f"copy distance {max(found)}"
        m = setup.models[0]
        text = eval_text(m, setup, o, longest, 0, what=what)
        state = (o, found, text, self.prefix(m.tokenizer))
        return Planned(work(found, len(setup.models), o), {"copy": settings(found, o)}, {"copy": o.seed}, state)

    def prefix(self, tokenizer) -> list[int]:
        """What every trial starts with: the tokenizer's BOS."""
        return bos_prefix(tokenizer)

    def run(self, setup: Setup, planned: Planned, bar) -> dict:
        return {"copy": run(setup, planned, bar)}

    def markdown(self, report, plots: dict) -> list[str]:
        from .markdown import copy_section

        return copy_section(report, plots)


class MaskedCopy(Copy):
    """Retrieval at distance for a masked LM: the span's tokens masked at the end and scored
    (``scoring.copying.score_masked``); the report's ``copy`` and ``copy_settings``."""

    tasks = ("masked-lm",)

    def check(self, setup: Setup, asked) -> None:
        if getattr(setup.models[0].tokenizer, "mask_token_id", None) is not None:
            super().check(setup, asked)

    def plan(self, setup: Setup, asked) -> Planned:
        if asked is not None and getattr(setup.models[0].tokenizer, "mask_token_id", None) is None:
            log.warning("masked LM: its tokenizer has no mask token, so retrieval at distance is not run")
            return Planned()
        return super().plan(setup, asked)

    def prefix(self, tokenizer) -> list[int]:
        cls = getattr(tokenizer, "cls_token_id", None)
        return [cls] if cls is not None else []

    def run(self, setup: Setup, planned: Planned, bar) -> dict:
        o = planned.state[0]
        cells = run(setup, planned, bar, setup.models[0].tokenizer.mask_token_id)
        keep = {"trials": o.copy_trials, "span": o.copy_span, "cue": o.copy_cue, "keys": o.copy_keys}
        return {"copy": cells, "copy_settings": keep}

    def absent(self) -> dict:
        return {}


MEASURE, MASKED = Copy(), MaskedCopy()
