"""The masked-LM objective (issue 43): BERT's 15% rule, seeded draws, and an encoder fine-tuned through
``retrofit finetune`` as a user types it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as tf
import yaml

from retrofit.foundation.errors import UnsupportedArchitectureError
from retrofit.models.builtin import byte_tokenizer
from retrofit.scoring.masking import IGNORE, Masker, seed_of

from .test_finetune import FILES


def masker(rate=0.15):
    return Masker(mask_id=3, vocab_size=200, special_ids=(0, 1, 2, 3), rate=rate)


def test_the_rule_chooses_the_rate_never_a_special_token_and_masks_80_10_10():
    ids = torch.randint(4, 200, (64, 512), generator=torch.Generator().manual_seed(0))
    ids[:, 0], ids[:, -1] = 1, 2  # [CLS] ... [SEP]
    inputs, labels = masker()(ids, seed=5)
    chosen = labels != IGNORE
    assert abs(chosen.float().mean().item() - 0.15) < 0.005
    assert not chosen[:, 0].any() and not chosen[:, -1].any(), "a special token was chosen"
    assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(inputs[~chosen], ids[~chosen])
    masked = (inputs == 3) & chosen
    kept = (inputs == ids) & chosen
    assert abs(masked.sum() / chosen.sum() - 0.8) < 0.02
    assert abs(kept.sum() / chosen.sum() - 0.1 - 0.1 / 200) < 0.02  # a random token may equal the original


def test_draws_repeat_by_seed_and_differ_between_micro_batches():
    ids = torch.randint(4, 200, (2, 64), generator=torch.Generator().manual_seed(0))
    a, b = masker()(ids, seed_of(3, 7)), masker()(ids, seed_of(3, 7))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[1], masker()(ids, seed_of(3, 8))[1])
    assert not torch.equal(a[1], masker()(ids, seed_of(3, 7, process=1))[1])


def bert_folder(path, **config):
    """A tiny BertForMaskedLM with a byte-level tokenizer that has BERT's special tokens."""
    tok = byte_tokenizer()
    tok.add_special_tokens({"mask_token": "[MASK]", "cls_token": "[CLS]", "sep_token": "[SEP]"})
    cfg = tf.BertConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        **{"max_position_embeddings": 64, **config},
    )
    torch.manual_seed(0)
    tf.BertForMaskedLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def bert_recipe(tmp_path, **train) -> dict:
    return {
        "model": {"name_or_path": str(bert_folder(tmp_path / "bert"))},
        "convert": {"scheme": "alibi"},
        "data": {"files": FILES, "block_length": 128, "validation_fraction": 0.25, "max_validation_blocks": 4},
        "train": {"method": "full", "steps": 12, "batch_size": 2, "learning_rate": 1e-3, "warmup_steps": 1, **train},
        "output_dir": str(tmp_path / "run"),
    }


@pytest.mark.slow
def test_retrofit_finetune_trains_an_encoder_on_its_masked_tokens_past_its_table(tmp_path, capsys):
    """``retrofit finetune RECIPE`` on a BERT folder, blocks twice its 64-row table (ALiBi both ways): the
    masked-token validation loss falls and the saved model is the masked LM, converted."""
    import retrofit
    from retrofit.cli import main

    path = tmp_path / "bert.yaml"
    path.write_text(yaml.safe_dump(bert_recipe(tmp_path)))
    assert main(["finetune", str(path)]) == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["val_loss_after"] < s["val_loss_before"] - 0.3, s
    back = retrofit.load(next((tmp_path / "run").rglob("model.safetensors")).parent)
    assert type(back) is tf.BertForMaskedLM and retrofit.describe(back)["scheme"] == "alibi"


def test_calibration_fits_a_masked_lms_positions_to_its_originals_masked_predictions(tmp_path):
    """``retrofit.calibrate`` on a BERT converted to T5 buckets: only the bucket table trains, for KL to the
    original at the masked tokens of seeded draws (both read the same masked block), and the KL falls; the
    zero-shot ratio is read by the masked-LM evaluation on held-out text."""
    import copy

    from retrofit.foundation.documents import Document
    from retrofit.patch.conversion import convert
    from retrofit.training.calibrate import _kl_step, calibrate

    path = bert_folder(tmp_path / "bert")
    tok = tf.AutoTokenizer.from_pretrained(path)
    original = tf.BertForMaskedLM.from_pretrained(path).eval()
    model = convert(copy.deepcopy(original), "t5")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    text = [Path(f).read_text() for f in FILES]
    train = [Document(f"train-{i}", t) for i, t in enumerate(text[:-1])]
    held = [Document("held", text[-1])]
    record = calibrate(model, original, train, tokenizer=tok, steps=12, batch_size=2, learning_rate=1e-2,
                       heldout=held, budget=256, progress=False)  # fmt: skip
    assert record["kl_last10"] < record["kl_first10"], record["kl"]
    assert record["ppl_original"] > 1 and record["ratio_after"] > 0
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(k.startswith("retrofit_positions.") for k in changed), changed
    # the step's KL: at the masked tokens only, the two models reading the same masked block
    m = Masker.of(tok, model.config.vocab_size)
    ids = torch.randint(10, 200, (2, 48), generator=torch.Generator().manual_seed(0))
    inputs, labels = m(ids, 3)
    chosen = labels != IGNORE
    with torch.no_grad():
        got = _kl_step(model, original, ids, m, 3)
        lp = torch.log_softmax(original(input_ids=inputs).logits[chosen], -1)
        lq = torch.log_softmax(model(input_ids=inputs).logits[chosen], -1)
    torch.testing.assert_close(got, (lp.exp() * (lp - lq)).sum() / chosen.sum(), atol=1e-6, rtol=1e-5)


