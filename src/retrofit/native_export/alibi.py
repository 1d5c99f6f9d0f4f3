"""ALiBi to the same architecture: the native-ALiBi sources (BLOOM, MPT) after a fine-tune that kept their ALiBi,
and Falcon given ALiBi (a rotary Falcon becomes ``alibi: true``). Each target builds the standard slopes of its
head count in its own sign convention, so the export is exact where the patched model used them: no learned
slopes, and the bias on the target's side of the 1/sqrt(d) scaling (Falcon before it: ``scale_bias``; BLOOM and
MPT after it)."""

from __future__ import annotations

import math

from ..foundation.errors import RetrofitError
from ..patch.conversion import scheme_of
from .base import Built, Surgery, plain_config
from .gpt2 import FALCON_BF16_EXACT

BEFORE_SCALING = {"falcon": True, "bloom": False, "mpt": False}  # where each target adds the bias


def same_architecture(model, info, opts) -> Built:
    family, o = info["architecture"], info["options"]
    scaled, learned = bool(o.get("scale_bias")), bool(o.get("learn_slopes"))
    wrong = []
    if learned:
        wrong.append("its slopes are learned (learn_slopes=true); the target builds the standard ones")
    if scaled != BEFORE_SCALING[family]:
        wrong.append(
            f"it adds the bias {'before' if scaled else 'after'} the 1/sqrt(d) scaling, {family} "
            f"{'before' if BEFORE_SCALING[family] else 'after'} it (convert with scale_bias="
            f"{str(BEFORE_SCALING[family]).lower()} for an exact export)"
        )
    if wrong and not opts["approximate"]:
        raise RetrofitError(
            f"export: {family} + alibi is not exact: {'; '.join(wrong)}. Pass approximate=True (--approximate) "
            "for an inexact export, or load this model with retrofit.load(path)"
        )
    cfg = plain_config(model)
    notes = [f"approximate: {w}" for w in wrong]
    if family == "falcon":
        cfg.alibi = True
        cfg.max_position_embeddings = opts["max_length"]
    if family == "mpt":  # MPT builds its bias for max_seq_len keys and cannot read past them
        cfg.max_seq_len = opts["max_length"]
        notes.append(f"max_seq_len {opts['max_length']}: MPT's ALiBi tensor covers that many keys")
    dst = type(model)(cfg).to(dtype=model.dtype).eval()
    cut = Surgery(dst)
    src = {k: v for k, v in model.state_dict().items() if not k.startswith("retrofit_positions.")}
    extra = sorted(set(src) - set(dst.state_dict()))
    if extra:
        raise RetrofitError(f"export: source tensors with no place in {type(dst).__name__}: {extra[:8]}")
    for name, p in dst.named_parameters():
        if name in src:
            cut(p, src[name], name)
    built = Built(cut.finish(model), exact=not wrong, notes=notes, reach=opts["max_length"])
    if family == "falcon":
        built.exact_below = FALCON_BF16_EXACT if built.exact else None
        built.notes.append(
            f"Falcon builds the ALiBi bias slope*position in bfloat16: exact for up to {FALCON_BF16_EXACT - 1} "
            "tokens in fp32; beyond, key biases are rounded to 8 significant bits"
        )
        if not math.log2(scheme_of(model).spec.num_heads).is_integer():
            built.exact = False
            built.notes.append("a head count that is not a power of two: some slopes are not exact in bfloat16")
    return built
