"""Models claimed by their structure (the LLaMA layout, or OPT's learned table, under another model type) and
proven by the lossless probe; models whose difference matters refused by name (issue 42)."""

from __future__ import annotations

import re

import pytest
import torch
import transformers as tf

import retrofit
from retrofit.adapters import quirks
from retrofit.adapters.base import AttentionLayer
from retrofit.foundation.errors import UnsupportedArchitectureError
from retrofit.patch import probe
from retrofit.patch.conversion import _set_attn

from .. import reference  # noqa: F401  (registers "retrofit_reference")
from ..tiny import NATIVE, VOCAB, _llama_like, bart_decoder, biogpt, ids

GEMMA3_LAYERS = ["sliding_attention", "full_attention"]
MOE = dict(num_local_experts=4, num_experts_per_tok=2)
CLAIMED = {  # the LLaMA layout under another model type: converted after the probe
    "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM, MOE),
    "qwen2_moe": (
        tf.Qwen2MoeConfig,
        tf.Qwen2MoeForCausalLM,
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
    ),
    "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, {}),
    "gemma": (tf.GemmaConfig, tf.GemmaForCausalLM, dict(head_dim=16)),
    "stablelm": (tf.StableLmConfig, tf.StableLmForCausalLM, {}),  # partial rotary
    "phi": (tf.PhiConfig, tf.PhiForCausalLM, {}),  # partial rotary, output projection named dense
    "cohere": (tf.CohereConfig, tf.CohereForCausalLM, {}),  # interleaved (GPT-J-style) rotary
    "smollm3": (tf.SmolLM3Config, tf.SmolLM3ForCausalLM, dict(num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0])),
    # rope parameters per layer type: local sliding layers (theta 10k) beside global ones (1M)
    "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM, dict(head_dim=16, attn_logit_softcapping=5.0)),  # softcap
    "gpt_oss": (tf.GptOssConfig, tf.GptOssForCausalLM, dict(MOE, head_dim=16)),  # attention sinks
    "gemma3_text": (
        tf.Gemma3TextConfig,
        tf.Gemma3ForCausalLM,
        dict(head_dim=16, layer_types=GEMMA3_LAYERS, sliding_window=24),
    ),
}
MLA = dict(  # deepseek_v3's multi-head latent attention: the rotary part split off and placed last in each head
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    q_lora_rank=None,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
    num_key_value_heads=4,
)
CLAIMED["deepseek_v3"] = (tf.DeepseekV3Config, tf.DeepseekV3ForCausalLM, MLA)
CLAIMED["granite_swa"] = (  # one rotary module per rope theta; theta 0: a layer without positions
    tf.GraniteSWAConfig,
    tf.GraniteSWAForCausalLM,
    dict(layer_types=["full_attention", "sliding_attention"], layer_rope_theta=[0.0, 10000.0], sliding_window=24),
)
CLAIMED["deepseek_v2"] = (tf.DeepseekV2Config, tf.DeepseekV2ForCausalLM, MLA)  # complex rotary pairs, interleaved
CLAIMED["nanochat"] = (tf.NanoChatConfig, tf.NanoChatForCausalLM, {})  # rotate_half as (x2, -x1): pairs turn back
TABLE_CLAIMED = {"biogpt": biogpt, "bart": bart_decoder}  # OPT's layout (a learned table) under another model type
REFUSED = {  # model type: (factory arguments, the quirk the error names)
    "deepseek_v32": (
        (
            tf.DeepseekV32Config,
            tf.DeepseekV32ForCausalLM,
            dict(MLA, q_lora_rank=32, index_n_heads=2, index_head_dim=16, index_topk=8),
        ),
        "sparse-attention indexer",
    ),
}

REFUSED_CONFIGS = {  # a config of a type that converts otherwise: (factory arguments, what the error names)
    "granite_swa, two rope thetas": (
        (
            tf.GraniteSWAConfig,
            tf.GraniteSWAForCausalLM,
            dict(layer_types=["full_attention", "full_attention"], layer_rope_theta=[10000.0, 500000.0]),
        ),
        "rope thetas that differ by layer",
    ),
}


