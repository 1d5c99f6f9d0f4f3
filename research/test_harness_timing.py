"""The timing protocol of research/bench_kernel.py and bench_xl_forward.py (``harness.bracketed``): each variant between two stock steps, so a machine whose speed
drifts over a repeat reads the variant's true ratio, where timing stock once a repeat does not."""

from __future__ import annotations

from harness import bracketed


def test_bracketed_reads_the_true_ratio_on_a_drifting_machine():
    clock = {"t": 0}
    cost = {"stock": 1.0, "a": 1.10, "b": 1.30}  # each variant's true cost against stock

    def timer(step):  # the machine slows 5% a step: a late step takes longer
        clock["t"] += 1
        return cost[step] * (1 + 0.05 * clock["t"])

    times, ratios = bracketed({v: v for v in cost}, repeats=4, timer=timer)
    assert len(times["stock"]) == 4 * 3 and len(times["a"]) == len(times["b"]) == 4
    for v in ("a", "b"):  # a linear drift cancels exactly in the mean of the two stock steps around
        assert all(abs(r - cost[v]) < 1e-9 for r in ratios[v]), ratios[v]
    naive = [t / s for t, s in zip(times["b"], times["stock"][::3])]  # the old protocol: one stock step a repeat
    assert max(abs(r - cost["b"]) for r in naive) > 0.05  # the drift it would have read as the kernel's cost
