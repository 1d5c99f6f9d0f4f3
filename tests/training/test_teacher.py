"""The distillation teacher reads long blocks through the original's own sliding window (issue 33, item 2)."""

import contextlib
import copy
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import retrofit
from retrofit.foundation.errors import LengthError, RecipeError
from retrofit.scoring.losses import last_logits
from retrofit.scoring.windows import sliding_spans
from retrofit.training import finetune
from retrofit.training.loop import _loss
from retrofit.training.positions import Placer
from retrofit.training.recipe import Recipe
from retrofit.training.teacher import Teacher, TeacherView, distill_kl

from .. import tiny
from .test_finetune import FILES, recipe

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

W = tiny.NATIVE  # 32


def sliding_window_logits(model, input_ids: torch.Tensor, window: int, stride: int) -> torch.Tensor:
    """Logits [B, T, V] of every position of ``input_ids`` [B, T] read through sliding windows
    (``sliding_spans``): positions [0, window) come from the first window; each later window ends
    ``stride`` tokens further and gives only its last ``stride`` positions (fewer for the last one), so
    position p >= window is predicted from between window - stride and window tokens of context.
    The reference the teacher's window-by-window KL is checked against (it materialises [B, T, V])."""
    spans = sliding_spans(input_ids.shape[1], window, stride)
    return torch.cat([last_logits(model, input_ids[:, s:e], k) for s, e, k in spans], dim=1)


def _ids(t=4 * W, b=2, seed=0):
    return torch.randint(0, tiny.VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def _by_hand(model, ids, window, stride):
    """The original's windowed logits, a plain loop: the first window gives [0, window); each next window
    starts ``stride`` later and gives the positions no earlier window gave."""
    T = ids.shape[1]
    out = torch.full((ids.shape[0], T, tiny.VOCAB), float("nan"))
    done, start = 0, 0
    while done < T:
        end = min(start + window, T)
        if end - start < window and start:  # the last, short step: a full window ending at T
            start, end = T - window, T
        logits = model(input_ids=ids[:, start:end]).logits
        out[:, done:end] = logits[:, done - start :]
        done, start = end, start + stride
    return out


@pytest.mark.parametrize("stride", [16, 10, 32, 1])
@torch.no_grad()
def test_sliding_window_logits_equal_the_original_windowed_by_hand(stride):
    torch.manual_seed(0)
    model = tiny.gpt2()
    ids = _ids()
    got = sliding_window_logits(model, ids, W, stride)
    want = _by_hand(model, ids, W, stride)
    assert got.shape == want.shape == (2, 4 * W, tiny.VOCAB) and not want.isnan().any()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[:, :W], model(input_ids=ids[:, :W]).logits, rtol=1e-5, atol=1e-5)


def _student_and_teacher():
    torch.manual_seed(0)
    student = tiny.gpt2()
    teacher = copy.deepcopy(student).requires_grad_(False)
    retrofit.convert(student, "alibi", kernel="chunked")
    return student, teacher


def _kl_by_hand(student_logits, teacher_logits, temperature):
    s = torch.log_softmax(student_logits.double() / temperature, -1)
    p = torch.log_softmax(teacher_logits.double() / temperature, -1)
    return (p.exp() * (p - s)).sum(-1).mean() * temperature**2


def test_windowed_kl_equals_the_kl_to_the_whole_sliding_teacher():
    student, teacher = _student_and_teacher()
    ids = _ids()
    view = TeacherView(W, 12)
    logits = student(input_ids=ids).logits
    got = distill_kl(logits, ids, Teacher(teacher, view, 2.0))
    with torch.no_grad():
        want = _kl_by_hand(logits, sliding_window_logits(teacher, ids, W, 12), 2.0)
    assert abs(got.item() - want.item()) < 1e-6 * max(1.0, want.item())


def _run_loss(student, teacher, ids, **train):
    train = {
        "objective": "distill",
        "temperature": 1.0,
        "distill_weight": 1.0,
        "teacher_window": "sliding",
        "teacher_stride": None,
        **train,
    }
    r = SimpleNamespace(train=SimpleNamespace(**train))
    view = TeacherView.of(r.train, ids.shape[1], W)
    seen = []

    def keep(module, args, out):
        out.retain_grad()
        seen.append(out)

    hook = student.lm_head.register_forward_hook(keep)
    acc = SimpleNamespace(autocast=contextlib.nullcontext)
    loss, parts = _loss(acc, student, ids, Teacher(teacher, view, r.train.temperature, acc.autocast), r.train)
    hook.remove()
    loss.backward()
    return view, seen[0].grad.abs().sum(-1)  # [B, T]: how much each position's logits receive