def tiny(config_cls, model_cls, extra):
    return _llama_like(config_cls, model_cls, **extra)()


@pytest.mark.parametrize("model_type", sorted(CLAIMED))
def test_a_model_of_the_llama_layout_is_claimed_probed_and_converted(model_type, tmp_path):
    model = tiny(*CLAIMED[model_type])
    assert model.config.model_type == model_type
    x = ids(2, NATIVE + 8)
    with torch.no_grad():
        plain = model(x[:, :NATIVE]).logits
        retrofit.convert(model, "alibi", kernel="auto")
        out = model(x).logits
        assert probe.fingerprint(tiny(*CLAIMED[model_type])) in probe._PASSED, "the probe did not run"
        assert not torch.allclose(out[:, :NATIVE], plain, atol=1e-3), "patch is not live"
        _set_attn(model, "retrofit_reference")
        ref = model(x).logits
        _set_attn(model, "retrofit")
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        a, b = model.generate(x[:1], use_cache=True, **kw), model.generate(x[:1], use_cache=False, **kw)
    assert torch.equal(a.sequences, b.sequences)
    retrofit.save(model, tmp_path / "m")
    with torch.no_grad():
        assert torch.equal(retrofit.load(tmp_path / "m")(x).logits, out)


@pytest.mark.parametrize("model_type", sorted(REFUSED) + sorted(REFUSED_CONFIGS))
def test_a_difference_that_matters_is_refused_by_name(model_type):
    args, says = {**REFUSED, **REFUSED_CONFIGS}[model_type]
    model = tiny(*args)
    with torch.no_grad():
        before = model(ids(1, 16)).logits
    with pytest.raises(UnsupportedArchitectureError, match=re.escape(says)):
        retrofit.convert(model, "alibi")
    with torch.no_grad():
        assert torch.equal(model(ids(1, 16)).logits, before), "a refused model is left as it was"


def test_the_probe_refuses_a_difference_no_declared_quirk_names(monkeypatch):
    """Without its declared fact, cohere's interleaved rotary is still caught: by its logits."""
    monkeypatch.setattr(quirks, "QUIRKS", tuple(q for q in quirks.QUIRKS if q.name != "interleaved_rotary"))
    monkeypatch.setattr(probe, "_PASSED", {})  # a pass remembered from another test
    model = tiny(*CLAIMED["cohere"])
    with pytest.raises(UnsupportedArchitectureError, match="lossless probe failed"):
        retrofit.convert(model, "rope")
    assert not retrofit.describe(model)["converted"]


def test_lora_targets_come_from_the_attention_itself():
    from retrofit.adapters.base import claimant

    assert "dense" in claimant(tiny(*CLAIMED["phi"])).targets()
    assert set(claimant(tiny(*CLAIMED["mixtral"])).targets()) == {"q_proj", "k_proj", "v_proj", "o_proj"}


