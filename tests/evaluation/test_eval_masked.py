"""Masked-LM evaluation against length (issue 43): ``retrofit eval`` on a converted encoder scores one draw of
masked tokens with full windows and native sliding windows, and says whether the model reads past native."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from retrofit.evaluation import masked
from retrofit.scoring import masked as scoring_masked

from ..training.test_masked_lm import bert_folder, bert_recipe


def test_the_gain_is_paired_over_windows_and_reads_only_above_noise():
    rng = np.random.default_rng(0)
    full = rng.normal(3.0, 0.5, 4096)
    full[rng.random(4096) > 0.15] = np.nan  # only masked tokens are scored
    assert masked.gain(full + 0.2, full, 256)["reads"] is True
    same = masked.gain(full + rng.normal(0, 0.01, 4096), full, 256)
    assert same["reads"] is False and same["ci_low"] < 0 < same["ci_high"]


class _Lookup(torch.nn.Module):
    """A 'masked LM' that knows a masked token only when the same token sits exactly 40 positions earlier."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab, self.w = vocab, torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        back = torch.full_like(input_ids, -1)
        back[:, 40:] = input_ids[:, :-40]
        hit = back >= 0
        logits[hit.nonzero(as_tuple=True) + (back[hit],)] = 8.0
        return type("Out", (), {"logits": logits})()


def test_a_model_that_reads_40_back_gains_from_full_windows_over_a_window_of_32():
    """A reference the gain must detect: a period-40 stream read by a model that copies from 40 back gains from
    windows of 128 over native windows of 32 (its sliding rows never hold both occurrences)."""
    period = torch.randint(10, 50, (40,), generator=torch.Generator().manual_seed(0))
    ids = period.repeat(32)  # (1280,)

    class Tok:
        mask_token_id, all_special_ids = 0, [0]

        def decode(self, ids):
            return "x" * len(ids)

    s = scoring_masked.masked_stream(ids, Tok(), 50)
    s.labels[:40] = -100  # the first period has nothing 40 back
    s.inputs[:] = torch.where(s.labels != -100, s.inputs, ids)
    m = _Lookup(50)
    full, slide = scoring_masked.full_nll(m, s, 128), scoring_masked.sliding_nll(m, s, 32)
    g = masked.gain(slide, full, 128)
    assert g["reads"] and g["gain_nats"] > 1.0, g


@pytest.mark.slow
def test_retrofit_eval_on_a_converted_encoder_writes_masked_rows_and_the_far_context_gain(tmp_path, capsys):
    """As a user types it: ``retrofit convert FOLDER --to alibi --out RUN``, then
    ``retrofit eval RUN --lengths 1x,2x --baseline original``: the original (64-row table) gets its sliding
    and 1x rows only, the converted model full rows at 1x and 2x and its gain past native with an interval."""
    from retrofit.cli import main

    folder = bert_folder(tmp_path / "bert")
    assert main(["convert", str(folder), "--to", "alibi", "--out", str(tmp_path / "run")]) == 0
    code = main(["eval", str(tmp_path / "run"), "--lengths", "1x,2x", "--baseline", "original", "--budget", "1024"])
    assert code == 0
    report = json.loads(next((tmp_path / "run").rglob("report.json")).read_text())
    assert report["kind"] == "masked-lm" and report["native_length"] == 64
    rows = {(r["role"], r["read_as"]): r for r in report["rows"]}
    assert ("baseline", "sliding 64") in rows and ("baseline", "windows of 64") in rows
    assert ("baseline", "windows of 128") not in rows, "the original cannot read past its 64-row table"
    past = rows[("converted", "windows of 128")]
    assert past["masked_tokens"] > 100 and np.isfinite(past["bpc"]) and past["gain"]["ci_low"] is not None
    assert "far-context gain" in capsys.readouterr().out
    # retrieval at distance, scored by masking, by default: both models at every distance, the original's past
    # its table through its sliding window; the effective reach in the report
    cells = report["copy"]["cells"]
    assert {c["role"] for c in cells} == {"converted", "baseline"} and max(c["distance"] for c in cells) > 64
    assert all(c["note"] for c in cells if c["role"] == "baseline" and c["distance"] + 16 > 64)
    assert {r["model"] for r in report["copy"]["reach"]} == {c["model"] for c in cells}
    assert "Retrieval at distance" in next((tmp_path / "run").rglob("report.md")).read_text()
    assert main(["card", str(tmp_path / "run")]) == 0  # the card a push uploads: the encoder's task throughout
    card = (tmp_path / "run" / "README.md").read_text()
    assert "pipeline_tag: fill-mask" in card and "AutoModelForMaskedLM.from_pretrained" in card
    assert "AutoModelForCausalLM" not in card and "windows of 128" in card


def test_a_fine_tuned_encoder_run_evaluates_through_its_folder(tmp_path):
    """``retrofit.evaluate(RUN)`` on a fine-tune's run folder of a masked LM (the final model inside)."""
    import retrofit
    from retrofit.training import finetune

    run = finetune(bert_recipe(tmp_path, steps=2))
    report = retrofit.evaluate(run, lengths=["1x", "2x"], budget=512, progress=False)
    assert report.kind == "masked-lm" and {r["length"] for r in report.data["rows"]} == {64, 128}