def test_every_position_of_a_4x_native_block_gets_a_teacher():
    """objective distill, block 4 x native: the default (sliding, stride W/2) teaches every position."""
    student, teacher = _student_and_teacher()
    view, grad = _run_loss(student, teacher, _ids())
    assert view == TeacherView(W, W // 2) and len(view.spans(4 * W)) == 7
    assert grad.shape == (2, 4 * W) and (grad > 0).all()


def test_first_window_teacher_is_the_old_behaviour():
    student, teacher = _student_and_teacher()
    view, grad = _run_loss(student, teacher, _ids(), teacher_window="first")
    assert view == TeacherView(W, None) and grad.shape == (2, W) and (grad > 0).all()  # distill trains on W alone


def test_recipe_teacher_keys():
    base = recipe("/tmp/unused", train__objective="distill")
    r = Recipe.from_dict(base)
    assert (r.train.teacher_window, r.train.teacher_stride) == ("sliding", None)
    with pytest.raises(RecipeError, match="teacher_stride"):
        Recipe.from_dict(recipe("/tmp/unused", train__teacher_stride=8))  # objective lm
    with pytest.raises(RecipeError, match="teacher_window: sliding"):
        Recipe.from_dict(base, ["train.teacher_window=first", "train.teacher_stride=8"])
    with pytest.raises(RecipeError, match="teacher_stride"):
        Recipe.from_dict(base, ["train.teacher_stride=0"])
    with pytest.raises(RecipeError, match="teacher_window"):
        Recipe.from_dict(base, ["train.teacher_window=all"])
    with pytest.raises(RecipeError, match="exceeds the teacher's window, its native length 32"):
        TeacherView.of(Recipe.from_dict(base, ["train.teacher_stride=33"]).train, 128, W)


def test_block_past_a_finite_reach_names_the_scheme(monkeypatch):
    """Long blocks ask the scheme how far it reads (Scheme.max_length(); the stretched table's rows)."""
    from retrofit.scheme import SCHEMES

    student, _ = _student_and_teacher()
    r = Recipe.from_dict(recipe("/tmp/unused", data__block_length=4 * W))
    placer = Placer(r.train.positions, r.data.block_length, r.train.seed)
    placer.check(student, r.convert.scheme)  # alibi: no limit
    assert placer.fade_offset_cap is None
    monkeypatch.setattr(SCHEMES.get("alibi"), "max_length", lambda self: 4 * W)
    placer.check(student, r.convert.scheme)  # a reach of exactly the block
    monkeypatch.setattr(SCHEMES.get("alibi"), "max_length", lambda self: 3 * W)
    with pytest.raises(
        LengthError, match=r"exceeds the 96 positions the model accepts \(the reach of scheme 'alibi'\)"
    ):
        placer.check(student, r.convert.scheme)


def test_tiny_long_block_distill_recipe_runs_and_logs_the_teacher_cost(tmp_path, caplog):
    """recipes/tiny-long-distill.yaml: block 256 = 4 x tiny-gpt2's native 64, sliding teacher, stride 32."""
    path = Path(__file__).resolve().parents[2] / "recipes" / "tiny-long-distill.yaml"
    with caplog.at_level(logging.INFO, logger="retrofit.training"):
        out = finetune(
            path,
            [f"output_dir={tmp_path / 'run'}", "data.dataset=null", f"data.files={json.dumps(FILES)}", "train.steps=3"],
        )
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    train = [x for x in log if "loss" in x]
    assert len(train) == 3 and all(x["teacher_s_per_step"] > 0 and 0 < x["teacher_share"] < 1 for x in train)
    teacher = json.loads((out / "summary.json").read_text())["teacher"]
    assert teacher["windows_per_block"] == 7 and (teacher["window"], teacher["stride"]) == (64, 32)
    assert 0 < teacher["share_of_step"] < 1
    assert any(m.startswith("teacher: 7 windows of 64, stride 32, ") and "of the step)" in m for m in caplog.messages)
