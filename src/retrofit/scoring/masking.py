"""The masked-LM objective (BERT, Devlin et al. 2019): a rate of each block's tokens is chosen (never a special
token; at least one per row that has any other); of those 80% become the mask token, 10% a random token, 10%
stay; the loss reads the chosen ones only.

Draws are seeded by the micro-batch's index (and the process), so a resumed fine-tune masks exactly as the
uninterrupted one, and the validation blocks are masked the same way at every evaluation."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..foundation.seeds import derive

IGNORE = -100  # transformers' label for "no loss here"


@dataclass(frozen=True)
class Masker:
    mask_id: int
    vocab_size: int
    special_ids: tuple[int, ...]
    rate: float = 0.15

    @classmethod
    def of(cls, tok, vocab_size: int, rate: float = 0.15) -> Masker:
        """From the model's tokenizer; a tokenizer without a mask token cannot serve a masked LM."""
        from ..foundation.errors import RecipeError

        if getattr(tok, "mask_token_id", None) is None:
            raise RecipeError(f"the masked-LM objective needs a mask token; {type(tok).__name__} has none")
        return cls(int(tok.mask_token_id), int(vocab_size), tuple(sorted(set(tok.all_special_ids))), float(rate))

    def __call__(self, batch: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels) for ``batch`` (B, T): labels are the original ids where chosen, IGNORE elsewhere."""
        g = torch.Generator().manual_seed(seed)
        shape = batch.shape
        u = torch.rand(shape, generator=g)  # (B, T) the choice
        how = torch.rand(shape, generator=g)  # (B, T) mask / random / keep
        rand = torch.randint(0, self.vocab_size, shape, generator=g)  # (B, T)
        ids = batch.cpu()
        allowed = ~torch.isin(ids, torch.tensor(self.special_ids, dtype=ids.dtype))  # (B, T)
        chosen = (u < self.rate) & allowed
        # a row with a token to predict always predicts one (the loss of an empty draw is 0/0): its lowest draw
        none = ~chosen.any(-1) & allowed.any(-1)  # (B,)
        first = torch.where(allowed, u, torch.full_like(u, 2.0)).argmin(-1)  # (B,)
        chosen[none, first[none]] = True
        labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
        inputs = torch.where(chosen & (how < 0.8), torch.full_like(ids, self.mask_id), ids)
        inputs = torch.where(chosen & (how >= 0.8) & (how < 0.9), rand, inputs)
        return inputs.to(batch.device), labels.to(batch.device)


def masker_for(model, tok, rate: float = 0.15) -> Masker | None:
    """The masked-LM draw for a masked LM (its task decides: the fine-tune's objective, its distillation and
    its calibration), None for a causal LM."""
    from ..foundation import task

    if task.of_model(model).name != "masked-lm":
        return None
    return Masker.of(tok, model.get_input_embeddings().weight.shape[0], rate)


def seed_of(seed: int, micro_batch: int, process: int = 0) -> int:
    """One seed per (run seed, micro-batch index, process): the same draws on resume."""
    return derive(seed, micro_batch * 7_919 + process * 104_729) % (1 << 62)
