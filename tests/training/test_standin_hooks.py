"""The stand-in trainer's extension points (``StandinConfig.key_fields``, ``mixer``, ``probe``): a config
subclass adds fields that change its batches and its key, and figures measured while it trains; the presets use
neither (research/induction_mix.py is the one user)."""

import dataclasses
from dataclasses import dataclass

import torch

from retrofit.models.standin import PRESETS, StandinConfig, build_model
from retrofit.training.standin import train


@dataclass(frozen=True)
class Reversed(StandinConfig):
    """Rows read backwards from step ``reverse_from`` on; the training loss every ``every`` steps as a figure."""

    reverse_from: int = -1
    every: int = 0

    def key_fields(self) -> dict:
        fields = super().key_fields()
        fields.pop("every")
        if self.reverse_from < 0:
            fields.pop("reverse_from")
        return fields

    def mixer(self, blocks):
        if self.reverse_from < 0:
            return None
        seen.append(blocks.shape)
        return lambda x, step: x.flip(1) if step >= self.reverse_from else x

    def probe(self, model, held, step):
        return {"held_rows": held.shape[0]} if self.every and step % self.every == 0 else None


seen: list = []


def test_a_subclass_keeps_the_key_of_its_base_while_its_fields_are_off():
    micro = PRESETS["micro"]
    off = Reversed(**dataclasses.asdict(micro))
    assert off.cache_key() == micro.cache_key() == dataclasses.replace(off, every=3).cache_key()
    assert dataclasses.replace(off, reverse_from=0).cache_key() != micro.cache_key()
    assert micro.mixer(torch.zeros(2, 2)) is None and micro.probe(None, None, 1) is None


def _trained(cfg: StandinConfig, curve: list | None = None) -> list[float]:
    blocks = torch.randint(0, 64, (8, cfg.n_positions), generator=torch.Generator().manual_seed(0))  # [8, L]
    model = build_model(cfg, 64, eos_token_id=0)
    return train(model, blocks, cfg, held=blocks[:3], curve=curve)


def test_the_trainer_feeds_the_mixed_batches_and_records_the_probe():
    micro = Reversed(**dataclasses.asdict(PRESETS["micro"]))
    plain = _trained(PRESETS["micro"])
    assert _trained(micro) == plain  # the subclass with its fields off trains the very same steps
    seen.clear()
    curve: list = []
    mixed = _trained(dataclasses.replace(micro, reverse_from=2, every=2), curve)
    assert seen == [(8, micro.n_positions)]  # one mixer per run, made from the training blocks
    assert mixed[:2] == plain[:2] and mixed[2:] != plain[2:]
    assert [(c["step"], c["held_rows"]) for c in curve] == [(2, 3), (4, 3)]
    assert curve[0]["tokens"] == 2 * micro.batch_size * micro.n_positions
