"""``publishing.card_facts``: the card's facts say what the run recorded, never "None"."""

from __future__ import annotations

from retrofit.publishing import card_facts

RECIPE = {
    "train": {"steps": 4, "batch_size": 2, "learning_rate": 1e-4, "method": "lora", "objective": "lm"},
    "data": {"block_length": 64, "dataset": "shakespeare"},
}


def test_a_card_before_any_eval_says_the_hardware_is_not_recorded():
    hw = card_facts.budget(RECIPE, {}, {}, {}, {})["hardware"]
    assert "None" not in hw and "not recorded" in hw


def test_the_hardware_row_says_what_the_eval_report_recorded():
    report = {"environment": {"hardware": {"cpu": "x86_64", "cpu_count": 2, "torch_threads": 2}}}
    assert card_facts.budget(RECIPE, {}, {}, report, {})["hardware"] == "x86_64 (2 cores, 2 torch threads)"
    report = {"environment": {"hardware": {"cpu": "x86_64", "device": "cpu"}}}
    assert card_facts.budget(RECIPE, {}, {}, report, {})["hardware"] == "x86_64"
    report = {"environment": {"hardware": {"cpu": "x86_64", "gpu": "NVIDIA H200"}}}
    assert card_facts.budget(RECIPE, {}, {}, report, {})["hardware"] == "NVIDIA H200"
