"""The intervals against values computed by hand from Wilson's (1927) and Newcombe's (1998, method 10) formulas."""

import pytest

from retrofit.scoring.intervals import paired_difference, wilson


def test_wilson_matches_the_textbook_values():
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(4, 64)[0] > 1 / 64  # the "4 of 64" is above chance 1/64 by Wilson


def test_wilson_refuses_no_trials():
    with pytest.raises(ValueError, match="trials must be > 0"):
        wilson(0, 0)


def test_paired_difference_of_identical_readings_is_zero_and_covers_it():
    same = [1, 0] * 32
    d, low, high = paired_difference(same, same)
    assert d == 0 and low <= 0 <= high


def test_paired_difference_excludes_zero_for_a_large_gap():
    d, low, high = paired_difference([1] * 40 + [0] * 24, [1] * 10 + [0] * 54)
    assert d == pytest.approx(30 / 64) and low > 0 and high <= 1
