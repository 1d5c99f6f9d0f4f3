"""convert / revert / describe / save / load behaviour, bad input, isolation, the kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers as tf

import retrofit
from retrofit import kernels
from retrofit.foundation.errors import (
    AlreadyConvertedError,
    LengthError,
    NotConvertedError,
    OptionError,
    PatchNotLiveError,
    RetrofitError,
    UnknownSchemeError,
    UnsupportedArchitectureError,
)
from retrofit.kernels import Call, call, cpu_flash, flex

from ..tiny import NATIVE, TINY, ids


def logits(model, x, **kw):
    with torch.no_grad():
        return model(x, **kw).logits


# ---------------------------------------------------------------- bad input ----------------
def test_unknown_scheme_names_the_registered_ones():
    with pytest.raises(UnknownSchemeError, match="registered: .*alibi.*rope"):
        retrofit.convert(TINY["gpt2"](), "alibbi")


def test_unsupported_architecture_names_the_supported_ones():
    model = tf.XGLMForCausalLM(tf.XGLMConfig(vocab_size=64, d_model=32, num_layers=1, attention_heads=4, ffn_dim=64))
    with pytest.raises(UnsupportedArchitectureError, match="supported: .*gpt2.*llama"):
        retrofit.convert(model, "alibi")


def test_unknown_option_lists_valid_options():
    with pytest.raises(OptionError, match="no option 'thetaa'.*theta"):
        retrofit.convert(TINY["gpt2"](), "rope", thetaa=1.0)


@pytest.mark.parametrize(
    "options,match",
    [
        ({"theta": "big"}, "must be float"),
        ({"scaling": "cubic"}, "must be one of"),
        ({"factor": True}, "must be float"),
        ({"scaling": "yarn", "factor": 0.5}, "factor must be >= 1"),
        ({"factor": 2.0}, "needs a scaling"),
        ({"fraction": 1.5}, r"\(0, 1\]"),
    ],
)
def test_wrong_option_values(options, match):
    model = TINY["llama"]()
    with pytest.raises(OptionError, match=match):
        retrofit.convert(model, "rope", **options)
    assert not retrofit.describe(model)["converted"]  # nothing half-done


def test_double_conversion_is_an_error_and_force_reconverts():
    model = TINY["gpt2"]()
    retrofit.convert(model, "alibi")
    with pytest.raises(AlreadyConvertedError, match="revert"):
        retrofit.convert(model, "rope")
    retrofit.convert(model, "rope", force=True)
    assert retrofit.describe(model)["scheme"] == "rope"
    retrofit.revert(model)
    retrofit.convert(model, "alibi")  # after a revert, a plain convert works again
    with pytest.raises(NotConvertedError):
        retrofit.revert(retrofit.revert(model))


def test_plain_from_pretrained_of_a_retrofit_checkpoint_gives_the_converted_model(tmp_path):
    model = retrofit.convert(TINY["gpt2"](), "alibi").eval()
    x = ids(1, 4 * NATIVE)
    retrofit.save(model, tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "retrofit"
    plain = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert retrofit.describe(plain)["scheme"] == "alibi"
    assert torch.equal(logits(plain, x), logits(model, x))
    assert type(tf.AutoConfig.from_pretrained(tmp_path / "m")).__name__ == "RetrofitConfig"
    with pytest.raises(AlreadyConvertedError):
        retrofit.convert(plain, "alibi")


def test_plain_save_pretrained_of_a_converted_model_is_marked_too(tmp_path):
    model = retrofit.convert(TINY["gpt2"](), "alibi")
    model.save_pretrained(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "retrofit"
    assert retrofit.describe(tf.AutoModelForCausalLM.from_pretrained(tmp_path / "m"))["scheme"] == "alibi"
    retrofit.revert(model)
    model.save_pretrained(tmp_path / "r")
    assert json.loads((tmp_path / "r" / "config.json").read_text())["model_type"] == "gpt2"


@pytest.mark.slow
def test_without_retrofit_transformers_refuses_a_checkpoint_instead_of_loading_the_original(tmp_path):
    retrofit.save(retrofit.convert(TINY["gpt2"](), "alibi"), tmp_path / "m")
    code = "import transformers as tf; tf.AutoModelForCausalLM.from_pretrained(%r)" % str(tmp_path / "m")
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert r.returncode != 0 and "model type `retrofit`" in r.stderr


def test_converted_config_advertises_its_reach_and_revert_restores_the_table_size():
    model = TINY["gpt2"]()
    retrofit.convert(model, "alibi")
    assert model.config.n_positions == retrofit.patch.conversion.UNBOUNDED  # lm-eval, generate() read this
    retrofit.revert(model)
    assert model.config.n_positions == NATIVE


def test_peft_wrapped_model_is_refused():
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(TINY["gpt2"](), LoraConfig(r=2, target_modules=["c_attn"]))
    with pytest.raises(RetrofitError, match="before wrapping"):
        retrofit.convert(peft_model, "alibi")


def test_unconverted_model_past_its_table_is_an_index_error_but_converted_runs():
    model = TINY["gpt2"]()
    assert retrofit.describe(model)["max_length"] == NATIVE
    retrofit.convert(model, "alibi")
    assert retrofit.describe(model)["max_length"] is None
    assert logits(model, ids(1, 8 * NATIVE)).shape[1] == 8 * NATIVE


def test_native_fade_past_the_table_is_a_length_error():
    model = retrofit.convert(TINY["gpt2"](), "alibi")
    retrofit.set_position_controls(model, native_fade=0.5)
    assert retrofit.describe(model)["max_length"] == NATIVE
    with pytest.raises(LengthError, match="native position table"):
        logits(model, ids(1, 2 * NATIVE))
    with pytest.raises(OptionError):
        retrofit.set_position_controls(model, native_fade=2.0)
    with pytest.raises(OptionError):
        retrofit.set_position_controls(model, offset=-1)


def test_a_patch_that_does_not_run_is_refused_and_rolled_back():
    """If transformers stopped dispatching through the attention interface, convert must raise."""
    model = TINY["gpt2"]()
    x = ids(1, 10)
    before = logits(model, x)
    attn = model.transformer.h[1].attn
    stock = attn.forward

    def bypass(hidden_states, *a, **kw):  # an attention that never calls the interface
        kw.pop("attention_mask", None)
        model.config._attn_implementation = "sdpa"
        try:
            return stock(hidden_states, *a, **kw)
        finally:
            model.config._attn_implementation = "retrofit"

    attn.forward = bypass
    with pytest.raises(PatchNotLiveError, match=r"layers \[1\]"):
        retrofit.convert(model, "alibi")
    del attn.forward
    assert torch.equal(logits(model, x), before)
    assert not retrofit.describe(model)["converted"]


def test_attention_function_on_an_unconverted_module_is_an_error():
    model = TINY["gpt2"]()
    model.config._attn_implementation = "retrofit"
    with pytest.raises(PatchNotLiveError, match="not converted"):
        logits(model, ids(1, 5))


def test_cli_bad_input_exit_codes(tmp_path, capsys):
    from retrofit.cli import main

    def run(*a):
        rc = main(list(a))
        out = capsys.readouterr()
        return rc, out.out, out.err

    rc, _, err = run("convert", "gpt2", "--to", "nope-not-a-scheme", "--out", str(tmp_path / "o"))
    assert rc == 2 and "unknown scheme" in err
    TINY["gpt2"]().save_pretrained(tmp_path / "tiny")
    rc, _, err = run(
        "convert", str(tmp_path / "tiny"), "--to", "rope", "--option", "bogus=1", "--out", str(tmp_path / "o")
    )
    assert rc == 2 and "no option 'bogus'" in err
    assert not (tmp_path / "o").exists()
    rc, out, err = run(
        "convert",
        str(tmp_path / "tiny"),
        "--to",
        "rope",
        "--option",
        "scaling=yarn",
        "--option",
        "factor=4",
        "--out",
        str(tmp_path / "o"),
    )
    assert rc == 0, err
    info = json.loads(out)
    assert info["scheme"] == "rope" and info["options"]["factor"] == 4.0
    assert retrofit.describe(retrofit.load(tmp_path / "o"))["options"]["scaling"] == "yarn"
    rc, _, err = run("convert", str(tmp_path / "tiny"), "--to", "alibi", "--out", str(tmp_path / "o"))
    assert rc == 2 and "--overwrite" in err
    rc, out, _ = run("describe", str(tmp_path / "o"))
    assert rc == 0 and json.loads(out)["scheme"] == "rope"


@pytest.mark.slow
def test_cli_help_and_exit_code_as_a_process():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "retrofit", "convert", "--help"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "--to SCHEME" in r.stdout and "alibi" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "retrofit", "convert", "x", "--to", "zzz", "--out", "y"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 2 and "unknown scheme 'zzz'" in r.stderr


# ---------------------------------------------------------------- isolation ----------------
def test_two_models_converted_differently_stay_correct():
    x = ids(1, 20)
    a, b, c = TINY["gpt2"](), TINY["gpt2"](), TINY["gpt2"]()
    b.load_state_dict(a.state_dict())
    c.load_state_dict(a.state_dict())
    plain = logits(c, x)
    retrofit.convert(a, "alibi")
    alibi_alone = logits(a, x)
    retrofit.convert(b, "rope")
    assert torch.equal(logits(a, x), alibi_alone)  # b's conversion did not touch a
    assert not torch.allclose(logits(b, x), alibi_alone)
    assert torch.equal(logits(c, x), plain)  # the unconverted model is untouched
    assert type(a.transformer.h[0].attn) is type(c.transformer.h[0].attn)  # no class was modified


def test_deepcopy_of_a_converted_model_is_independent():
    import copy

    a = retrofit.convert(TINY["gpt2"](), "alibi")
    b = copy.deepcopy(a)
    retrofit.revert(a)
    x = ids(1, 12)
    assert retrofit.describe(b)["converted"] and not retrofit.describe(a)["converted"]
    assert not torch.allclose(logits(a, x), logits(b, x))


def test_describe_and_saved_config_block(tmp_path):
    model = TINY["llama"]()
    d = retrofit.describe(model)
    assert d == {**d, "converted": False, "architecture": "llama", "native": {"kind": "rope", "length": NATIVE}}
    retrofit.convert(model, "alibi")
    retrofit.save(model, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["retrofit"]["scheme"] == "alibi" and cfg["retrofit"]["retrofit_version"] == retrofit.__version__
    assert not list(tmp_path.glob(".m.tmp-*"))  # atomic: no temp folder left
    assert "_attn_implementation" not in cfg or cfg["_attn_implementation"] is None


def test_save_is_atomic_when_interrupted(tmp_path, monkeypatch):
    model = retrofit.convert(TINY["gpt2"](), "alibi")
    retrofit.save(model, tmp_path / "m")
    good = (tmp_path / "m" / "model.safetensors").read_bytes()

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(model), "save_pretrained", boom)
    with pytest.raises(KeyboardInterrupt):
        retrofit.save(model, tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_position_offset_shifts_rotary_positions_only_numerically():
    model = retrofit.convert(TINY["gpt2"](), "rope")
    x = ids(1, 20)
    base = logits(model, x)
    retrofit.set_position_controls(model, offset=100)
    shifted = logits(model, x)
    torch.testing.assert_close(shifted, base, atol=1e-4, rtol=1e-3)  # rotary is relative
    retrofit.set_position_controls(model)


def test_native_fade_interpolates_to_the_original():
    model = TINY["gpt2"]()
    x = ids(1, 20)
    original = logits(model, x)
    retrofit.convert(model, "nope" if "nope" in retrofit.schemes() else "rope", verify=True)
    retrofit.set_position_controls(model, native_fade=1.0)
    faded = logits(model, x)
    retrofit.set_position_controls(model, native_fade=0.0)
    assert not torch.allclose(faded, logits(model, x))
    if retrofit.describe(model)["scheme"] == "nope":
        torch.testing.assert_close(faded, original, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- kernel -------------------
def _alibi_bias(H):
    from retrofit.scheme.alibi import alibi_slopes

    slopes = torch.tensor(alibi_slopes(H))
    return lambda h, i, j: -slopes[h] * (i - j).float()


def _naive(q, k, v, scaling, bias, pad=None, window=None, q_start=0):
    Tq, Tk = q.shape[-2], k.shape[-2]
    i = torch.arange(q_start, q_start + Tq)[:, None]
    j = torch.arange(Tk)[None]
    s = q @ k.transpose(-1, -2) * scaling
    if bias is not None:
        s = s + bias(torch.arange(q.shape[1])[:, None, None], i[None], j[None])
    ok = (j <= i) & ((i - j < window) if window else True)
    if pad is not None:
        ok = (ok & pad[:, None, None, :]) | (i == j)
    return s.masked_fill(~ok, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("q_start", [0, 5])
def test_chunked_kernel_matches_naive_across_chunk_boundaries(monkeypatch, window, q_start):
    monkeypatch.setattr(call, "CHUNK_ELEMENTS", 4 * 16 * 3)  # force many tiny chunks
    B, H, Tq, D = 2, 4, 40, 8
    Tk = Tq + q_start
    q, k, v = torch.randn(B, H, Tq, D), torch.randn(B, H, Tk, D), torch.randn(B, H, Tk, D)
    pad = torch.ones(B, Tk, dtype=torch.bool)
    pad[0, :6] = False
    bias = _alibi_bias(H)
    out, kernel = kernels.attend(
        Call(q, k, v, scaling=D**-0.5, bias=bias, key_padding=pad, window=window, q_start=q_start), "chunked"
    )
    assert kernel == "chunked"
    torch.testing.assert_close(out, _naive(q, k, v, D**-0.5, bias, pad, window, q_start), atol=1e-5, rtol=1e-5)


def test_chunked_kernel_gradients_with_checkpointing_match_naive(monkeypatch):
    monkeypatch.setattr(call, "CHUNK_ELEMENTS", 4 * 16 * 3)
    B, H, T, D = 1, 4, 33, 8
    leaves = [torch.randn(B, H, T, D, requires_grad=True) for _ in range(3)]
    bias = _alibi_bias(H)
    out, _ = kernels.attend(Call(*leaves, scaling=0.3, bias=bias), "chunked")
    grads = torch.autograd.grad(out.square().sum(), leaves)
    ref = _naive(*leaves, 0.3, bias)
    ref_grads = torch.autograd.grad(ref.square().sum(), leaves)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)


def test_chunk_memory_is_bounded_at_long_lengths():
    """The per-chunk score tensor never exceeds CHUNK_ELEMENTS: linear memory in N."""
    for T in [1024, 8192, 65536]:
        rows = call.chunk_rows(12, T, T)
        assert 12 * rows * T <= max(call.CHUNK_ELEMENTS, 12 * 16 * T)


def test_half_precision_bias_is_scored_in_fp32():
    B, H, T, D = 1, 2, 300, 8
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    bias = _alibi_bias(H)
    ref = _naive(q, k, v, D**-0.5, bias)
    out, _ = kernels.attend(Call(q.bfloat16(), k.bfloat16(), v.bfloat16(), scaling=D**-0.5, bias=bias), "chunked")
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() < 0.05  # bf16 inputs/outputs, fp32 scores


def test_a_failing_flex_compile_is_reported_and_falls_back(monkeypatch, caplog):
    monkeypatch.setattr(flex, "_fn", None)
    monkeypatch.setattr(flex, "_error", None)
    monkeypatch.setattr(flex, "_failed", False)
    monkeypatch.setattr(flex, "compiled", lambda: object())

    def broken(*a, **k):
        raise RuntimeError("inductor: simulated compile failure")

    monkeypatch.setattr(flex, "attend_flex", broken)
    monkeypatch.setattr(cpu_flash, "available", lambda q: False)  # no CPU flash op: auto tries flex
    q, k, v = (torch.randn(1, 2, 200, 8) for _ in range(3))
    bias = _alibi_bias(2)
    with torch.no_grad():
        out, kernel = kernels.attend(Call(q, k, v, scaling=0.3, bias=bias), "auto")
        ref, _ = kernels.attend(Call(q, k, v, scaling=0.3, bias=bias), "chunked")
        with pytest.raises(RuntimeError, match="simulated"):
            kernels.attend(Call(q, k, v, scaling=0.3, bias=bias), "flex")  # explicit: never substituted
    assert kernel == "chunked (flex failed)" and torch.equal(out, ref)
    assert "simulated compile failure" in caplog.text


def test_auto_path_on_cpu_and_the_kernel_survives_save_load(tmp_path):
    q = torch.randn(1, 2, 200, 8, requires_grad=True)
    bias = _alibi_bias(2)
    assert kernels.choose(Call(q, q, q, 0.3, bias=bias)).name == "cpu-flash-mask"  # CPU: flash op with a mask
    assert kernels.choose(Call(q, q, q, 0.3, bias=bias, dropout=0.1)).name == "chunked"
    with torch.no_grad():
        assert kernels.choose(Call(q.detach(), q, q, 0.3, bias=bias, window=50)).name == "cpu-flash-mask"
    model = retrofit.convert(TINY["gpt2"](), "alibi", kernel="chunked")
    retrofit.save(model, tmp_path / "m")
    assert retrofit.describe(retrofit.load(tmp_path / "m"))["kernel"] == "chunked"
    with pytest.raises(RuntimeError, match="no backward"):
        kernels.choose(Call(q, q, q, 0.3, bias=bias), "flex")


def test_convert_leaves_the_callers_config_alone_and_revert_stays_exact():
    cfg = tf.GPT2Config(
        vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=NATIVE, bos_token_id=1, eos_token_id=2
    )
    model = tf.GPT2LMHeadModel(cfg).eval()
    before_cfg = cfg.to_dict()
    x = ids(1, 20)
    with torch.no_grad():
        before = model(x).logits
    retrofit.convert(model, "alibi")
    assert model.config.n_positions == retrofit.patch.conversion.UNBOUNDED
    assert cfg.to_dict() == before_cfg and cfg.n_positions == NATIVE and not getattr(cfg, "retrofit", None)
    tf.GPT2LMHeadModel(cfg)  # a second model from the caller's config still builds
    retrofit.revert(model)
    with torch.no_grad():
        assert torch.equal(model(x).logits, before)
    assert model.config.n_positions == NATIVE


@pytest.mark.parametrize("scheme", ["t5", "shaw", "fire"])
def test_auto_never_picks_a_kernel_that_refuses_float64(scheme, monkeypatch, user_kernel):
    """CPU flex refuses float64: kernel auto must not try it (and lose a compile) before falling back."""

    def no_flex():
        raise AssertionError("auto tried flex for float64 on CPU")

    monkeypatch.setattr(flex, "compiled", no_flex)
    model = retrofit.convert(TINY["gpt2"]().double(), scheme)
    with torch.no_grad():
        model(ids(1, 2 * NATIVE + 200))  # long enough for auto to consider flex
    ran = set(retrofit.patch.conversion._state(model).kernels)
    assert ran == {"chunked"}, ran
    with pytest.raises(RuntimeError, match="float64"):
        q = torch.zeros(1, 1, 200, 8, dtype=torch.float64)
        kernels.choose(Call(q, q, q, 0.3, bias=_alibi_bias(1)), "flex")


def test_fire_reads_one_row_of_position_ids_across_a_padded_batch():
    """(1, T) position ids with a (B, T) padding mask: every row at those positions (a padded row's real
    tokens too: they sit at the positions the caller gave them)."""
    model = retrofit.convert(TINY["gpt2"](), "fire")
    x = ids(2, NATIVE + 8)
    mask = torch.ones_like(x)
    mask[1, :5] = 0
    T = x.shape[1]
    with torch.no_grad():
        out = model(x, attention_mask=mask, position_ids=torch.arange(T)[None]).logits
        alone = model(x[1:, 5:], position_ids=torch.arange(5, T)[None]).logits
        first = model(x[:1]).logits
    torch.testing.assert_close(out[1:, 5:], alone, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out[:1], first, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("model_type", ["opt", "gpt_neo"])
def test_native_fade_under_left_padding_reads_the_original_positions(model_type):
    """While a fine-tune fades the table out, the faded table is read at the positions the original would
    use: a left-padded row (mask only, as OPT counts real tokens) equals the row alone; at fade 1 with NoPE it
    is the original model, padded the same way (the adapter's own padding rule, e.g. OPT's cumsum of the mask)."""
    model = TINY[model_type]()
    x = ids(1, 20)
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), x], 1)
    mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones_like(x)], 1)
    with torch.no_grad():
        original = model(padded, attention_mask=mask).logits[:, 5:]
    retrofit.convert(model, "nope")
    retrofit.set_position_controls(model, native_fade=1.0)
    with torch.no_grad():
        faded = model(padded, attention_mask=mask).logits[:, 5:]
    torch.testing.assert_close(faded, original, atol=1e-5, rtol=1e-5)


def test_a_config_with_an_infinite_float_saves_and_loads(tmp_path):
    """transformers writes inf as {"__float__": "Infinity"} (falcon_h1's time_step_limit): retrofit.load reads
    the base config as transformers does."""
    model = TINY["llama"]()
    model.config.time_step_limit = (0.0, float("inf"))
    retrofit.convert(model, "alibi")
    retrofit.save(model, tmp_path / "m")
    assert retrofit.load(tmp_path / "m").config.time_step_limit[1] == float("inf")