def _bert(path, native=16):
    bert_folder(path, max_position_embeddings=native)
    return tf.BertForMaskedLM.from_pretrained(path).eval()


def test_masked_distillation_reads_each_masked_token_from_the_teachers_most_central_window(tmp_path):
    """``masked_distill_kl`` against a plain loop: for every masked token, the KL between the student's
    prediction and the teacher's read from the native window where that token is most central (a block of 40
    tokens, a 16-token teacher); and zero against itself within its native length."""
    import torch.nn.functional as F

    from retrofit.patch.conversion import convert
    from retrofit.scoring.windows import centred_spans
    from retrofit.training.teacher import Teacher, TeacherView, masked_distill_kl

    teacher = _bert(tmp_path / "t")
    student = convert(_bert(tmp_path / "t"), "alibi")
    ids = torch.randint(10, 200, (2, 40), generator=torch.Generator().manual_seed(0))
    inputs, labels = Masker(mask_id=3, vocab_size=teacher.config.vocab_size, special_ids=(0, 1, 2, 3), rate=0.3)(ids, 7)
    view = TeacherView(window=16, stride=8)
    with torch.no_grad():
        s = student(input_ids=inputs).logits  # (2, 40, V)
        got = masked_distill_kl(s, inputs, labels, Teacher(teacher, view, temperature=2.0))
        want, n = 0.0, 0
        for b, p in (labels != IGNORE).nonzero().tolist():
            start, end, _, _ = next(sp for sp in centred_spans(40, 16, 8) if sp[2] <= p < sp[3])
            t = teacher(input_ids=inputs[b : b + 1, start:end]).logits[0, p - start]  # (V,)
            lp, lq = F.log_softmax(t / 2.0, -1), F.log_softmax(s[b, p] / 2.0, -1)
            want, n = want + (lp.exp() * (lp - lq)).sum(), n + 1
        torch.testing.assert_close(got, want / n * 4.0, atol=1e-5, rtol=1e-5)
        short, short_labels = inputs[:, :16], labels[:, :16]
        same = masked_distill_kl(teacher(input_ids=short).logits, short, short_labels, Teacher(teacher, view))
    assert got > 0 and abs(float(same)) < 1e-6


@pytest.mark.slow
def test_retrofit_finetune_distils_a_masked_lm_from_its_original(tmp_path):
    """``train.objective: distill`` on a BERT folder past its table: the KL to the original's masked predictions
    (read through its native window) is what trains, and it falls; ``both`` logs the two terms."""
    from retrofit.training import finetune

    def logged(out):
        return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if '"loss"' in x]

    out = finetune(bert_recipe(tmp_path, objective="distill", steps=10))
    assert json.loads((out / "summary.json").read_text())["teacher"]["window"] == 64
    kd = [x["distill_loss"] for x in logged(out)]
    assert len(kd) == 10 and sum(kd[-3:]) < 0.9 * sum(kd[:3]), kd
    both = logged(finetune({**bert_recipe(tmp_path, objective="both", steps=2), "output_dir": str(tmp_path / "b")}))
    assert all(x["loss"] == pytest.approx(x["lm_loss"] + x["distill_loss"], rel=1e-4) for x in both), both


def test_a_classifier_without_a_task_is_refused_by_the_fine_tune_with_what_works(tmp_path):
    """A classifier has no language-model objective: a recipe without ``task`` is refused, naming the key."""
    from retrofit.training import finetune

    r = bert_recipe(tmp_path)
    cfg = tf.AutoConfig.from_pretrained(r["model"]["name_or_path"])
    tf.BertForSequenceClassification(cfg).save_pretrained(r["model"]["name_or_path"])
    with pytest.raises(UnsupportedArchitectureError, match="set 'task: classification' or 'task: embedding'"):
        finetune(r)


@pytest.mark.slow  # three fine-tunes
def test_a_masked_lm_fine_tune_killed_and_resumed_equals_the_uninterrupted_one(tmp_path):
    """LoRA on a BERT folder, stopped dead after its first checkpoint and resumed: the same masks are drawn for
    every step after the resume (seeded by the micro-batch), so the final weights equal an uninterrupted run's."""
    from ..procs import assert_resume_is_exact

    def recipe(out):
        r = bert_recipe(tmp_path, method="lora", steps=8, gradient_accumulation_steps=2, seed=3)
        r["train"]["lora"] = {"r": 4, "alpha": 8, "dropout": 0.0}
        return {**r, "checkpoint": {"every": 3}, "output_dir": str(out)}

    assert_resume_is_exact(recipe, tmp_path, 8)


def test_a_row_always_has_a_token_to_predict():
    """At a low rate a short row may draw none: it gets its lowest draw (the loss is never 0/0)."""
    ids = torch.randint(4, 200, (256, 8), generator=torch.Generator().manual_seed(0))
    _, labels = masker(rate=0.01)(ids, seed=1)
    assert ((labels != IGNORE).sum(-1) >= 1).all()
