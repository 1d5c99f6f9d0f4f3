"""The stretched learned table (``extend``): its rows against hand-built ones, the converted model against
transformers' own model with a bigger table, its finite reach, learnable rows, export, PoSE, the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers as tf

import retrofit
from retrofit.foundation.errors import LengthError, OptionError
from retrofit.scheme.extend import copied_rows, interpolated_rows

from ..tiny import NATIVE, TINY, ids

ROOT = Path(__file__).resolve().parents[2]
TABLES = {
    "gpt2": ("transformer.wpe", "n_positions"),
    "gpt_neo": ("transformer.wpe", "max_position_embeddings"),
    "opt": ("model.decoder.embed_positions", "max_position_embeddings"),
}


def test_copied_rows_by_hand():
    table = torch.randn(NATIVE, 8)
    for copy_from in (0, 1, 5):
        rows = copied_rows(table, 3 * NATIVE + 7, copy_from)
        cycle = list(range(copy_from, NATIVE))
        for p in range(rows.shape[0]):
            want = p if p < NATIVE else cycle[(p - NATIVE) % len(cycle)]
            assert torch.equal(rows[p], table[want]), (copy_from, p)


def test_interpolated_rows_by_hand():
    table = torch.randn(NATIVE, 8, dtype=torch.float64)
    length = 100
    rows = interpolated_rows(table, length)
    for p in range(length):
        x = p * NATIVE / length
        lo = int(x)
        hi = min(lo + 1, NATIVE - 1)
        want = (1 - (x - lo)) * table[lo] + (x - lo) * table[hi]
        torch.testing.assert_close(rows[p], want, atol=1e-12, rtol=0)
    assert torch.equal(rows[0], table[0])


@pytest.mark.parametrize("model_type", sorted(TABLES))
@pytest.mark.parametrize("init", ["copy", "interpolate"])
def test_equals_transformers_model_with_a_bigger_table(model_type, init):
    """The converted model == the family's own transformers class built with ``length`` positions whose table
    holds the stretched rows (OPT: row p + 2 holds position p)."""
    length = 3 * NATIVE
    model = TINY[model_type]()
    table_name, size_attr = TABLES[model_type]
    native_rows = model.get_submodule(table_name).weight.detach().clone()
    first = native_rows.shape[0] - NATIVE
    cfg = model.config.to_dict()
    retrofit.convert(model, "extend", length=length, init=init)
    cfg[size_attr] = length
    big = type(model)(type(model.config).from_dict(cfg)).eval()
    sd = {k: v for k, v in model.state_dict().items() if not k.startswith("retrofit_positions")}
    sd[table_name + ".weight"] = big.get_submodule(table_name).weight.detach().clone()
    table, p = native_rows[first:], torch.arange(length)
    if init == "copy":  # rows p < native as they are, later ones cycle rows 1 .. native - 1
        stretched = table[torch.where(p < NATIVE, p, 1 + (p - NATIVE) % (NATIVE - 1))]
    else:  # the table read at p * native / length, linear between neighbours
        x = p.double() * NATIVE / length
        lo = x.floor().long()
        stretched = torch.lerp(table[lo].double(), table[(lo + 1).clamp(max=NATIVE - 1)].double(), (x - lo)[:, None])
    sd[table_name + ".weight"][first:] = stretched.float()
    big.load_state_dict(sd)
    x = ids(2, length, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, big(x).logits, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("model_type", sorted(TABLES))
def test_copy_is_exact_up_to_native_and_reach_is_finite(model_type):
    model = TINY[model_type]()
    x = ids(2, NATIVE)
    with torch.no_grad():
        before = model(x).logits
        retrofit.convert(model, "extend", length="4x")
        torch.testing.assert_close(model(x).logits, before, atol=1e-6, rtol=0)
        assert model(ids(1, 4 * NATIVE)).logits.shape[1] == 4 * NATIVE
        with pytest.raises(LengthError, match=f"{4 * NATIVE} positions"):
            model(ids(1, 4 * NATIVE + 1))
    assert retrofit.describe(model)["max_length"] == 4 * NATIVE == model.config.max_position_embeddings


def test_rows_learn_save_reload_and_peft_sees_them(tmp_path):
    model = retrofit.convert(TINY["gpt2"](), "extend", length=2 * NATIVE)
    table = model.retrofit_positions.table
    assert table.requires_grad and table.shape == (2 * NATIVE, 64)
    x = ids(1, 2 * NATIVE)
    model(x, labels=x).loss.backward()
    assert table.grad is not None and table.grad[NATIVE:].abs().sum() > 0  # rows past native train
    with torch.no_grad():
        table.add_(0.01 * torch.randn_like(table))
        before = model(x).logits
    retrofit.save(model, tmp_path / "m")
    loaded = retrofit.load(tmp_path / "m")
    assert torch.equal(loaded.retrofit_positions.table, table)
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, before)
    from retrofit.training.model import make_trainable
    from retrofit.training.recipe import TrainConfig

    wrapped = make_trainable(retrofit.load(tmp_path / "m"), TrainConfig(method="lora"))
    trained = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert any("retrofit_positions" in n and n.endswith("table") for n in trained), trained


def test_bad_options_and_rotary_models_are_clear_errors():
    with pytest.raises(OptionError, match="learned absolute"):
        retrofit.convert(TINY["llama"](), "extend")
    with pytest.raises(OptionError, match="shorter"):
        retrofit.convert(TINY["gpt2"](), "extend", length=NATIVE // 2)
    with pytest.raises(OptionError, match="16x"):
        retrofit.convert(TINY["gpt2"](), "extend", length="sixteen")


def test_native_export_is_the_same_architecture_with_the_bigger_table(tmp_path):
    model = retrofit.convert(TINY["opt"](), "extend", length="4x", init="interpolate")
    result = retrofit.export(model, tmp_path / "out", native=True)
    assert result["exact"] and result["target"] == "OPTForCausalLM"
    plain = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert plain.config.max_position_embeddings == 4 * NATIVE
    x = ids(1, 4 * NATIVE, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(plain(x).logits, model(x).logits, atol=1e-4, rtol=0)
    with pytest.raises(OptionError, match="past what the converted model reads"):
        retrofit.export(model, tmp_path / "o2", native=True, max_length=8 * NATIVE)


def test_pose_positions_inside_the_new_table():
    model, ref_model = TINY["gpt2"](), TINY["gpt2"]()
    ref_model.load_state_dict(model.state_dict())
    retrofit.convert(model, "extend", length="4x")
    x = ids(1, NATIVE)
    positions = torch.sort(torch.randperm(4 * NATIVE)[:NATIVE]).values
    retrofit.patch.conversion.set_position_controls(model, positions=positions)
    with torch.no_grad():
        out = model(x).logits
    retrofit.patch.conversion.set_position_controls(model)
    # the reference: the rows at those positions added by hand, through the unconverted model's embeddings
    rows = model.retrofit_positions.table[positions]
    with torch.no_grad():
        embeds = ref_model.transformer.wte(x) + rows[None]
        ref_model.transformer.wpe.weight.zero_()
        ref = ref_model(inputs_embeds=embeds).logits
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.slow
def test_cli_convert_with_a_multiple(tmp_path, user_env, in_process):
    r = in_process(
        ["retrofit", "convert", "tiny-gpt2", "--to", "extend", "--option", "length=16x", "--out", str(tmp_path / "ck")],
        tmp_path,
        user_env,
    )
    assert r.returncode == 0, r.stderr
    loaded = retrofit.load(tmp_path / "ck")
    info = retrofit.describe(loaded)
    assert info["scheme"] == "extend" and info["max_length"] == 16 * info["native"]["length"]
