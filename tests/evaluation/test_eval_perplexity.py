"""Perplexity: hand computation, same tokens at every length, sliding window vs a naive reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from retrofit.evaluation import evaluate
from retrofit.evaluation.perplexity import loss_by_position, summarize, t_quantile_975
from retrofit.scoring import losses
from retrofit.scoring.losses import nonoverlapping_nll, sliding_nll
from retrofit.scoring.tokens import first_tokens
from retrofit.scoring.windows import sliding_spans

try:  # tests/ is a package in this repo; also runnable as plain files
    from .test_eval_common import byte_tokenizer, docs, tiny_gpt2, tiny_llama
except ImportError:
    from test_eval_common import byte_tokenizer, docs, tiny_gpt2, tiny_llama


def _stream(n: int) -> torch.Tensor:
    ids, _ = first_tokens(byte_tokenizer(), docs(), n + 1)
    return torch.tensor(ids)


def _bigram(model):
    """Zero every path but token -> logits, so a target's loss depends only on the token before it."""
    with torch.no_grad():
        model.transformer.wpe.weight.zero_()
        for block in model.transformer.h:
            for lin in (block.attn.c_proj, block.mlp.c_proj):
                lin.weight.zero_()
                lin.bias.zero_()
    return model


def test_ppl_equals_hand_computation():
    tok, model = byte_tokenizer(), tiny_gpt2()
    report = evaluate(model, [16, 32], data=docs(), tokenizer=tok, budget=64, sliding=False, progress=False)
    ids, _ = first_tokens(tok, docs(), 65)
    for L in (16, 32):
        total = 0.0
        for k in range(64 // L):
            x = torch.tensor([ids[k * L : k * L + L]])
            with torch.no_grad():
                logits = model(x).logits[0].double()  # [L, V]
            for p in range(L):
                row = logits[p]
                logz = math.log(sum(math.exp(v) for v in row.tolist()))
                total += logz - row[ids[k * L + p + 1]].item()
        assert report.ppl(length=L) == pytest.approx(math.exp(total / 64), rel=1e-6)
        row = next(r for r in report.rows if r["length"] == L)
        assert (row["tokens"], row["windows"]) == (64, 64 // L)


def test_every_length_and_method_scores_the_same_targets():
    model = _bigram(tiny_gpt2(n_positions=128))
    ids = _stream(128)
    ref = nonoverlapping_nll(model, ids, 128)
    assert ref.shape == (128,)
    for L in (8, 16, 32, 64):
        np.testing.assert_allclose(nonoverlapping_nll(model, ids, L, batch_size=3), ref, rtol=1e-5)
    np.testing.assert_allclose(sliding_nll(model, ids, 32, 8), ref, rtol=1e-5)
    report = evaluate(
        model, [16, 32, 64], data=docs(), tokenizer=byte_tokenizer(), budget=128, stride=8, progress=False
    )
    assert {r["tokens"] for r in report.rows} == {128}
    assert len({round(r["nll"], 9) for r in report.rows}) == 1  # a bigram model: same tokens, same loss


def test_documents_joined_with_eos_or_a_separator():
    tok = byte_tokenizer()
    ids, used = first_tokens(tok, docs(3, 1), 10_000)
    assert used == 3 and ids.count(tok.eos_token_id) == 3 and ids[-1] == tok.eos_token_id
    ids, _ = first_tokens(tok, docs(3, 1), 10_000, separator="\n\n")
    assert tok.eos_token_id not in ids and tok.decode(ids) == "".join(d.text + "\n\n" for d in docs(3, 1))
    assert first_tokens(tok, docs(), 50)[0] == first_tokens(tok, docs(), 10_000)[0][:50]


@pytest.mark.parametrize("make", [tiny_gpt2, tiny_llama])
def test_sliding_equals_naive_reference(make):
    """Each target scored alone, on exactly the context its window gives it."""
    model, ids, W, S = make(), _stream(96), 32, 8
    got = sliding_nll(model, ids, W, S)
    want = np.empty(96)
    for start, end, k in sliding_spans(96, W, S):
        for t in range(end - k, end):  # target t is ids[t + 1], context ids[start : t + 1]
            with torch.no_grad():
                logits = model(ids[start : t + 1][None]).logits[0, -1].double()
            want[t] = (torch.logsumexp(logits, 0) - logits[ids[t + 1]]).item()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [tiny_gpt2, tiny_llama])
def test_chunked_logits_match_full_logits(make, monkeypatch):
    model, ids = make(), _stream(64)
    x, y = ids[:-1].view(2, 32), ids[1:].view(2, 32)
    with torch.no_grad():
        full = torch.nn.functional.cross_entropy(model(x).logits.transpose(1, 2).float(), y, reduction="none")
    monkeypatch.setattr(losses, "LOGIT_CHUNK", 7)
    with torch.inference_mode():
        got = losses.token_nll(model, x, y)
    torch.testing.assert_close(got.float(), full, rtol=1e-5, atol=1e-5)


def test_summary_and_ci_by_hand():
    nll = np.array([1.0, 1.0, 2.0, 2.0, 3.0, 3.0])
    s = summarize(nll, 2)  # blocks: 1, 2, 3 -> mean 2, sd 1, n 3
    half = 4.303 * 1.0 / math.sqrt(3)
    assert s["ppl"] == pytest.approx(math.e**2)
    assert (s["ci_low"], s["ci_high"]) == (pytest.approx(math.exp(2 - half)), pytest.approx(math.exp(2 + half)))
    assert summarize(nll, 6)["ci_low"] is None  # one window: no interval
    assert t_quantile_975(40) == pytest.approx(2.021, abs=1e-3)
    assert t_quantile_975(1000) == pytest.approx(1.962, abs=1e-3)


def test_loss_by_position_buckets():
    nll = np.tile(np.arange(8, dtype=float), 3)  # 3 windows of 8, loss = position
    out = loss_by_position(nll, 8, 4)
    assert out["bucket_start"] == [0, 1, 2, 4] and out["bucket_end"] == [1, 2, 4, 8]  # log-spaced
    assert out["loss"] == [0.0, 1.0, 2.5, 5.5] and out["windows"] == 3


def test_peft_wrapped_model_scores_like_its_base():
    """A PEFT model goes through its full forward (its base_model is not the bare transformer)."""
    peft = pytest.importorskip("peft")
    model, ids = tiny_gpt2(), _stream(64)
    want = nonoverlapping_nll(model, ids, 32)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(target_modules=["c_attn"], r=2))  # LoRA B = 0: same function
    np.testing.assert_allclose(nonoverlapping_nll(wrapped, ids, 32), want, rtol=1e-6)
