"""Passkey: prompt builder and grader round-trip; a model that copies the key scores 100%."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tqdm import tqdm

from retrofit.evaluation import passkey
from retrofit.evaluation.models import EvalModel
from retrofit.evaluation.passkey import run as run_passkey

try:  # tests/ is a package in this repo; also runnable as plain files
    from .test_eval_common import byte_tokenizer, tiny_llama
except ImportError:
    from test_eval_common import byte_tokenizer, tiny_llama


class Copier(torch.nn.Module):
    """An induction head: predicts the token that followed the longest earlier match of the current suffix."""

    def __init__(self, vocab: int = 260):
        super().__init__()
        self.vocab = vocab
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, **kw):
        seq = input_ids[0].tolist()
        best, nxt = 0, 0
        for i in range(len(seq) - 1):  # length of the match of seq[..i] with seq's suffix
            n = 0
            while n <= i and seq[i - n] == seq[len(seq) - 1 - n] and n < len(seq) - 1 - i:
                n += 1
            if n > best:
                best, nxt = n, seq[i + 1]
        logits = torch.zeros(1, len(seq), self.vocab)
        logits[0, -1, nxt] = 1.0
        return SimpleNamespace(logits=logits)  # no past_key_values: the decoder re-feeds the sequence


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_prompt_builder_places_the_key(depth):
    tok = byte_tokenizer()
    b = passkey.PromptBuilder(tok)
    p = b.build(600, depth, "48213")
    assert len(p.ids) <= 600 and len(p.ids) > 600 - len(b.filler)
    text = tok.decode(p.ids)
    assert text.startswith(passkey.INTRO) and text.endswith(passkey.QUESTION)
    assert text.count("The pass key is 48213. Remember it.") == 1
    filler_tokens = len(p.ids) - b.fixed_tokens("48213")
    before = p.key_token_index - len(b.intro)
    assert abs(before - depth * filler_tokens) <= len(b.filler)  # within one filler sentence block of the depth
    with pytest.raises(ValueError):
        b.build(100, depth, "48213")


def test_grader_round_trip():
    key = passkey.make_keys(3, 1)[0]
    assert len(key) == 5 and passkey.make_keys(3, 4)[0] == key  # reproducible
    assert passkey.grade(f" {key}. Remember it.", key)
    assert passkey.grade(f" is {key}", key)
    assert not passkey.grade(f" {int(key) + 1}", key)
    assert not passkey.grade(f" {key}7", key)  # a 6-digit number is not the key
    assert not passkey.grade(" no idea", key)
    assert passkey.grade(f" 12 then {key}", key)  # first 5-digit number counts


def test_wilson_interval_matches_published_values():
    # Wilson (1927); Newcombe (1998) table I: 0/10 -> [0, 0.2775], 5/10 -> [0.2366, 0.7634]
    assert passkey.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert passkey.wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = passkey.wilson(30, 30)
    assert high == 1.0 and low == pytest.approx(30 / (30 + 1.96**2), abs=1e-9)  # n / (n + z^2) at n/n
    with pytest.raises(ValueError):
        passkey.wilson(0, 0)


def test_copying_model_scores_100_percent():
    tok = byte_tokenizer()
    m = EvalModel("copier", "converted", Copier(), tok, {"max_length": None})
    capped = EvalModel("capped", "baseline", Copier(), tok, {"max_length": 300})
    with tqdm(disable=True) as bar:
        results = run_passkey([m, capped], [280, 400], [0.0, 0.5, 1.0], trials=2, seed=7, bar=bar)
    mine = [r for r in results if r["model"] == "copier"]
    assert len(mine) == 6 and all(r["accuracy"] == 1.0 for r in mine)
    assert all((r["ci_low"], r["ci_high"]) == (round(passkey.wilson(2, 2)[0], 4), 1.0) for r in mine)
    assert all(a["answer"].strip().startswith(a["key"]) for r in mine for a in r["answers"])
    past = [r for r in results if r["model"] == "capped" and r["length"] == 400]
    assert all(r["accuracy"] is None and "not run" in r["note"] for r in past)  # never run past its limit
    within = [r for r in results if r["model"] == "capped" and r["length"] == 280]
    assert all(r["accuracy"] == 1.0 for r in within)
    keys = [a["key"] for r in mine for a in r["answers"]]
    assert len(set(keys)) == len(keys)  # a fresh key per trial
    assert [a["key"] for r in within for a in r["answers"]] == keys[:6]  # every model sees the same keys


def test_greedy_decode_with_cache_matches_without(monkeypatch):

    model = tiny_llama()
    ids = list(range(40, 80))
    cached = passkey.greedy_decode(model, ids, 6)
    x = torch.tensor([ids])
    plain = []
    with torch.no_grad():
        for _ in range(6):
            nxt = int(model(x, use_cache=False).logits[0, -1].argmax())
            plain.append(nxt)
            x = torch.cat([x, torch.tensor([[nxt]])], 1)
    assert cached == plain


def test_cli_eval_passkey_flags_turn_passkey_on(tmp_path):
    """`retrofit eval CHECKPOINT --passkey-lengths ...` without --passkey runs passkey (as any --recall-* runs
    recall): a flag of a measure is never silently ignored."""
    import json

    import retrofit
    from retrofit.cli import main
    from retrofit.models.builtin import tiny_gpt2

    model_dir = tmp_path / "model"
    model = retrofit.convert(retrofit.load_model(str(tiny_gpt2()))[0], "alibi")
    retrofit.save(model, model_dir, tokenizer=byte_tokenizer())
    args = ["eval", str(model_dir), "--lengths", "32", "--budget", "64", "--no-sliding", "--no-copy", "--no-progress"]
    assert main([*args, "--passkey-lengths", "512", "--passkey-depths", "0.5", "--passkey-trials", "1"]) == 0
    report = json.loads((model_dir / "eval" / "report.json").read_text())
    assert report["settings"]["passkey"]["lengths"] == [512]
    assert [(c["length"], c["depth"], c["trials"]) for c in report["passkey"]] == [(512, 0.5, 1)]
    assert main(args) == 0  # without a passkey flag: not run
    assert json.loads((model_dir / "eval" / "report.json").read_text())["passkey"] is None
