"""``data.copies``: retrieval targets placed in fine-tune blocks at distances in *positions* (PoSE included)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from retrofit.foundation.errors import RecipeError
from retrofit.training import copies, positions
from retrofit.training.recipe import Recipe


def cfg(spans=1, span_length=16, min_distance=None, max_distance=None):
    return SimpleNamespace(spans=spans, span_length=span_length, min_distance=min_distance, max_distance=max_distance)


def _check_copied(x, y, placed, span):
    for c in placed:
        assert torch.equal(y[c.row, c.second : c.second + span], x[c.row, c.first : c.first + span])


def test_a_span_is_copied_at_the_requested_distance():
    x = torch.randint(0, 1000, (2, 512))
    y, placed = copies.place(x, None, cfg(min_distance=300, max_distance=300), 512, seed=1)
    assert [c.distance for c in placed] == [300, 300]
    assert all(c.second - c.first == 300 for c in placed)
    _check_copied(x, y, placed, 16)
    outside = torch.ones(512, dtype=torch.bool)
    outside[placed[0].second : placed[0].second + 16] = False
    assert torch.equal(y[0, outside], x[0, outside])  # nothing else changed


def test_distances_are_drawn_over_the_whole_range_asked():
    x = torch.randint(0, 1000, (64, 512))
    _, placed = copies.place(x, None, cfg(min_distance=200, max_distance=300), 512, seed=2)
    got = [c.distance for c in placed]
    assert min(got) >= 200 and max(got) <= 300 and max(got) > 290 and min(got) < 210


def test_under_pose_the_distance_is_in_positions_past_the_block():
    pos = positions.pose(256, 4096, 2, random.Random(5))  # (256,): two chunks, a gap between them
    d = int(pos[200] - pos[10])
    assert d > 256  # farther apart in positions than the block is long
    x = torch.randint(0, 1000, (1, 256))
    y, placed = copies.place(x, pos, cfg(min_distance=d, max_distance=d), 4096, seed=0)
    (c,) = placed
    assert int(pos[c.second] - pos[c.first]) == d == c.distance
    _check_copied(x, y, placed, 16)


def test_a_distance_the_positions_do_not_hold_is_placed_at_the_nearest_they_hold():
    pos = torch.cat([torch.arange(0, 64), torch.arange(1000, 1064)])  # (128,): a gap of 936 positions
    d = 500  # no pair of tokens sits 500 positions apart
    _, placed = copies.place(
        torch.zeros(1, 128, dtype=torch.long), pos, cfg(span_length=8, min_distance=d, max_distance=d), 2000, 0
    )
    best = min(abs(int(pos[b] - pos[a]) - d) for a in range(120) for b in range(a + 8, 121))
    assert abs(placed[0].distance - d) == best


def test_many_spans_never_overlap_and_the_draw_is_seeded():
    pos = positions.pose(1024, 16384, 2, random.Random(1))
    x = torch.randint(0, 1000, (3, 1024))
    y, placed = copies.place(x, pos, cfg(spans=8, span_length=32), 16384, seed=7)
    assert len(placed) == 24
    for row in range(3):
        spots = [k for c in placed if c.row == row for s in (c.first, c.second) for k in range(s, s + 32)]
        assert len(spots) == len(set(spots))
    _check_copied(x, y, placed, 32)
    y2, placed2 = copies.place(x, pos, cfg(spans=8, span_length=32), 16384, seed=7)
    assert placed2 == placed and torch.equal(y2, y)
    assert copies.place(x, pos, cfg(spans=8, span_length=32), 16384, seed=8)[1] != placed


def _recipe(**copies_keys):
    return {
        "model": {"name_or_path": "tiny-gpt2"},
        "convert": {"scheme": "alibi"},
        "data": {"dataset": "stdlib", "block_length": 128, "copies": copies_keys},
        "output_dir": "x",
    }


@pytest.mark.parametrize(
    "keys, words",
    [
        ({"spans": -1}, "'data.copies.spans' must be >= 0"),
        ({"spans": 2, "span_length": 65}, "'data.copies.span_length' must be in [1, data.block_length / 2 = 64]"),
        ({"spans": 2, "min_distance": 100, "max_distance": 50}, "span_length <= min_distance <= max_distance"),
        ({"spans": 2, "span_length": 32, "min_distance": 8}, "span_length <= min_distance"),
    ],
)
def test_recipe_errors_name_the_key(keys, words):
    with pytest.raises(RecipeError, match=words.replace("[", r"\[").replace("]", r"\]")):
        Recipe.from_dict(_recipe(**keys))


@pytest.mark.slow
def test_the_fine_tune_trains_on_blocks_with_the_copies(tmp_path, monkeypatch):
    from retrofit.training import finetune, loop

    seen = []
    real = loop.copies.place

    def spy(batch, drawn, cp, target, seed):
        out, placed = real(batch, drawn, cp, target, seed)
        seen.append((drawn, placed))
        return out, placed

    monkeypatch.setattr(loop.copies, "place", spy)
    r = _recipe(spans=2, span_length=8)
    r["data"].update(max_documents=20, max_validation_blocks=2)
    r["train"] = {"steps": 2, "batch_size": 2, "positions": {"method": "pose", "target_length": 512}}
    r["output_dir"] = str(tmp_path / "run")
    finetune(r)
    assert len(seen) == 2  # one draw a step
    for drawn, placed in seen:
        assert drawn is not None and len(placed) == 4
        assert all(int(drawn[c.second] - drawn[c.first]) == c.distance for c in placed)
