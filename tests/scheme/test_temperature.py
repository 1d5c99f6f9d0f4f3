"""The length-aware softmax temperature, an option of every scheme: the paper-style formula against a
plain computation, padding-aware positions, save/load, the CLI, recipes going on, and the native export's refusal."""

from __future__ import annotations

import json
import math

import pytest
import torch

import retrofit
from retrofit.cli import main
from retrofit.foundation.errors import OptionError, RetrofitError
from retrofit.native_export import export

from ..tiny import NATIVE, TINY, ids


def test_the_multiplier_is_one_up_to_the_length_then_grows_with_its_log():
    model = retrofit.convert(TINY["gpt2"](), "nope", temperature=0.3, temperature_length=16)
    tau = model.retrofit_positions.temperature(torch.tensor([0, 15, 31, 63, 1023]))
    expected = [1.0, 1.0, 1 + 0.3 * math.log(2), 1 + 0.3 * math.log(4), 1 + 0.3 * math.log(64)]
    torch.testing.assert_close(tau, torch.tensor(expected))
    plain = retrofit.convert(TINY["gpt2"](), "nope")
    assert plain.retrofit_positions.temperature(torch.tensor([5000])) is None  # off by default
    assert "temperature" not in retrofit.describe(plain)["options"]  # saved only when set


def test_nope_with_temperature_equals_plain_attention_with_scaled_logits():
    """Written out by hand: softmax(tau_i * q.k / sqrt(d)) for the first layer of a GPT-2 with NoPE."""
    model = retrofit.convert(TINY["gpt2"]().eval(), "nope", temperature=0.5, temperature_length=4)
    attn = model.transformer.h[0].attn
    x = torch.randn(1, 20, model.config.n_embd)
    with torch.no_grad():
        out = attn(x)[0]
        q, k, v = attn.c_attn(x).split(model.config.n_embd, dim=2)
        H = model.config.n_head
        q, k, v = (t.view(1, 20, H, -1).transpose(1, 2) for t in (q, k, v))
        i = torch.arange(20)
        tau = 1 + 0.5 * torch.log(torch.clamp((i + 1) / 4, min=1.0))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) * tau[:, None]
        s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
        ref = attn.c_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(1, 20, -1))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("scheme", ["alibi", "t5", "rope"])
def test_left_padding_does_not_move_the_temperature(scheme):
    model = retrofit.convert(TINY["gpt2"]().eval(), scheme, temperature=0.5, temperature_length=4)
    x = ids(1, 12)
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), x], 1)
    mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones_like(x)], 1)
    with torch.no_grad():
        plain = model(x).logits
        pad = model(padded, attention_mask=mask).logits[:, 5:]
    tol = 1e-4 if scheme == "rope" else 2e-5  # rope's slots shift with the padding (same relative geometry)
    torch.testing.assert_close(pad, plain, atol=tol, rtol=1e-3)


def test_temperature_survives_save_load_and_the_export_says_it_cannot(tmp_path):
    model = retrofit.convert(TINY["gpt2"]().eval(), "alibi", scale_bias=True, temperature=0.2)
    x = ids(1, 100)
    with torch.no_grad():
        before = model(x).logits
    retrofit.save(model, tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())["retrofit"]["options"]
    assert saved["temperature"] == 0.2 and saved["temperature_length"] == NATIVE
    loaded = retrofit.load(tmp_path / "m")
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, before)
    with pytest.raises(RetrofitError, match="no native architecture expresses the length-aware temperature"):
        export(loaded, tmp_path / "native", native=True)
    assert not (tmp_path / "native").exists()


def test_bad_temperature_options_are_clear_errors():
    with pytest.raises(OptionError, match="'temperature' must be >= 0"):
        retrofit.convert(TINY["gpt2"](), "alibi", temperature=-1.0)
    with pytest.raises(OptionError, match="must be float"):
        retrofit.convert(TINY["gpt2"](), "alibi", temperature="big")
    with pytest.raises(OptionError, match="for every scheme: temperature"):
        retrofit.convert(TINY["gpt2"](), "alibi", temprature=0.1)


def test_cli_takes_the_temperature_and_lists_it(tmp_path, capsys):
    TINY["gpt2"]().save_pretrained(tmp_path / "tiny")
    rc = main(
        [
            "convert",
            str(tmp_path / "tiny"),
            "--to",
            "nope",
            "--option",
            "temperature=0.25",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 0
    assert retrofit.describe(retrofit.load(tmp_path / "o"))["options"]["temperature"] == 0.25
    with pytest.raises(SystemExit):
        main(["convert", "--help", "--to", "nope"])
    assert "every scheme also takes" in capsys.readouterr().out


def test_qk_norm_gains_start_at_the_measured_rms_of_q_and_k():
    """Calibration: layer 0's gains equal the RMS of its q and k per head on the calibration tokens, in the
    converted model (NoPE: no position table), computed here by hand from GPT-2's c_attn (so the norm
    starts close to the scores it replaces)."""
    base = TINY["gpt2"]().eval()
    n = min(256, NATIVE)
    tokens = ((torch.arange(n) * 7919 + 11) % base.config.vocab_size)[None]
    with torch.no_grad():
        hidden = base.transformer.h[0].ln_1(base.transformer.wte(tokens))
        q, k, _ = base.transformer.h[0].attn.c_attn(hidden).split(base.config.n_embd, dim=2)
    H = base.config.n_head
    rms = [t.view(1, n, H, -1).pow(2).mean(dim=(0, 1, 3)).sqrt() for t in (q, k)]
    model = retrofit.convert(base, "nope", qk_norm=True)
    scheme = model.retrofit_positions
    torch.testing.assert_close(scheme.q_gain[0, :, 0], rms[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(scheme.k_gain[0, :, 0], rms[1], atol=1e-5, rtol=1e-4)
    assert scheme.q_gain.requires_grad and retrofit.describe(model)["options"] == {"qk_norm": True}


@pytest.mark.slow
def test_the_tiny_drope_recipe_runs_and_its_final_model_keeps_both_options(tmp_path):
    from pathlib import Path

    from retrofit.training import finetune

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "tiny-drope.yaml"
    out = finetune(str(recipe), [f"output_dir={tmp_path / 'run'}", "train.steps=2"])
    final = retrofit.load(out / "final")
    options = retrofit.describe(final)["options"]
    assert options["qk_norm"] is True and options["temperature"] == 0.2
    assert not torch.equal(final.retrofit_positions.q_gain, torch.ones_like(final.retrofit_positions.q_gain))
