"""The study tables (retrofit.study.tables) and cell cache (retrofit.study.cache) that `retrofit study` and the
committed study reports share. The rebuild of the committed reports is research (research/study_rounds.py, the
grids of research/study.py): its checks are research's own (research/test_study_rounds.py, run by CI with
``python -m pytest research``)."""

from __future__ import annotations

import pytest

from retrofit.study import tables as T


def _rows(ppls: dict[int, float], role="converted"):
    return [{"length": L, "role": role, "method": "non-overlapping", "ppl": p} for L, p in ppls.items()]


def test_table_compares_with_the_control_and_the_original():
    native, lengths = 4, [4, 32, 64]
    original = _rows({4: 10.0}, "baseline") + [
        {"length": L, "role": "baseline", "method": "sliding", "ppl": 10.5} for L in (4, 32, 64)
    ]
    ctrl = {
        "name": "control-full-0.1",
        "scheme": None,
        "method": "full",
        "budget": 0.1,
        "extra_tokens": 8,
        "role": "control",
        "rows": _rows({4: 9.0}),
    }
    good = {
        "name": "alibi-full-0.1",
        "scheme": "alibi",
        "method": "full",
        "budget": 0.1,
        "extra_tokens": 8,
        "role": "converted",
        "rows": _rows({4: 9.9, 32: 9.8, 64: 10.2}),
    }
    bad = {**good, "name": "rope-full-0.1", "scheme": "rope", "rows": _rows({4: 9.5, 32: 12.0, 64: 20.0})}
    broken = {
        **{k: v for k, v in good.items() if k != "rows"},
        "name": "t5-full-0.1",
        "scheme": "t5",
        "error": "RuntimeError: boom",
    }
    table = {r["cell"]: r for r in T.cell_table(original, [ctrl, good, bad, broken], lengths, native)}
    assert table["original (plain at 1x, sliding beyond)"]["ppl@8x"] == 10.5  # sliding past 1x
    g = table["alibi-full-0.1"]
    assert g["vs_control@1x"] == round(9.9 / 9.0, 4) and g["ppl@8x/1x"] == round(9.8 / 9.9, 4)
    assert g["beats_original_sliding_everywhere"] is True
    assert table["rope-full-0.1"]["beats_original_sliding_everywhere"] is False
    assert table["t5-full-0.1"]["error"] == "RuntimeError: boom" and "ppl@1x" not in table["t5-full-0.1"]


def _row(cell, label, method, budget, p1, p16=None, **kw):
    return {
        "cell": cell,
        "label": label,
        "scheme": None if label == "control" else "x",
        "method": method,
        "budget": budget,
        "ppl@1x": p1,
        "ppl@16x": p16,
        **kw,
    }


def test_cheapest_budget_needs_both_the_control_and_the_length_criteria():
    table = [
        {"cell": "original (plain at 1x, sliding beyond)", "scheme": None, "method": None, "budget": 0, "ppl@1x": 10.0},
        _row("control-full-0.02", "control", "full", 0.02, 9.0),
        _row("control-full-0.1", "control", "full", 0.1, 8.0),
        _row("a-none-0", "a", "none", 0, 10.1, 10.5),  # 1.01x original, 16x/1x 1.04: met at 0
        _row("b-none-0", "b", "none", 0, 30.0, 90.0),
        _row("b-full-0.02", "b", "full", 0.02, 9.2, 9.3),  # 1.022x control: not met
        _row("b-full-0.1", "b", "full", 0.1, 8.1, 8.4),  # 1.0125x, 1.037: met
        _row("c-full-0.1", "c", "full", 0.1, 8.0, 8.5),  # length criterion fails (1.0625)
        _row("b-full-0.1-seed1", "b", "full", 0.1, 20.0, 20.0, seed=1),
    ]  # seeds never decide
    got = {(r["label"], r["method"]): r for r in T.cheapest_budgets(table, native=256)}
    assert got[("a", "full")]["cheapest_budget"] == 0
    assert got[("b", "full")]["cheapest_budget"] == 0.1
    assert [c["met"] for c in got[("b", "full")]["checked"]] == [False, False, True]
    assert got[("c", "full")]["cheapest_budget"] is None
    md = "\n".join(T.cheapest_markdown(list(got.values()), lambda b: "not reached" if b is None else f"{b:.1%}"))
    assert "| c | full | not reached |" in md and "| b | full | 10.0% |" in md
    seeds = T.seed_table(table, [256], 256)
    assert len(seeds) == 1 and seeds[0]["seeds"] == [0, 1]
    assert seeds[0]["ppl@1x"]["mean"] == pytest.approx((8.1 + 20.0) / 2) and seeds[0]["ppl@1x"]["n"] == 2
    # the target seed by seed: each seed against its own control; a seed that fails either test is not counted
    judged = [
        {**r, "control_ppl@1x": 8.0, "ppl@16x/1x": round(r["ppl@16x"] / r["ppl@1x"], 4)}
        for r in (
            _row("d-full-0.1", "d", "full", 0.1, 8.1, 8.4),  # 1.0125x, 1.037: met
            _row("d-full-0.1-seed1", "d", "full", 0.1, 8.1, 8.6, seed=1),  # 16x/1x 1.062: not met
            _row("d-full-0.1-seed2", "d", "full", 0.1, 8.3, 8.3, seed=2),
        )
    ]  # 1.0375x the control: not met
    (d,) = T.seed_table(judged, [256], 256)
    assert d["met"] == {"seeds": 1, "of": 3} and d["ppl@16x/1x"]["max"] == 1.0617
    assert (
        "| d | full | 0.1 | 0,1,2 |" in "\n".join(T.seeds_markdown([d])) and "| 1 of 3 |" in T.seeds_markdown([d])[-2]
    )


def test_passkey_pooled_over_depths_with_the_wilson_interval():
    rows = [
        {"length": 256, "depth": d, "correct": c, "trials": 10, "accuracy": c / 10}
        for d, c in ((0, 0), (0.5, 3), (1, 2))
    ]
    rows.append({"length": 512, "depth": None, "correct": 0, "trials": 0, "accuracy": None, "note": "too short"})
    pooled = T.pooled_passkey(rows)
    assert set(pooled) == {"256"} and pooled["256"]["correct"] == 5 and pooled["256"]["trials"] == 30
    assert pooled["256"]["ci_low"] < 5 / 30 < pooled["256"]["ci_high"]


def test_the_base_seeds_control_decides_and_extra_seeds_count_from_the_base():
    """With base seed 1, seed 0 is an extra seed: the base control (not seed 0's) decides the cheapest budget,
    and the seed table counts the base seed with the extra ones."""
    table = [
        {"cell": "original (plain at 1x, sliding beyond)", "scheme": None, "method": None, "budget": 0, "ppl@1x": 10.0},
        _row("control-full-0.02", "control", "full", 0.02, 9.0),
        _row("control-full-0.02-seed0", "control", "full", 0.02, 99.0, seed=0),
        _row("a-full-0.02", "a", "full", 0.02, 9.1, 9.2),
        _row("a-full-0.02-seed0", "a", "full", 0.02, 50.0, 50.0, seed=0),
    ]
    (got,) = T.cheapest_budgets(table, 256)
    assert got["cheapest_budget"] == 0.02 and got["checked"][0]["reference@1x"] == 9.0  # the base control
    assert T.seed_table(table, [256], 256, base_seed=1)[0]["seeds"] == [0, 1]
