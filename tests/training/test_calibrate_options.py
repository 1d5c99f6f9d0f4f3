"""``calibrate()``'s keywords: its section's (``CalibrateConfig``) and the call's own (``RunOptions``: seed,
progress), every other one a TypeError naming them, said before the model is read."""

from __future__ import annotations

import pytest

from retrofit.training.calibrate import KEYWORDS, OPTIONS, RunOptions, _options, calibrate
from retrofit.training.recipe import CalibrateConfig


def test_an_unknown_keyword_is_a_type_error_naming_the_valid_ones_before_the_model_is_read():
    with pytest.raises(TypeError) as e:  # no model: reading it would be another error
        calibrate(None, None, "stdlib", tokenizer=None, stpes=10)
    said = str(e.value)
    assert "'stpes'" in said and all(name in said for name in KEYWORDS)
    assert set(KEYWORDS) == set(OPTIONS) | {"seed", "progress"}


def test_the_keywords_go_to_the_section_or_the_run_and_the_section_may_be_passed_whole():
    section, run = _options("stdlib", {"steps": 7, "seed": 3, "progress": False})
    assert section == CalibrateConfig(data="stdlib", steps=7) and run == RunOptions(seed=3, progress=False)
    given = CalibrateConfig(data="shakespeare:train", budget=512)
    assert _options(given, {}) == (given, RunOptions())
    section, _ = _options(given, {"steps": 5})  # a keyword over the section passed whole
    assert section == CalibrateConfig(data="shakespeare:train", budget=512, steps=5)
