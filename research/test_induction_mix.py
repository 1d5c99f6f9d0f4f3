"""The stand-ins' induction data (research/induction_mix.py): rows that repeat spans of themselves, the induction
toy rows, the config that feeds them to the package's trainer under a key of its own, and the copy curve it
records while pretraining."""

import dataclasses

import pytest
import torch

from induction_mix import InductionConfig, add_repeats, induction_rows, plain
from retrofit.foundation.errors import OptionError
from retrofit.models.standin import PRESETS, load_stats
from retrofit.training.standin import pretrain


def test_repeats_write_each_span_again_later_in_its_row():
    cfg = InductionConfig(copy_fraction=1.0, copy_random=0.5, copy_max_span=32)
    x = torch.arange(8 * 128).view(8, 128)  # every token distinct: a repeat is a token seen earlier in its row
    y = add_repeats(x, cfg, torch.Generator().manual_seed(0), torch.arange(5000, 6000))
    assert y.shape == x.shape and not torch.equal(x, y)
    for row in y:
        seen, repeated = set(), 0
        for t in row.tolist():
            repeated += t in seen
            seen.add(t)
        assert repeated >= 128 // 4 - 8  # about a quarter of the row are second occurrences
    z = add_repeats(x, dataclasses.replace(cfg, copy_fraction=0.0), torch.Generator().manual_seed(0), torch.arange(9))
    assert torch.equal(z, x)  # no mix: the text as it was


def test_induction_rows_repeat_a_random_first_half():
    rows = induction_rows((4, 256), torch.Generator().manual_seed(0), torch.arange(100, 200))
    assert rows.shape == (4, 256) and torch.equal(rows[:, :128], rows[:, 128:])
    assert ((rows >= 100) & (rows < 200)).all() and len({tuple(r) for r in rows[:, :128].tolist()}) == 4


def test_tiled_induction_rows_repeat_a_random_period():
    rows = induction_rows((6, 256), torch.Generator().manual_seed(0), torch.arange(100, 4000), min_period=8)
    periods = []
    for r in rows.tolist():
        p = next(p for p in range(8, 129) if r[p:] == r[:-p])  # the smallest shift that maps the row onto itself
        assert len(set(r[:p])) > p // 2  # random tokens, not a constant
        periods.append(p)
    assert all(8 <= p <= 128 for p in periods) and len(set(periods)) > 1


def test_the_toy_share_keeps_toy_rows_after_the_warm_up():
    cfg = dataclasses.replace(plain(PRESETS["micro"]), copy_toy_share=0.5, copy_toy_min_period=4)
    assert cfg.cache_key() != PRESETS["micro"].cache_key()
    with pytest.raises(OptionError, match="copy_toy_share"):
        dataclasses.replace(cfg, copy_toy_share=1.5)
    x = torch.arange(4 * 32).view(4, 32)
    mixed = cfg.mixer(x)(x, 0)  # [4, 32]: two toy rows (a period of 4..16, tiled), the text's rows after them
    assert torch.equal(mixed[2:], x[2:]) and not torch.equal(mixed[:2], x[:2])


def test_an_encoder_takes_no_copy_mix():
    with pytest.raises(OptionError, match="bert stand-in has none"):
        dataclasses.replace(plain(PRESETS["study2-bert"]), copy_fraction=0.5)


def test_the_mix_keeps_the_keys_of_before_the_split():
    """Off, the mix leaves a preset's key (and folder) alone; on, a config keeps the key it had when its fields
    were the package's (these pilots' caches and records name them); measuring is not training."""
    for name, preset in PRESETS.items():
        assert plain(preset).cache_key() == preset.cache_key(), name
    assert (
        PRESETS["study2-gpt2"].cache_key() == "acb8e7edbe56" and PRESETS["study2-llama"].cache_key() == "736570157b87"
    )
    mixed = dataclasses.replace(plain(PRESETS["study2-gpt2"]), copy_fraction=0.5)
    assert mixed.cache_key() == "5497d9a2266d"
    assert dataclasses.replace(mixed, copy_eval_every=100).cache_key() == mixed.cache_key()
    full = dataclasses.replace(
        plain(PRESETS["micro"]),
        copy_fraction=0.75,
        copy_warmup=800,
        copy_random=0.3,
        copy_max_span=32,
        copy_toy_share=0.25,
        copy_toy_min_period=16,
    )
    assert full.cache_key() == "fa3ff2be4127"


def test_pretraining_records_its_copy_curve(cache):
    cfg = dataclasses.replace(
        plain(PRESETS["micro"]), name="micro-copy", copy_fraction=0.5, copy_warmup=2, copy_eval_every=2
    )
    stats = load_stats(pretrain(cfg, cache_dir=cache / "baseline"))
    assert [c["step"] for c in stats["curve"]] == [2, 4]
    assert {"second_over_first", "exact_rate", "distance"} <= set(stats["curve"][0])
    assert {"second_over_first", "exact_rate", "distance"} <= set(stats["copying"])
    assert stats["config"]["copy_fraction"] == 0.5
