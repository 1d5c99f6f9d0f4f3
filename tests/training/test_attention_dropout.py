"""A fine-tune's ``train.attention_dropout`` replaces the attention module's own dropout while training: at 0
a GPT-2 (attn_pdrop 0.1) converted to T5 trains on the fused band kernel, not the chunked one."""

from __future__ import annotations

import torch

import retrofit
from retrofit.training.model import set_attention_dropout
from retrofit.training.recipe import TrainConfig
from tests import tiny


def test_attention_dropout_override(user_kernel):
    model = tiny.gpt2()
    model.config.attn_pdrop = 0.1
    for block in model.transformer.h:
        block.attn.attn_dropout.p = 0.1
    retrofit.convert(model, "t5")
    model.train()
    x = torch.randint(0, model.config.vocab_size, (1, 32))
    model(x).logits.sum().backward()
    assert retrofit.describe(model)["last_kernel"] == "chunked"  # dropout: the fused kernels have none
    assert set_attention_dropout(model, TrainConfig()) == 0.0  # the fine-tune's default, as the loop sets it
    model(x).logits.sum().backward()
    assert retrofit.describe(model)["last_kernel"] == "cpu-flash-band"


def test_attention_dropout_null_or_unconverted_keeps_the_models_own():
    train = TrainConfig()
    assert set_attention_dropout(tiny.gpt2(), train) is None  # unconverted: no state, GPT-2's own stays
    model = tiny.gpt2()
    retrofit.convert(model, "t5")
    train.attention_dropout = None
    assert set_attention_dropout(model, train) is None
    assert model._retrofit_state.attention_dropout is None