@pytest.mark.parametrize("model_type", ["cohere", "llama", "deepseek_v3", "deepseek_v2", "nanochat"])
def test_rescaled_rope_equals_transformers_own_on_interleaved_and_half_split_rotary(model_type):
    """YaRN x2 on a plain model equals the same weights with transformers' own YaRN, left-padded batch past
    native included: the interleaved pairs (cohere) are rotated as its own code rotates them, MLA's split-off
    rotary part (deepseek_v3, last in each head) alone, and nanochat's pairs the other way."""
    cfg, cls, extra = {
        "cohere": (tf.CohereConfig, tf.CohereForCausalLM, {}),
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {}),
        "deepseek_v3": CLAIMED["deepseek_v3"],
        "deepseek_v2": CLAIMED["deepseek_v2"],
        "nanochat": CLAIMED["nanochat"],
    }[model_type]
    yarn = {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0, "original_max_position_embeddings": NATIVE}
    temperature = {}
    if model_type == "nanochat":  # its QK-norm follows the rotation and divides YaRN's temperature out again
        temperature = {"attention_factor": 1.0}
    native = tiny(cfg, cls, dict(extra, rope_parameters=yarn | temperature, max_position_embeddings=2 * NATIVE))
    plain = tiny(cfg, cls, dict(extra, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    plain.load_state_dict(native.state_dict())
    retrofit.convert(plain, "rope", scaling="yarn", factor=2.0, **temperature)
    x, mask = ids(2, NATIVE + 12), torch.ones(2, NATIVE + 12, dtype=torch.long)
    x[1, :5], mask[1, :5] = 0, 0
    with torch.no_grad():
        ref, out = native(x, attention_mask=mask).logits, plain(x, attention_mask=mask).logits
    torch.testing.assert_close(out[0], ref[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out[1, 5:], ref[1, 5:], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("scaling", ["linear", "yarn"])
def test_per_layer_type_rope_rescales_the_global_layers_as_transformers_own_gemma3(scaling, tmp_path):
    """gemma3: rescaled RoPE on a model with local (theta 10k) and global (1M) layers equals the same weights
    with transformers' own scaling of ``rope_parameters["full_attention"]``, the local layers unchanged; a
    left-padded batch past native included; the native export writes that very config, exact."""
    cfg, cls, extra = CLAIMED["gemma3_text"]
    own = {"rope_type": "default", "rope_theta": 1e6}
    scaled = {"rope_type": scaling, "factor": 4.0, "rope_theta": 1e6}
    if scaling == "yarn":
        scaled["original_max_position_embeddings"] = NATIVE
    local = {"rope_type": "default", "rope_theta": 1e4}
    native = tiny(cfg, cls, dict(extra, rope_parameters={"full_attention": scaled, "sliding_attention": local}))
    plain = tiny(cfg, cls, dict(extra, rope_parameters={"full_attention": own, "sliding_attention": local}))
    plain.load_state_dict(native.state_dict())
    retrofit.convert(plain, "rope", scaling=scaling, factor=4.0)
    x, mask = ids(2, NATIVE + 12), torch.ones(2, NATIVE + 12, dtype=torch.long)
    x[1, :5], mask[1, :5] = 0, 0
    with torch.no_grad():
        ref, out = native(x, attention_mask=mask).logits, plain(x, attention_mask=mask).logits
    torch.testing.assert_close(out[0], ref[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out[1, 5:], ref[1, 5:], atol=2e-5, rtol=1e-4)
    assert retrofit.export(plain, tmp_path / "x", native=True).exact
    params = tf.AutoConfig.from_pretrained(tmp_path / "x").rope_parameters
    assert params["full_attention"]["rope_type"] == scaling and params["sliding_attention"] == local


def test_a_layer_without_positions_stays_without_them(monkeypatch):
    """smollm3's no_rope_layers: the layer the original runs without positions is kept so (the probe passes);
    rotated like the others, the probe sees it and refuses."""
    from retrofit.adapters.llama import LlamaAdapter

    model = tiny(*CLAIMED["smollm3"])
    retrofit.convert(model, "alibi")
    assert [site.positions for site in retrofit.patch.conversion._state(model).adapter.attention_layers()] == [
        True,
        True,
        True,
        False,
    ]
    monkeypatch.setattr(probe, "_PASSED", {})
    monkeypatch.setattr(
        LlamaAdapter,
        "attention_layers",
        lambda self: [AttentionLayer(i, layer.self_attn) for i, layer in enumerate(self.base().layers)],
    )
    with pytest.raises(UnsupportedArchitectureError, match="lossless probe failed"):
        retrofit.convert(tiny(*CLAIMED["smollm3"]), "alibi")


def test_the_support_table_says_what_this_suite_shows():
    """docs/support.md (research/support_table.py) agrees with the types this file converts and
    refuses, and with every registered type."""
    from pathlib import Path

    from retrofit.adapters import ADAPTERS

    text = (Path(__file__).resolve().parents[2] / "docs" / "support.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+)` \| ([a-z ]+) \|", text, re.M))
    registered = {t for _n, c in ADAPTERS.items() for t in c.model_types}
    for t in set(CLAIMED) | set(TABLE_CLAIMED) | registered:
        assert rows.get(t) == "converts", f"docs/support.md says {t}: {rows.get(t)}"
    for t in REFUSED:
        assert rows.get(t) in ("refused", "not built"), f"docs/support.md says {t}: {rows.get(t)}"
    converts = sum(1 for s in rows.values() if s == "converts")
    assert f"**{converts} of {len(rows)} types convert**" in text


@pytest.mark.parametrize("scheme", ["nope", "rope"])
def test_gptj_converts_in_bf16(scheme):
    """GPT-J casts its sin/cos to the input's dtype: the stand-in does too (else q, k and v differ in dtype)."""
    from ..tiny import TINY

    if "gptj" not in TINY:
        pytest.skip("this transformers rotates GPT-J inside its attention (the adapter refuses it by name)")
    model = TINY["gptj"]().to(torch.bfloat16)
    retrofit.convert(model, scheme)
    with torch.no_grad():
        assert model(ids(1, 2 * NATIVE)).logits.dtype == torch.bfloat16


@pytest.mark.parametrize("scaling", ["ntk", "yarn"])
def test_mla_rescaled_rope_exports_to_its_own_architecture_exactly(scaling, tmp_path):
    """deepseek_v3's rotary part is its own qk_rope_head_dim dims: NTK's grown base and YaRN's bands are
    computed on those dims, so the exported config reproduces the patched model exactly past native."""
    model = tiny(*CLAIMED["deepseek_v3"])
    retrofit.convert(model, "rope", scaling=scaling, factor=4.0)
    assert retrofit.export(model, tmp_path / "x", native=True).exact
    back = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "x")
    x = ids(1, 3 * NATIVE)
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, atol=2e-5, rtol=1e-4)


def test_mla_rotary_part_cannot_be_resized():
    model = tiny(*CLAIMED["deepseek_v3"])
    with pytest.raises(retrofit.foundation.errors.OptionError, match="qk_rope_head_dim|split-off"):
        retrofit.convert(model, "rope", fraction=0.5)


def test_proportional_rope_keeps_its_unrotated_dims_unrotated_when_rescaled():
    """lfm3's global layers rotate half of each head ("proportional": the other frequencies are 0): YaRN rescales
    the rotating half and the rest stays without positions."""
    cfg = tf.Lfm3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=NATIVE, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, layer_types=["conv", "full_attention", "conv", "sliding_attention"],
    )  # fmt: skip
    model = tf.Lfm3ForCausalLM(cfg).eval()
    retrofit.convert(model, "rope", scaling="yarn", factor=4.0)
    inv_freq = retrofit.patch.conversion._state(model).scheme().inv_freq
    assert inv_freq[:4].gt(0).all() and inv_freq[4:].eq(0).all(), inv_freq


def test_deepseek_s_own_yarn_temperature_is_refused_when_rescaled():
    """Its attention scale holds the temperature of its native YaRN (mscale_all_dim): kept as is, refused when
    rescaled (a second temperature would sharpen every score)."""
    rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": NATIVE,
            "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip
    model = tiny(*CLAIMED["deepseek_v3"][:2], dict(MLA, rope_parameters=rope, max_position_embeddings=4 * NATIVE))
    with pytest.raises(retrofit.foundation.errors.OptionError, match="mscale_all_dim"):
        retrofit.convert(model, "rope", scaling="yarn", factor=8.0)
    retrofit.convert(model, "alibi")  # another scheme: the rotation goes, the scale stays the model's


@pytest.mark.parametrize("model_type", ["gemma2", "gpt_oss"])
def test_a_half_precision_model_is_probed_in_float32_and_given_back_bit_for_bit(model_type, monkeypatch):
    """gemma2's eager softcap rounds its scores in bf16 where retrofit keeps them in fp32: probed in float32, it
    converts; its weights are the same bf16 tensors afterwards."""
    monkeypatch.setattr(probe, "_PASSED", {})
    model = tiny(*CLAIMED[model_type]).to(torch.bfloat16)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    retrofit.convert(model, "alibi")
    after = model.state_dict()
    assert all(torch.equal(after[k], v) and after[k].dtype == v.dtype for k, v in weights.items() if k in after)


def test_in_half_precision_the_probe_still_sees_a_difference_no_quirk_names(monkeypatch):
    """At bf16's own float noise cohere's pairs read the wrong way would pass on a tiny model; in float32 not."""
    monkeypatch.setattr(quirks, "QUIRKS", tuple(q for q in quirks.QUIRKS if q.name != "interleaved_rotary"))
    monkeypatch.setattr(probe, "_PASSED", {})
    model = tiny(*CLAIMED["cohere"]).to(torch.bfloat16)
    with pytest.raises(UnsupportedArchitectureError, match="lossless probe failed"):
        retrofit.convert(model, "rope")
    assert next(model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("scheme", ["alibi", "rope"])
def test_a_learned_table_decoder_is_claimed_probed_and_converted(scheme, tmp_path):
    """BioGPT (OPT's learned table with its offset of 2, no adapter names it): claimed by structure, its own table
    gives its logits back (the probe's conversion) and revert the original's; converted, the patch is live and
    matches the reference past the table's rows, generates with its cache as without (a left-padded row
    included), and save -> reload gives the same logits."""
    from retrofit.adapters.base import adapter_for

    model = biogpt()
    adapter = adapter_for(model)
    assert model.config.model_type == "biogpt" and adapter.name == "opt" and adapter.by_structure
    assert adapter.position_table.key == "biogpt.embed_positions.weight" and adapter.position_table.first_row == 2
    x = ids(2, NATIVE + 8)
    with torch.no_grad():
        plain = model(x[:, :NATIVE]).logits
        retrofit.convert(model, "extend", length=2 * NATIVE, init="copy")  # its own table, inside native
        torch.testing.assert_close(model(x[:, :NATIVE]).logits, plain, atol=2e-5, rtol=1e-4)
        retrofit.revert(model)
        assert torch.equal(model(x[:, :NATIVE]).logits, plain)
        retrofit.convert(model, scheme)
        assert probe.fingerprint(biogpt()) in probe._PASSED, "the probe did not run"
        out = model(x).logits
        assert not torch.allclose(out[:, :NATIVE], plain, atol=1e-3), "patch is not live"
        _set_attn(model, "retrofit_reference")
        ref = model(x).logits
        _set_attn(model, "retrofit")
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    prompt, mask = ids(2, 12), torch.ones(2, 12, dtype=torch.long)
    prompt[0, :4], mask[0, :4] = 0, 0
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        a = model.generate(prompt, attention_mask=mask, use_cache=True, **kw)
        b = model.generate(prompt, attention_mask=mask, use_cache=False, **kw)
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), atol=2e-5, rtol=1e-4)
    retrofit.save(model, tmp_path / "m")
    with torch.no_grad():
        assert torch.equal(retrofit.load(tmp_path / "m")(x).logits, out)
    retrofit.revert(model)
    with torch.no_grad():
        assert torch.equal(model(x[:, :NATIVE]).logits, plain), "revert: not the original's logits"


