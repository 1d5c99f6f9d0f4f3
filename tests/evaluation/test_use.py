"""The measures of use against plain references (issue 41, item 1): a model built to copy perfectly has
full reach; one restricted to a native window has no reach past it and a far-context gain of 1; the
compared rows score the same tokens."""

from __future__ import annotations

import random

import numpy as np
import pytest

from retrofit.evaluation import farcontext, retrieval, verdict
from retrofit.scoring import copying

from .oracles import Copier, MaskedCopier

NATIVE = 64
DISTANCES = [16, 32, 64, 128, 256, 512, 1024]


@pytest.fixture(scope="module")
def text() -> list[int]:
    rng = random.Random(0)
    return [rng.randrange(50000) for _ in range(12000)]


def _reach(model, text, limit=None) -> dict:
    cells = [copying.copy_cell(model, text, d, 6, copying.Probe(16, 4), limit=limit) for d in DISTANCES]
    return retrieval.effective_reach(cells, NATIVE), cells


def test_a_perfect_copier_has_full_reach(text):
    reach, cells = _reach(Copier(50000, match=3), text)
    assert reach["reach"] == DISTANCES[-1] and reach["reach_x"] == DISTANCES[-1] / NATIVE and reach["copies"]
    assert all(c["exact_rate"] == 1.0 and c["copy_gain"] > 5 for c in cells)


@pytest.mark.parametrize("how", ["window", "limit"])
def test_a_native_window_has_no_reach_past_it(text, how):
    """Attending to the last NATIVE tokens only (a window inside the model, or the evaluation's sliding window
    for a model with a limit, the floor a baseline gets): retrieval stops at the window."""
    model = Copier(50000, window=NATIVE, match=3) if how == "window" else Copier(50000, match=3)
    reach, cells = _reach(model, text, limit=None if how == "window" else NATIVE)
    assert reach["copies"] and reach["reach"] < NATIVE
    assert all(c["copy_gain"] <= 0.05 and c["exact"] == 0 for c in cells if c["distance"] > NATIVE)


def test_a_model_that_copies_nothing_has_no_reach(text):
    reach, cells = _reach(Copier(50000, match=3, confidence=0.0), text)  # flat: the context never helps
    assert reach["reach"] == 0 and not reach["copies"] and all(c["copy_gain"] == 0 for c in cells)


def test_trials_are_paired_across_models(text):
    a = copying.build(text, 128, copying.Probe(16, 4, seed=3), trial=1)
    b = copying.build(text, 128, copying.Probe(16, 4, seed=3), trial=1)
    assert a == b and a.second - a.first == 128 and a.ids[a.first : a.first + 16] == a.ids[a.second :]
    multi = copying.build(text, 128, copying.Probe(16, 4, n_keys=4, seed=3), trial=1)
    starts = {tuple(multi.ids[i : i + 4]) for i in range(multi.first, multi.second, 1)}
    assert tuple(multi.ids[multi.second : multi.second + 4]) in starts  # the cue's span is inside, with others


def test_far_context_gain_is_paired_on_the_same_tokens():
    rng = np.random.default_rng(0)
    full = rng.uniform(1, 5, 4096)
    same = farcontext.paired_gain(full.copy(), full, 256)
    assert same["gain"] == 1.0 and same["ci_low"] == same["ci_high"] == 1.0 and not farcontext.reads(same)
    helped = farcontext.paired_gain(full + 0.1, full, 256)  # every token 0.1 nats better with the full context
    assert helped["gain"] == pytest.approx(np.exp(0.1), rel=1e-3) and farcontext.reads(helped)
    noise = farcontext.paired_gain(full + rng.normal(0, 0.5, 4096), full, 256)
    assert noise["ci_low"] < 1 < noise["ci_high"] and not farcontext.reads(noise)
    with pytest.raises(ValueError, match="different tokens"):
        farcontext.paired_gain(full[:-1], full, 256)


