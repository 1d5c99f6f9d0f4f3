"""The weight-decay rule, for every optimiser retrofit builds (fine-tunes and the stand-ins' pretraining):
matrices decay; biases, norms and the new position parameters (``retrofit_positions``) do not."""

from __future__ import annotations

from torch import nn

from .conversion import POSITIONS_MODULE


def decays(name: str, p: nn.Parameter) -> bool:
    return p.ndim >= 2 and POSITIONS_MODULE not in name and "norm" not in name.lower()


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups of the trainable parameters: decayed (``weight_decay``) and not (0)."""
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if p.requires_grad:
            (decay if decays(n, p) else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
