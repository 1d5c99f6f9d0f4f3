"""What a card says of use past the native length, from a report's verdict (``card_facts._use``)."""

from __future__ import annotations

from retrofit.running.card_facts import _use


def _verdict(reads: bool, ci: bool = True, copies: bool = True) -> dict:
    return {
        "model": "m",
        "native": 128,
        "length": 2048,
        "multiple": 16.0,
        "own": {
            "against": "own native window",
            "gain": 1.042 if reads else 0.998,
            "ci_low": (1.01 if reads else 0.99) if ci else None,
            "ci_high": (1.07 if reads else 1.004) if ci else None,
            "reads": reads,
        },
        "reach": {
            "reach": 256,
            "reach_low": 128,
            "reach_high": 512,
            "reach_x": 2.0,
            "reach_low_x": 1.0,
            "reach_high_x": 4.0,
            "reference_gain": 1.5,
            "copies": copies,
        },
    }


def test_a_model_that_reads_is_said_to_read_with_its_interval_and_reach():
    gain, reach = _use(_verdict(reads=True))
    assert "at 2,048 tokens (16x native)" in gain and "1.042 [1.010, 1.070]" in gain
    assert gain.endswith("it reads past its native length.")
    assert "256 tokens (2x native) [1x, 4x]." in reach and "not the configured limit" in reach


def test_a_model_that_only_runs_is_said_so():
    gain, _ = _use(_verdict(reads=False))
    assert gain.endswith("runs there but does not read past its native length.")
    gain, _ = _use(_verdict(reads=False, ci=False))
    assert gain.endswith("one window only, so no interval: whether it reads there is not known.")


def test_a_model_that_copies_nothing_has_no_reach_and_an_unmeasured_one_says_so():
    _, reach = _use(_verdict(reads=False, copies=False))
    assert "copies nothing even at short distance" in reach
    assert _use(None) == ["Not measured past its native length: whether it reads there is not known."]
    v = _verdict(reads=True)
    del v["reach"]
    assert len(_use(v)) == 1
