"""The windows a token stream is read through: each target scored once, from the window the reading says."""

from __future__ import annotations

import pytest

from retrofit.scoring.windows import centred_spans, sliding_spans, sliding_window_count


def test_sliding_spans_cover_each_target_once():
    for n, w, s in [(100, 32, 8), (64, 64, 16), (10, 32, 8), (97, 20, 7)]:
        spans = sliding_spans(n, w, s)
        covered = [t for start, end, k in spans for t in range(end - k, end)]
        assert covered == list(range(n))
        assert all(end - start <= w for start, end, _ in spans)
        assert all(k == s for _, _, k in spans[1:-1])
        assert sliding_window_count(n, w, s) == len(spans)
    with pytest.raises(ValueError):
        sliding_spans(10, 8, 9)


@pytest.mark.parametrize("n,window,stride", [(100, 16, 8), (64, 16, 8), (37, 16, 4), (10, 16, 8), (50, 12, 12)])
def test_centred_spans_score_every_position_once_from_the_middle_of_its_window(n, window, stride):
    seen = []
    for start, end, a, b in centred_spans(n, window, stride):
        assert start <= a <= b <= end and end - start <= window
        seen += range(a, b)
        if 0 < start and end < n:  # an inner window: at least (window - stride) / 2 either side
            assert a - start >= (window - stride) // 2 and end - b >= (window - stride) // 2
    assert seen == list(range(n))