def test_the_verdict_says_runs_reads_and_reach():
    data = {
        "models": [{"name": "m", "role": "converted", "native": {"length": 64}}],
        "rows": [
            {"model": "m", "role": "converted", "method": "non-overlapping", "length": 64, "ppl": 10.0},
            {"model": "m", "role": "converted", "method": "non-overlapping", "length": 256, "ppl": 9.0},
        ],
        "far_context": [
            {
                "model": "m",
                "length": 256,
                "against": "own native window",
                "gain": 1.2,
                "ci_low": 1.1,
                "ci_high": 1.3,
                "reads": True,
            }
        ],
        "copy": {
            "reach": [
                {
                    "model": "m",
                    "reach": 512,
                    "reach_low": 256,
                    "reach_high": 1024,
                    "reach_x": 8.0,
                    "reach_low_x": 4.0,
                    "reach_high_x": 16.0,
                    "reference_gain": 3.0,
                    "copies": True,
                }
            ]
        },
    }
    v = verdict.verdict(data)
    (m,) = v["models"]
    assert m["runs"] and m["own"]["reads"] and m["reach"]["reach_x"] == 8.0
    text = "\n".join(verdict.lines(v))
    assert "**runs**" in text and "**reads past its native length**" in text and "8x native" in text


def _one(ppl=9.0, gain=(1.2, 1.1, 1.3, True), copies=True) -> dict:
    g, lo, hi, reads = gain
    m = {"model": "m", "native": 64, "length": 256, "multiple": 4.0, "ppl": ppl, "ppl_1x": 10.0, "runs": ppl <= 11}
    m["own"] = {"against": "own native window", "gain": g, "ci_low": lo, "ci_high": hi, "reads": reads}
    m["reach"] = dict(reach=512 if copies else 0, reach_low=0, reach_high=0, reach_x=8.0 if copies else 0.0)
    m["reach"].update(reach_low_x=4.0, reach_high_x=16.0, reference_gain=3.0, copies=copies)
    return {"models": [m], "passkey_uninformative": [], "recall_uninformative": []}


def test_the_verdict_sentences_follow_every_case():
    """The sentences report.md and the model card share: breaking down, tokens that hurt, no interval, an interval
    shown to the decimals ``reads`` was decided on, and a model that copies nothing (no reach figures)."""
    broke = "\n".join(verdict.lines(_one(ppl=30.0, gain=(0.9, 0.85, 0.95, False))))
    assert "**breaks down**" in broke and "**runs**" not in broke and "the far tokens **hurt**" in broke
    flat = "\n".join(verdict.lines(_one(gain=(1.0, 0.99, 1.01, False))))
    assert "the interval holds 1" in flat and "**reads" not in flat
    one = "\n".join(verdict.lines(_one(gain=(1.01, None, None, False))))
    assert "one window only, so no interval: nothing can be said" in one
    edge = "\n".join(verdict.lines(_one(gain=(1.002, 1.0004, 1.004, True))))  # farcontext rounds to 4 decimals
    assert "[1.0004, 1.0040]" in edge and "**reads past its native length**" in edge
    none = "\n".join(verdict.lines(_one(copies=False)))
    assert "Effective reach: not measurable — it copies nothing even at short distance." in none
    assert "0 tokens" not in none and "0x native" not in none
    assert "No length past a model's native length" in "\n".join(
        verdict.lines({"models": [], "passkey_uninformative": [], "recall_uninformative": []})
    )


def _masked_reach(model, text, limit=None) -> dict:
    cells = []
    for d in DISTANCES:
        rows = [
            copying.score_masked(model, copying.build(text, d, copying.Probe(16, 4), trial=j), MASK, limit)
            for j in range(6)
        ]
        cells.append({"distance": d, **copying.summarize(rows)})
    return retrieval.effective_reach(cells, NATIVE), cells


MASK = 50000  # outside the text's ids


def test_a_masked_lm_that_copies_has_full_reach_and_a_window_stops_it(text):
    """Retrieval scored by masking (an encoder): the span's rest masked at its second occurrence, NLL with the
    first occurrence in the context against the displaced text in its place."""
    reach, cells = _masked_reach(MaskedCopier(50001, MASK, match=3), text)
    assert reach["reach"] == DISTANCES[-1] and all(c["exact_rate"] == 1.0 and c["copy_gain"] > 5 for c in cells)
    for model, limit in (
        (MaskedCopier(50001, MASK, window=NATIVE, match=3), None),
        (MaskedCopier(50001, MASK, match=3), NATIVE),
    ):
        reach, cells = _masked_reach(model, text, limit)
        assert reach["copies"] and reach["reach"] < NATIVE
        assert all(c["copy_gain"] <= 0.05 and c["exact"] == 0 for c in cells if c["distance"] > NATIVE)
    reach, cells = _masked_reach(MaskedCopier(50001, MASK, match=3, confidence=0.0), text)
    assert reach["reach"] == 0 and all(c["copy_gain"] == 0 for c in cells)