def test_a_decoder_beside_an_encoder_reads_its_own_heads():
    """BART's decoder as a causal LM: its config's standard names report the encoder's 16 heads and 3 layers; the
    scheme is built for the decoder's own 4 heads and 2 layers (ALiBi's slopes are per head)."""
    model = bart_decoder()
    x = ids(1, NATIVE + 8)
    retrofit.convert(model, "alibi")
    spec = retrofit.patch.conversion._state(model).adapter.spec()
    assert (spec.num_heads, spec.num_layers, spec.head_dim) == (4, 2, 16)
    with torch.no_grad():
        out = model(x).logits
        _set_attn(model, "retrofit_reference")
        ref = model(x).logits
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_a_learned_table_decoder_converts_from_its_folder(tmp_path, monkeypatch, capsys):
    """``retrofit convert <folder> --to alibi --out X`` on a BioGPT folder: converted, loaded back as BioGPT."""
    from retrofit.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RETROFIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RETROFIT_PROGRESS", "0")
    model = biogpt()
    model.save_pretrained(tmp_path / "bio")
    rc = main(["convert", "bio", "--to", "alibi", "--out", "out"])
    assert rc == 0, capsys.readouterr().err
    back = retrofit.load(tmp_path / "out")
    assert type(back).__name__ == "BioGptForCausalLM" and retrofit.describe(back)["scheme"] == "alibi"
    retrofit.convert(model, "alibi")
    with torch.no_grad():
        torch.testing.assert_close(back(ids(1, NATIVE + 8)).logits, model(ids(1, NATIVE + 8)).logits)


