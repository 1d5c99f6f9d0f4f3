"""Calibration (issue 33 item 3): only the scheme's position parameters move, KL to the original falls,
ALiBi's learnable slopes, the CLI and the recipe phase."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import retrofit
from retrofit.data.specs import Document
from retrofit.foundation.errors import DataError, OptionError
from retrofit.patch.conversion import scheme_of, set_kernel
from retrofit.training.calibrate import calibrate, kl_to_original, position_parameters
from tests.tiny import TINY

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

TEXT = (
    "First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. First Citizen: You are all "
    "resolved rather to die than to famish? All: Resolved. resolved. First Citizen: First, you know Caius Marcius "
    "is chief enemy to the people. "
)


def docs(tag: str, n: int = 4):
    return [Document(f"{tag}{i}", f"{tag} {i}. " + TEXT * 2) for i in range(n)]


@pytest.fixture(scope="module")
def tiny():
    from retrofit.models.io import load_model

    return load_model("tiny-gpt2")  # native 64, byte tokenizer


def converted(tiny, scheme, **options):
    model, tok = tiny
    model = copy.deepcopy(model)
    teacher = copy.deepcopy(model)
    retrofit.convert(model, scheme, **options)
    return model, teacher, tok


def run(model, teacher, tok, steps=4, **kw):
    kw = {"learning_rate": 5e-2, "budget": 128, "progress": False, **kw}
    return calibrate(model, teacher, docs("train"), tokenizer=tok, heldout=docs("held", 2), steps=steps, **kw)


@pytest.mark.parametrize("scheme,options", [("t5", {}), ("alibi", {"learn_slopes": True}), ("fire", {}), ("shaw", {})])
def test_only_position_parameters_change(tiny, scheme, options):
    model, teacher, tok = converted(tiny, scheme, **options)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    positions = {"retrofit_positions." + n for n, _ in position_parameters(model)}
    assert positions
    record = run(model, teacher, tok)
    after = dict(model.named_parameters())
    assert set(after) == set(before)
    for n, p in after.items():
        if n not in positions:
            assert torch.equal(p.detach(), before[n]), n  # bit-identical
    assert any(not torch.equal(after[n].detach(), before[n]) for n in positions)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags  # restored
    assert record["steps"] == 4 and len(record["kl"]) == 4
    assert set(record["parameters"]) == {n.split(".", 1)[1] for n in positions}
    for key in ("ratio_before", "ratio_after", "ppl_original", "ppl_before", "ppl_after"):
        assert record[key] > 0


def test_kl_to_the_original_decreases(tiny):
    model, teacher, tok = converted(tiny, "t5")
    with torch.no_grad():  # a random tiny model barely reads positions (KL ~0.008 whatever the table): start the
        # table off its init so there is something to recover (measured: 0.0096 -> 0.0081 in 30 steps)
        scheme_of(model).table.add_(3 * torch.randn_like(scheme_of(model).table))
    blocks = torch.tensor([list(TEXT.encode())[:64]])

    def kl():
        with torch.no_grad():
            return kl_to_original(model(input_ids=blocks).logits, teacher(input_ids=blocks).logits).item()

    start = kl()
    record = run(model, teacher, tok, steps=30, learning_rate=0.2)
    assert kl() < 0.9 * start
    assert record["kl_last10"] < record["kl_first10"] and record["ratio_after"] < record["ratio_before"]


def test_alibi_learn_slopes_round_trip_and_gradient(tiny, tmp_path):
    model, teacher, tok = converted(tiny, "alibi", learn_slopes=True)
    scheme = scheme_of(model)
    assert isinstance(scheme.slopes, torch.nn.Parameter)
    assert dict(scheme.named_parameters())["slopes"] is scheme.slopes
    x = torch.tensor([list(TEXT.encode())[:48]])
    for kernel in ("auto", "sdpa-alibi-dims", "chunked"):
        set_kernel(model, kernel)
        scheme.slopes.grad = None
        model(input_ids=x).logits.pow(2).mean().backward()
        ran = retrofit.describe(model)["last_kernel"]
        assert scheme.slopes.grad is not None and scheme.slopes.grad.abs().sum() > 0, ran
    assert {"sdpa-alibi-dims", "chunked"} <= set(retrofit.describe(model)["kernels"])
    with torch.no_grad():
        scheme.slopes.mul_(torch.linspace(0.5, 1.5, scheme.slopes.numel()))
    retrofit.save(model, tmp_path / "m", tokenizer=tok)
    loaded = retrofit.load(tmp_path / "m")
    assert retrofit.describe(loaded)["options"]["learn_slopes"] is True
    assert torch.equal(scheme_of(loaded).slopes.detach(), scheme.slopes.detach())
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=x).logits, model.eval()(input_ids=x).logits)


def test_alibi_fused_slope_gradient_matches_finite_differences():
    model = retrofit.convert(
        TINY["gpt2"](), "alibi", learn_slopes=True, kernel="sdpa-alibi-dims"
    ).double()  # slopes too
    slopes = scheme_of(model).slopes
    x = torch.randint(3, 100, (2, 40))

    def loss():
        return model(input_ids=x).logits.pow(2).mean()

    loss().backward()
    assert retrofit.describe(model)["last_kernel"] == "sdpa-alibi-dims"
    eps = 1e-6
    for h in range(slopes.numel()):
        with torch.no_grad():
            slopes[h] += eps
            up = loss()
            slopes[h] -= 2 * eps
            down = loss()
            slopes[h] += eps
        assert slopes.grad[h].item() == pytest.approx(((up - down) / (2 * eps)).item(), rel=1e-4, abs=1e-9)


def test_alibi_fixed_slopes_unchanged():
    model = retrofit.convert(TINY["gpt2"](), "alibi")
    scheme = scheme_of(model)
    assert list(scheme.parameters()) == [] and "slopes" in dict(scheme.named_buffers())
    assert "learn_slopes" not in retrofit.describe(model)["options"]
    assert "slopes" not in scheme.state_dict()  # non-persistent, as before


def test_alibi_learned_slopes_export_is_not_exact(tmp_path):
    from retrofit.foundation.errors import RetrofitError

    model = retrofit.convert(TINY["gpt2"](), "alibi", learn_slopes=True, scale_bias=True)
    with pytest.raises(RetrofitError, match="learned"):
        retrofit.export(model, tmp_path / "out")


@pytest.mark.parametrize("scheme,hint", [("nope", "NoPE"), ("rope", "RoPE"), ("alibi", "learn_slopes=true")])
def test_nothing_to_calibrate(tiny, scheme, hint):
    model, teacher, tok = converted(tiny, scheme)
    with pytest.raises(OptionError, match=f"nothing to calibrate.*{hint}"):
        run(model, teacher, tok)


def test_heldout_must_not_overlap(tiny):
    model, teacher, tok = converted(tiny, "t5")
    with pytest.raises(DataError, match="share"):
        calibrate(model, teacher, docs("train"), tokenizer=tok, heldout=docs("train", 1), steps=1, progress=False)


def _write(tmp_path):
    (tmp_path / "cal.txt").write_text(TEXT * 6)
    (tmp_path / "held.txt").write_text(TEXT.upper() * 3)
    return str(tmp_path / "cal.txt"), str(tmp_path / "held.txt")


def test_cli_convert_calibrate(tmp_path, monkeypatch, capsys):
    from retrofit.cli import main

    monkeypatch.setenv("RETROFIT_PROGRESS", "0")
    cal, held = _write(tmp_path)
    out = tmp_path / "out"
    rc = main(
        [
            "convert",
            "tiny-gpt2",
            "--to",
            "t5",
            "--out",
            str(out),
            "--calibrate",
            cal,
            "--calibrate-heldout",
            held,
            "--calibrate-steps",
            "3",
            "--calibrate-budget",
            "128",
        ]
    )
    assert rc == 0
    shown = json.loads(capsys.readouterr().out)
    record = json.loads((out / "calibrate.json").read_text())
    assert shown["calibration"]["ratio_after"] == record["ratio_after"] and record["steps"] == 3
    assert record["ratio_before"] > 0 and record["data"] == cal and record["heldout"] == held
    assert retrofit.describe(retrofit.load(out))["scheme"] == "t5"


def test_cli_nothing_to_calibrate_exits_2(tmp_path, capsys):
    from retrofit.cli import main

    cal, held = _write(tmp_path)
    rc = main(["convert", "tiny-gpt2", "--to", "nope", "--out", str(tmp_path / "o"), "--calibrate", cal])
    assert rc == 2 and "nothing to calibrate" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_recipe_calibrate_phase(tmp_path, monkeypatch):
    from retrofit.training import finetune

    monkeypatch.setenv("RETROFIT_PROGRESS", "0")
    cal, held = _write(tmp_path)
    recipe = {
        "model": {"name_or_path": "tiny-gpt2"},
        "convert": {
            "scheme": "alibi",
            "options": {"learn_slopes": True},
            "calibrate": {"data": cal, "heldout": held, "steps": 3, "budget": 128},
        },
        "data": {"files": cal, "block_length": 64, "validation_fraction": 0.0},
        "train": {"method": "full", "steps": 1, "warmup_steps": 0},
        "output_dir": str(tmp_path / "run"),
    }
    out = finetune(recipe)
    record = json.loads((out / "calibrate.json").read_text())
    assert record["steps"] == 3 and record["parameters"] == {"slopes": 4}


def test_recipe_calibrate_needs_a_scheme():
    from retrofit.foundation.errors import RecipeError
    from retrofit.training.recipe import Recipe

    with pytest.raises(RecipeError, match="convert.calibrate.data' needs 'convert.scheme"):
        Recipe.from_dict(
            {
                "model": {"name_or_path": "x"},
                "convert": {"calibrate": {"data": "stdlib"}},
                "data": {"dataset": "stdlib"},
                "output_dir": "o",
            }
        )
