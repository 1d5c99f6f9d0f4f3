"""``training/positions.py`` owns ``train.positions``: the section, whether it is on (written once), each step's
placement handed to ``patch/`` as one typed ``Placement``."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch

import retrofit
from retrofit.foundation.errors import RecipeError
from retrofit.patch.attention import Placement
from retrofit.training import positions
from retrofit.training.positions import Placer, PositionsConfig

from ..tiny import TINY

SRC = Path(__file__).resolve().parents[2] / "src" / "retrofit"


def test_active_is_the_sections_one_word():
    assert not PositionsConfig().active
    for on in ({"random_offset": 3}, {"native_fade_steps": 2}, {"method": "pose", "target_length": 64}):
        assert PositionsConfig(**on).active and Placer(PositionsConfig(**on), 16, 0).active
    # "positions are on" is written in positions.py only: nowhere else tests two of its keys together
    for f in SRC.rglob("*.py"):
        if f.name != "positions.py":
            text = f.read_text()
            assert not re.search(r"random_offset or |native_fade_steps or ", text), f


def test_each_step_is_placed_as_the_seed_says():
    offsets = Placer(PositionsConfig(random_offset=8), 16, seed=5)
    assert [offsets.at(s).offset for s in range(6)] == [
        random.Random(5 * 1_000_003 + s).randint(0, 8) for s in range(6)
    ]
    fading = Placer(PositionsConfig(native_fade_steps=4, random_offset=8), 16, seed=0)
    fading.fade_offset_cap = 0  # no room to shift while the native table fades out
    assert [fading.at(s).native_fade for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert all(fading.at(s).offset == 0 for s in range(4))
    pose = Placer(PositionsConfig(method="pose", target_length=64), 16, seed=3)
    assert torch.equal(pose.at(7).positions, positions.draw("pose", 16, 64, 2, 3, 7))
    assert pose.reach == 64 and Placer(PositionsConfig(), 16, 0).reach == 16


def test_apply_hands_patch_one_placement_and_resets_it():
    model = retrofit.convert(TINY["gpt2"](), "alibi")
    placer = Placer(PositionsConfig(method="randomized", target_length=48), 16, seed=1)
    drawn = placer.apply(model, 2)
    state = model._retrofit_state
    assert isinstance(state.placement, Placement) and torch.equal(state.placement.positions, drawn)
    assert placer.apply(model, None) is None and state.placement == Placement()
    assert Placer(PositionsConfig(), 16, 0).apply(model, 3) is None  # off: nothing set


def test_the_section_checks_itself():
    with pytest.raises(RecipeError, match="must be one of none, pose"):
        PositionsConfig(method="spread").check(16)
    with pytest.raises(RecipeError, match="greater than 'data.block_length'"):
        PositionsConfig(method="pose", target_length=16).check(16)
    with pytest.raises(RecipeError, match="cannot be combined"):
        PositionsConfig(method="pose", target_length=64, random_offset=2).check(16)
