"""PoSE and randomized positions under ``train.positions``: the positions a block receives, that every
scheme reading positions reads them (live, against equivalent references), and the recipe's checks."""

from __future__ import annotations

import random

import pytest
import torch

import retrofit
from retrofit.foundation.errors import OptionError, RecipeError
from retrofit.patch.conversion import set_position_controls
from retrofit.training import finetune, positions
from retrofit.training.recipe import Recipe

from ..tiny import TINY, ids
from ..training.test_finetune import recipe

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`


@pytest.mark.parametrize("method", ["pose", "randomized", "endprompt"])
def test_a_block_spans_the_target_and_stays_strictly_increasing(method):
    L, target = 128, 4096
    drawn = [positions.draw(method, L, target, 2, seed=3, step=s) for s in range(200)]
    for p in drawn:
        assert p.shape == (L,) and p.dtype == torch.long
        assert int(p[0]) >= 0 and int(p[-1]) < target and bool((p[1:] > p[:-1]).all())
    assert max(int(p[-1]) for p in drawn) > 0.95 * target  # blocks reach the end of the target range
    assert min(int(p[0]) for p in drawn) < 0.05 * target
    assert sum(int(p[-1]) - int(p[0]) for p in drawn) / len(drawn) > 0.3 * target  # a block itself spans far
    assert torch.equal(drawn[5], positions.draw(method, L, target, 2, seed=3, step=5))  # reproducible
    assert not torch.equal(drawn[5], drawn[6])


def test_endprompt_keeps_the_body_at_the_start_and_ends_near_the_target():
    for step in range(50):
        p = positions.endprompt(100, 1000, random.Random(step))
        assert torch.equal(p[:75], torch.arange(75))  # the body: its own positions
        assert torch.equal(p[75:] - p[75], torch.arange(25))  # the final quarter: one contiguous piece
        assert 1000 - 1 - 25 <= int(p[-1]) <= 1000 - 1  # ending within a quarter-block of the target


def test_pose_keeps_each_chunk_contiguous():
    p = positions.pose(100, 1000, 4, random.Random(0))
    steps = (p[1:] - p[:-1]).tolist()
    jumps = [i for i, d in enumerate(steps) if d != 1]
    assert len(jumps) <= 3 and all(i + 1 in (25, 50, 75) for i in jumps)


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_alibi_reads_the_positions_stretched_distances_double_the_slopes(model_type):
    torch.manual_seed(0)
    base = TINY[model_type]().eval()
    a = retrofit.convert(base, "alibi")
    x = ids(1, 40)
    with torch.no_grad():
        plain = a(x).logits
        set_position_controls(a, positions=torch.arange(40) * 2)
        stretched = a(x).logits
        set_position_controls(a)
        a.retrofit_positions.slopes.mul_(2)
        doubled = a(x).logits
    assert not torch.allclose(plain, stretched, atol=1e-4)
    torch.testing.assert_close(stretched, doubled, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("scheme", ["rope", "sinusoidal", "fire", "t5", "xl+init=random"])
def test_a_uniform_shift_through_positions_equals_the_offset_control(scheme):
    """positions = arange + k is the offset control's shift: rotary, absolute, bias and relative schemes read both
    alike (a relative scheme reads the distances between a block's own positions)."""
    name, *flags = scheme.split("+")
    model = retrofit.convert(TINY["gpt2"]().eval(), name, **dict(f.split("=") for f in flags))
    x = ids(1, 30)
    with torch.no_grad():
        set_position_controls(model, offset=17)
        shifted = model(x).logits
        set_position_controls(model, positions=torch.arange(30) + 17)
        placed = model(x).logits
        set_position_controls(model, positions=torch.cat([torch.arange(15), torch.arange(15) + 300]))
        pose = model(x).logits
        set_position_controls(model)
    torch.testing.assert_close(placed, shifted, atol=2e-5, rtol=1e-4)
    if scheme != "t5":  # t5's buckets beyond max_distance are flat: a far second chunk may not change them
        assert not torch.allclose(pose, placed, atol=1e-4), "positions not read"


def test_bad_positions_are_clear_errors():
    model = retrofit.convert(TINY["gpt2"]().eval(), "alibi")
    with pytest.raises(OptionError, match="strictly increasing"):
        set_position_controls(model, positions=torch.tensor([0, 2, 2]))
    with pytest.raises(OptionError, match="1-D integer"):
        set_position_controls(model, positions=torch.tensor([0.0, 1.0]))
    with pytest.raises(OptionError, match="cannot be combined"):
        set_position_controls(model, offset=3, positions=torch.arange(4))
    set_position_controls(model, positions=torch.arange(8))
    with torch.no_grad(), pytest.raises(retrofit.RetrofitError, match="position override"):
        model(ids(1, 9))


def test_recipe_checks_the_positions_method(tmp_path):
    def load(**pos):
        return Recipe.from_dict(recipe(tmp_path / "r", train__positions=pos))

    assert load(method="pose", target_length=1024).train.positions.method == "pose"
    with pytest.raises(RecipeError, match="one of none, pose, randomized"):
        load(method="yarn", target_length=1024)
    with pytest.raises(RecipeError, match="greater than 'data.block_length'"):
        load(method="pose", target_length=128)
    with pytest.raises(RecipeError, match="cannot be combined"):
        load(method="randomized", target_length=1024, random_offset=8)
    with pytest.raises(RecipeError, match="target_length' is read by"):
        load(target_length=1024)


def test_finetune_with_pose_and_randomized_positions_runs_and_resets(tmp_path, caplog):
    caplog.set_level("INFO", logger="retrofit.training")
    for method in ("pose", "randomized", "endprompt"):
        out = finetune(
            recipe(
                tmp_path / method,
                train__steps=2,
                checkpoint__every=0,
                train__positions={"method": method, "target_length": 2048},
            )
        )
        assert (out / "final" / "config.json").is_file()
        assert f"positions: {method}, blocks of 128 spread over [0, 2048)" in caplog.text
    caplog.clear()
    finetune(
        recipe(
            tmp_path / "nope",
            train__steps=1,
            checkpoint__every=0,
            convert={"scheme": "nope", "options": {}},
            train__positions={"method": "pose", "target_length": 2048},
        )
    )
    assert "has no effect on 'nope'" in caplog.text
