"""The full battery (every scheme x every check) on one representative per distinct quirk, the kernel cases on
one family per native kind, and a quick check on every registered model type (a meta-test fails on a gap).

A model type that shares its adapter and quirks with a representative costs only its quick check: adding
one is a tiny factory in tests/tiny.py and a line in ``QUIRKS`` below (a few seconds of suite time)."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
import transformers

import retrofit
from retrofit.adapters import ADAPTERS
from retrofit.adapters.base import adapter_class
from retrofit.patch.conversion import _set_attn

from .. import reference  # noqa: F401  (registers "retrofit_reference")
from ..tiny import MATRIX_OPTIONS, NATIVE, ONLY_LEARNED_ABSOLUTE, TINY, UNAVAILABLE, _llama_like, ids

# the full battery: one model per adapter and per quirk the adapters handle differently
REPRESENTATIVES = {
    "bloom": "native ALiBi (no table), fused per-head qkv, attention without dispatch (a stand-in module)",
    "bert": "learned absolute table inside the embeddings beside token types; the direction read from each module",
    "mpt": "native ALiBi built for max_seq_len keys through a stand-in attention, a mask tensor its model needs",
    "falcon": "rotary applied by a stand-in attention (no dispatch), fused qkv split by Falcon's own multi-query layout",
    "gpt2": "learned absolute table, Conv1D projections",
    "gpt_bigcode": "learned absolute table, Linear projections, multi-query attention (one key/value head)",
    "gpt_neo": "learned absolute, local (windowed) layers beside global ones, unscaled attention",
    "opt": "learned absolute with OPT's offset of 2",
    "gpt_neox": "partial rotary (rotary_pct), fused qkv",
    "gptj": "interleaved partial rotary read from a (sin, cos) table the original cannot run past",
    "llama": "rotary on the attention interface, grouped-query heads",
    "mistral": "rotary with a sliding window shorter than the input",
}
# every other registered type: what it shares with a representative (the quick check runs it)
QUIRKS = {
    "codegen": "gptj + one fused qkv projection in four model-parallel groups",
    "qwen2": "llama + qkv biases",
    "qwen3": "llama + q/k norms, explicit head_dim",
    "granite": "llama + attention/residual/logit multipliers",
    "olmo": "llama + qkv clipping",
    "olmo2": "llama + q/k norms over all heads",
    "starcoder2": "mistral + biases, plain MLP",
}
for _m in UNAVAILABLE:  # a layout the installed transformers does not have (tests/tiny.py)
    REPRESENTATIVES.pop(_m, None)
    QUIRKS.pop(_m, None)
# the battery past the liveness and reference check: `pytest -m "not slow"` keeps that check on every case and the
# quick check on every type
BATTERY = pytest.mark.slow
KERNEL_FAMILIES = ("gpt2", "llama", "bloom")  # kernel dispatch is per call, not per family: one of each native kind
# "scheme[+flag|+key=value]...[@kernel]": a scheme with extra options (a bare flag is True), on a kernel the
# tests' default (chunked, conftest) would not take
KERNEL_CASES = [
    "alibi@auto",
    "alibi+scale_bias@auto",
    "nope+temperature=0.4+temperature_length=8",
    "rope+temperature=0.4+temperature_length=8",
    "alibi+temperature=0.4+temperature_length=8",
    "nope+qk_norm",
    "rope+qk_norm+temperature=0.3",
    "alibi+temperature=0.4+temperature_length=8@auto",
    "alibi+scale_bias+temperature=0.3+temperature_length=8@auto",
    "t5@auto",
    "shaw@auto",
    "fire@auto",
    "t5+temperature=0.4+temperature_length=8@auto",
    "rope+scaling=dynamic+factor=2.0+theta=100.0",
    "xl@auto",
    "nezha+max_distance=8@auto",
]


def _applies(model_type: str, case: str) -> bool:
    return (
        case.partition("@")[0].split("+")[0] not in ONLY_LEARNED_ABSOLUTE
        or adapter_class(model_type).native_kind == "learned_absolute"
    )


CASES = [
    (m, c)
    for m, c in itertools.chain(
        itertools.product(REPRESENTATIVES, sorted(MATRIX_OPTIONS)), itertools.product(KERNEL_FAMILIES, KERNEL_CASES)
    )
    if _applies(m, c)
]


# a native-ALiBi family: ALiBi and the ALiBi-shaped inits reproduce the original, so the liveness check (logits
# change) takes options that differ from it
NATIVE_ALIBI = {
    "alibi": {"scale_bias": True},
    "t5": {"init": "zero"},
    "shaw": {"init": "zero"},
    "fire": {"init": "random"},
}
FAMILY_OPTIONS = {"bloom": NATIVE_ALIBI, "mpt": NATIVE_ALIBI}


def convert_case(model, case):
    """Convert ``model`` as the matrix case says: ``scheme``, or ``scheme[+flag]@kernel``."""
    name, _, kernel = case.partition("@")
    scheme, *flags = name.split("+")
    extra = dict(f.split("=") if "=" in f else (f, True) for f in flags)
    extra = {k: v if v is True else _value(v) for k, v in extra.items()}
    family = FAMILY_OPTIONS.get(model.config.model_type, {}).get(scheme, {})
    options = {**MATRIX_OPTIONS[scheme], **family, **extra}
    return retrofit.convert(model, scheme, **({"kernel": kernel} if kernel else {}), **options)


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def scheme_of(case):
    return case.partition("@")[0].split("+")[0]


def test_every_registration_is_in_the_matrix():
    covered = set(TINY)
    for name, cls in ADAPTERS.items():
        missing = set(cls.model_types) - covered - UNAVAILABLE
        assert not missing, f"adapter {name!r}: model types {missing} have no tiny model in tests/tiny.py"
    assert set(retrofit.schemes()) == set(MATRIX_OPTIONS), "every scheme needs MATRIX_OPTIONS in tests/tiny.py"
    assert set(REPRESENTATIVES) | set(QUIRKS) == set(TINY) and not set(REPRESENTATIVES) & set(QUIRKS)
    assert {adapter_class(m).__name__ for m in TINY} == {adapter_class(m).__name__ for m in REPRESENTATIVES}, (
        "every adapter needs a representative with the full battery"
    )
    for m in KERNEL_FAMILIES:
        assert m in REPRESENTATIVES
    assert {adapter_class(m).native_kind for m in KERNEL_FAMILIES} == {adapter_class(m).native_kind for m in TINY}


def converted(model_type, case):
    return convert_case(TINY[model_type](), case)


@pytest.mark.parametrize("model_type,scheme", CASES)
def test_live_and_matches_reference(model_type, scheme):
    model = TINY[model_type]()
    x = ids(2, 24)
    with torch.no_grad():
        before = model(x).logits
        convert_case(model, scheme)
        after = model(x).logits
        assert not torch.allclose(before, after, atol=1e-3), "patch is not live: logits unchanged"
        if scheme.endswith("@auto"):
            ran = set(retrofit.patch.conversion._state(model).kernels)
            if scheme.startswith("alibi"):
                assert retrofit.describe(model)["last_kernel"] == "sdpa-alibi-dims"
            elif scheme.startswith("xl"):  # any window or padding: the dims kernel, every layer
                assert ran == {"sdpa-relative-dims"}
            elif scheme.startswith("nezha"):  # the band kernel in every layer without a window, chunked in the rest
                assert ran <= {"cpu-flash-relative-band", "chunked"}
                assert "cpu-flash-relative-band" in ran or model_type in ("mistral", "starcoder2")
            elif "temperature" in scheme or scheme.startswith("fire"):  # no band: the dense kernel, every layer
                assert set(retrofit.patch.conversion._state(model).kernels) == {"cpu-flash-mask"}
            elif model_type not in ("mistral", "starcoder2"):  # the band kernel, in every layer without a window
                # shorter than the input (GPT-Neo's local layers, the tiny Mistral's 8 keys go dense)
                assert "cpu-flash-band" in retrofit.patch.conversion._state(model).kernels
        _set_attn(model, "retrofit_reference")
        ref = model(x).logits
        _set_attn(model, "retrofit")
    torch.testing.assert_close(after, ref, atol=2e-5, rtol=1e-4)


@BATTERY
@pytest.mark.parametrize("model_type,scheme", CASES)
def test_runs_at_4x_native_and_matches_reference(model_type, scheme):
    model = converted(model_type, scheme)
    x = ids(1, 4 * NATIVE)
    with torch.no_grad():
        out = model(x).logits
        _set_attn(model, "retrofit_reference")
        ref = model(x).logits
    assert out.shape == (1, 4 * NATIVE, model.config.vocab_size) and torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@BATTERY
@pytest.mark.parametrize("model_type,scheme", CASES)
def test_incremental_decoding_equals_full_forward(model_type, scheme):
    if "dynamic" in scheme:
        pytest.skip(
            "dynamic RoPE re-sizes its frequencies with the length: past the native length a cached step "
            "reuses upper layers' keys computed at the shorter length, so it cannot equal a recompute (as in "
            "transformers' own dynamic RoPE); docs/ARCHITECTURE.md"
        )
    model = converted(model_type, scheme)
    x = ids(1, 40)
    with torch.no_grad():
        full = model(x).logits
        out = model(x[:, :30], use_cache=True)
        steps, cache = [out.logits], out.past_key_values
        for t in range(30, 40):
            out = model(x[:, t : t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.past_key_values
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=2e-5, rtol=1e-4)


@BATTERY
@pytest.mark.parametrize("model_type,scheme", CASES)
def test_generate_cache_equals_recompute_left_padded(model_type, scheme):
    model = converted(model_type, scheme)
    x = ids(2, 12)
    mask = torch.ones_like(x)
    x[0, :4], mask[0, :4] = 0, 0  # left padding in the first row
    kw = dict(
        attention_mask=mask,
        max_new_tokens=6,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        a = model.generate(x, use_cache=True, **kw)
        b = model.generate(x, use_cache=False, **kw)
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), atol=2e-5, rtol=1e-4)


def _tolerance(scheme):
    # absolute rotary positions shift by the padding; relative geometry is the same
    return dict(atol=1e-4, rtol=1e-3) if scheme_of(scheme) == "rope" else dict(atol=2e-5, rtol=1e-4)


@BATTERY
@pytest.mark.parametrize("with_position_ids", [False, True], ids=["mask", "mask+position_ids"])
@pytest.mark.parametrize("model_type,scheme", CASES)
def test_padding_is_applied(model_type, scheme, with_position_ids):
    """A left-padded row gives the same logits on its real tokens as the unpadded sequence, past the native
    length (FIRE's threshold, dynamic RoPE's rescaling), with the mask alone or with position ids built from it
    as ``generate`` builds them."""
    model = converted(model_type, scheme)
    x = ids(1, NATIVE + 8)
    padded = torch.cat([torch.zeros(1, 6, dtype=torch.long), x], 1)
    mask = torch.cat([torch.zeros(1, 6, dtype=torch.long), torch.ones_like(x)], 1)
    extra = {"position_ids": (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)} if with_position_ids else {}
    with torch.no_grad():
        plain = model(x).logits
        pad = model(padded, attention_mask=mask, **extra).logits[:, 6:]
    torch.testing.assert_close(pad, plain, **_tolerance(scheme))


@BATTERY
@pytest.mark.parametrize("model_type,scheme", CASES)
def test_left_padded_batch_generates_as_each_prompt_alone(model_type, scheme):
    """Greedy ``generate`` on a left-padded batch of two prompts (one crossing the native length) gives each
    prompt's tokens and logits alone. Dynamic RoPE sizes its frequencies on the batch's longest row (as
    transformers' does): only that row is compared."""
    model = converted(model_type, scheme)
    prompts = [ids(1, NATIVE + 4, seed=1), ids(1, NATIVE - 9, seed=2)]
    width = max(p.shape[1] for p in prompts)
    batch, mask = torch.zeros(2, width, dtype=torch.long), torch.zeros(2, width, dtype=torch.long)
    for r, p in enumerate(prompts):
        batch[r, width - p.shape[1] :], mask[r, width - p.shape[1] :] = p[0], 1
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    rows = [0] if "dynamic" in scheme else [0, 1]
    with torch.no_grad():
        together = model.generate(batch, attention_mask=mask, **kw)
        for r in rows:
            alone = model.generate(prompts[r], attention_mask=torch.ones_like(prompts[r]), **kw)
            new = alone.sequences[0, prompts[r].shape[1] :]  # may stop early at EOS; the batch goes on padding
            assert torch.equal(together.sequences[r, width : width + len(new)], new), f"row {r}"
            torch.testing.assert_close(
                torch.stack(together.logits)[: len(new), r], torch.stack(alone.logits)[:, 0], **_tolerance(scheme)
            )


def test_dynamic_rope_under_padding_follows_transformers():
    """Dynamic RoPE sizes its frequencies on max(position_ids) + 1, as transformers' own dynamic RoPE
    (LLaMA with rope_type dynamic): a left-padded batch past the native length gives its logits."""
    native_cfg = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    native = _llama_like(transformers.LlamaConfig, transformers.LlamaForCausalLM, rope_parameters=native_cfg)()
    plain = TINY["llama"]()
    plain.load_state_dict(native.state_dict())
    model = retrofit.convert(plain, "rope", scaling="dynamic", factor=2.0)
    x, mask = torch.zeros(2, NATIVE + 12, dtype=torch.long), torch.zeros(2, NATIVE + 12, dtype=torch.long)
    x[0], mask[0] = ids(1, NATIVE + 12, seed=1)[0], 1
    x[1, 14:], mask[1, 14:] = ids(1, NATIVE - 2, seed=2)[0], 1
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    for given in ({"position_ids": position_ids}, {}):  # the mask alone: positions counted over real tokens
        with torch.no_grad():
            ref = native(x, attention_mask=mask, position_ids=position_ids).logits
            out = model(x, attention_mask=mask, **given).logits
        torch.testing.assert_close(out[0], ref[0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(out[1, 14:], ref[1, 14:], atol=2e-5, rtol=1e-4)


def test_dynamic_rope_under_placed_positions_follows_transformers():
    """A fine-tune's placed positions (PoSE: a block whose positions jump toward the target) size dynamic RoPE's
    frequencies as the same positions given to transformers' own dynamic RoPE as position_ids: on the largest
    position + 1, not on the block's length (which would train the unscaled rotation at far positions)."""
    native_cfg = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    native = _llama_like(transformers.LlamaConfig, transformers.LlamaForCausalLM, rope_parameters=native_cfg)()
    plain = TINY["llama"]()
    plain.load_state_dict(native.state_dict())
    model = retrofit.convert(plain, "rope", scaling="dynamic", factor=2.0)
    T = NATIVE // 2
    placed = torch.cat([torch.arange(T // 2), torch.arange(T - T // 2) + 3 * NATIVE])  # max 3.5x native
    x = ids(1, T, seed=3)
    offset = 3 * NATIVE  # random_offset's uniform shift: the same rule, positions offset .. offset + T - 1
    for given, controls in ((placed, {"positions": placed}), (torch.arange(T) + offset, {"offset": offset})):
        retrofit.set_position_controls(model, **controls)
        try:
            with torch.no_grad():
                ref = native(x, position_ids=given[None]).logits
                out = model(x).logits
                unscaled = native.model.rotary_emb.original_inv_freq
                assert not torch.equal(native.model.rotary_emb.inv_freq, unscaled)  # the reference did rescale
        finally:
            retrofit.set_position_controls(model)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@BATTERY
@pytest.mark.parametrize("model_type,scheme", CASES)
def test_save_load_identical(model_type, scheme, tmp_path):
    model = converted(model_type, scheme)
    x = ids(1, 2 * NATIVE)
    with torch.no_grad():
        before = model(x).logits
    retrofit.save(model, tmp_path / "m")
    loaded = retrofit.load(tmp_path / "m")
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m")  # what third-party loaders get
    with torch.no_grad():
        after, after_plain = loaded(x).logits, plain(x).logits
    assert retrofit.describe(loaded)["scheme"] == retrofit.describe(plain)["scheme"] == scheme_of(scheme)
    assert retrofit.describe(loaded)["kernel"] == retrofit.describe(model)["kernel"]
    assert torch.equal(before, after) and torch.equal(before, after_plain)
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["model_type"] == "retrofit" and saved["retrofit"]["base_config"]["model_type"] == model_type


@BATTERY
@pytest.mark.parametrize("model_type,scheme", CASES)
def test_revert_is_exact(model_type, scheme):
    model = TINY[model_type]()
    x = ids(1, 20)
    with torch.no_grad():
        before = model(x).logits
        length = getattr(model.config, "max_position_embeddings", None)  # BLOOM's config names no length
        convert_case(model, scheme)
        if length is not None:  # the reach is advertised where the config has a length key
            assert model.config.max_position_embeddings == (retrofit.describe(model)["max_length"] or int(1e30))
        retrofit.revert(model)
        after = model(x).logits
    assert torch.equal(before, after) and getattr(model.config, "max_position_embeddings", None) == length
    assert not retrofit.describe(model)["converted"]
    assert "retrofit_positions" not in dict(model.named_modules())


@BATTERY
@pytest.mark.parametrize("model_type,scheme", CASES)
def test_trains_through_the_patch(model_type, scheme):
    model = converted(model_type, scheme)
    model.train()
    model.gradient_checkpointing_enable()
    x = ids(2, 2 * NATIVE)
    loss = model(x, labels=x).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


QUICK_CASES = ("alibi@auto", "rope")  # the user's default kernel; rescaled rotary (forward only)


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_quick_check_per_model_type(model_type, tmp_path):
    """Every registered type: on the user's default kernel (ALiBi) and on rescaled RoPE the patch is live and
    matches the plain reference past native; on ALiBi a left-padded batch generates as each prompt alone
    (with the cache as without) and save -> reload gives the same logits."""
    x = ids(2, NATIVE + 8)
    with torch.no_grad():
        plain = TINY[model_type]()(x[:, :NATIVE]).logits  # a learned table stops at native
    for case in QUICK_CASES:
        model = converted(model_type, case)
        with torch.no_grad():
            out = model(x).logits
            _set_attn(model, "retrofit_reference")
            ref = model(x).logits
            _set_attn(model, "retrofit")
        assert not torch.allclose(out[:, :NATIVE], plain, atol=1e-3), f"{case}: patch is not live"
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    model = converted(model_type, QUICK_CASES[0])
    test_left_padded_batch_generates_as_each_prompt_alone(model_type, QUICK_CASES[0])
    retrofit.save(model, tmp_path / "m")
    with torch.no_grad():
        assert torch.equal(model(x).logits, retrofit.load(tmp_path / "m")(x).logits), "save -> reload changed logits"