def test_an_unclaimed_decoder_is_told_both_layouts():
    """A decoder of neither layout (XGLM's sinusoids computed on the fly) is refused with both layouts named."""
    cfg = tf.XGLMConfig(vocab_size=128, d_model=64, num_layers=2, attention_heads=4, ffn_dim=128)
    with pytest.raises(UnsupportedArchitectureError, match="a learned embed_positions table"):
        retrofit.convert(tf.XGLMForCausalLM(cfg).eval(), "alibi")


def test_a_converted_bart_decoder_called_with_encoder_states_says_cross_attention_is_not_converted():
    """BART's kin: the decoder's cross-attention is not converted; the error says so (it said "not converted: use
    retrofit.convert", although the model was)."""
    from retrofit.foundation.errors import PatchNotLiveError

    model = retrofit.convert(bart_decoder(), "alibi")
    x = ids(1, NATIVE)
    with pytest.raises(PatchNotLiveError, match="is a cross-attention .* call it without encoder_hidden_states"):
        model(input_ids=x, encoder_hidden_states=torch.zeros(1, 8, 64))
    assert model(input_ids=x).logits.shape[1] == NATIVE  # its own tokens: converted, it runs


def _sinusoid_table_decoder(config_cls, model_cls):
    cfg = config_cls(
        vocab_size=VOCAB,
        d_model=64,
        decoder_layers=2,
        decoder_attention_heads=4,
        encoder_layers=2,
        encoder_attention_heads=4,
        decoder_ffn_dim=128,
        encoder_ffn_dim=128,
        max_position_embeddings=NATIVE,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    return model_cls(cfg).eval()


@pytest.mark.parametrize("family", ["marian", "pegasus"])
def test_a_table_of_fixed_sinusoids_is_reported_and_converted_as_sinusoidal(family):
    """#70: Marian's and Pegasus's decoders keep fixed sinusoids in an ``nn.Embedding`` table: described as
    sinusoidal, not learned absolute (their input still bounded by the table); ``sinusoidal`` by default is their
    own (halves layout, unscaled: the same logits) and runs past the table; ``extend`` (which repeats learned
    rows) is refused with what to use."""
    from retrofit.foundation.errors import OptionError
    from retrofit.publishing.card_facts import native_note

    config_cls, model_cls = {
        "marian": (tf.MarianConfig, tf.MarianForCausalLM),
        "pegasus": (tf.PegasusConfig, tf.PegasusForCausalLM),
    }[family]
    model = _sinusoid_table_decoder(config_cls, model_cls)
    info = retrofit.describe(model)
    assert info["native"] == {"kind": "sinusoidal", "length": NATIVE} and info["max_length"] == NATIVE
    x = ids(1, NATIVE)
    with torch.no_grad():
        before = model(x).logits
        retrofit.convert(model, "sinusoidal")  # by structure: the lossless probe ran sinusoidal too
        assert retrofit.describe(model)["options"] == {"base": 10000.0, "scale": 1.0, "layout": "halves"}
        torch.testing.assert_close(model(x).logits, before, rtol=0, atol=1e-5)
        assert torch.isfinite(model(ids(1, 3 * NATIVE)).logits).all()  # past the table
    note = native_note(model.config.retrofit)
    assert "table of fixed sinusoids" in note and "learned" not in note
    retrofit.revert(model)
    with pytest.raises(OptionError, match="holds fixed sinusoids.*convert to sinusoidal"):
        retrofit.convert(model, "extend", length=2 * NATIVE)
    assert retrofit.describe(bart_decoder())["native"]["kind"] == "learned_absolute"  # BART's table is learned
