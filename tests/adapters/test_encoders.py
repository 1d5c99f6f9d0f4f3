"""Encoders: the BERT layout converts with its direction read from each attention module (an encoder sees
the keys after the query), its head kept; the schemes defined for both directions match the plain reference
past the native length, the others are refused by name, and a checkpoint loads as the class it was."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import retrofit
from retrofit.foundation.errors import OptionError, UnsupportedArchitectureError
from retrofit.patch import probe
from retrofit.patch.conversion import _set_attn

from .. import reference  # noqa: F401  (registers "retrofit_reference")
from ..tiny import NATIVE, VOCAB

ROBERTA_PAD = 1  # RoBERTa's padding_idx: position p at row p + 2


def encoder(config_cls, model_cls, extra):
    torch.manual_seed(0)
    offset = ROBERTA_PAD + 1 if config_cls in (tf.RobertaConfig, tf.XLMRobertaConfig) else 0
    cfg = config_cls(
        **{
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "max_position_embeddings": NATIVE + offset,
            "pad_token_id": ROBERTA_PAD if offset else 0,
            **extra,
        }
    )
    return model_cls(cfg).eval()


ENCODERS = {
    "bert-mlm": (tf.BertConfig, tf.BertForMaskedLM, {}),
    "bert-classifier": (tf.BertConfig, tf.BertForSequenceClassification, {}),
    "roberta-mlm": (tf.RobertaConfig, tf.RobertaForMaskedLM, {}),  # claimed by structure, padding offset
    "electra-mlm": (tf.ElectraConfig, tf.ElectraForMaskedLM, dict(embedding_size=64)),  # by structure
    "distilbert-mlm": (tf.DistilBertConfig, tf.DistilBertForMaskedLM, {}),  # transformer.layer[i].attention
    # one layer's weights run for every layer (encoder.albert_layer_groups[0].albert_layers[0]), a narrower
    # embedding projected up: by structure
    "albert-mlm": (tf.AlbertConfig, tf.AlbertForMaskedLM, dict(embedding_size=32, num_hidden_layers=3)),
}
BOTH_WAYS = {
    "alibi": {},
    "rope": {},
    "nope": {},
    "extend": {"length": 4 * NATIVE},
    "t5": {"num_buckets": 16, "max_distance": 48},  # T5's encoder buckets: 8 a side, the last shared past 48
    "shaw": {"max_distance": 48, "init": "zero"},  # 2k + 1 offsets (zero init: live against the original)
    "xl": {"init": "random"},  # R_{i-j} of negative distances too (random init: live against the original)
    "nezha": {"max_distance": 24},  # clip(j - i, -k, k), both sides, as the paper's BERT-style encoder
}


def batch(n: int):
    """Two rows of n tokens, the second right-padded by 5 (an encoder's usual padding)."""
    x = torch.randint(3, VOCAB, (2, n), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(x)
    x[1, -5:], mask[1, -5:] = ROBERTA_PAD, 0
    return x, mask


@pytest.mark.parametrize("scheme", sorted(BOTH_WAYS))
@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_an_encoder_converts_both_ways_and_matches_the_reference_past_native(name, scheme):
    model = encoder(*ENCODERS[name])
    x, mask = batch(2 * NATIVE)
    with torch.no_grad():
        before = model(x[:, :NATIVE], attention_mask=mask[:, :NATIVE]).logits
        retrofit.convert(model, scheme, **BOTH_WAYS[scheme])
        assert all(not s.module.is_causal for s in retrofit.patch.conversion._state(model).adapter.attention_layers())
        out = model(x, attention_mask=mask).logits
        _set_attn(model, "retrofit_reference")
        ref = model(x, attention_mask=mask).logits
        _set_attn(model, "retrofit")
    torch.testing.assert_close(out[0], ref[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out[1, :-5], ref[1, :-5], atol=2e-5, rtol=1e-4)
    if scheme != "extend":  # extend copies the table: the same model up to native
        assert not torch.allclose(out[0, :NATIVE], before[0], atol=1e-3), "patch is not live"


def test_deberta_v2_is_refused_by_name():
    model = tf.DebertaV2ForMaskedLM(
        tf.DebertaV2Config(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
        )
    )
    with pytest.raises(UnsupportedArchitectureError, match="disentangled relative attention"):
        retrofit.convert(model, "alibi")


def test_the_first_token_reads_the_last_one():
    """Bidirectional for real: changing the last token changes the first token's output."""
    model = encoder(*ENCODERS["bert-mlm"])
    retrofit.convert(model, "alibi")
    x, _ = batch(2 * NATIVE)
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % VOCAB
    with torch.no_grad():
        assert not torch.allclose(model(x).logits[:, 0], model(y).logits[:, 0])


@pytest.mark.parametrize("name", ["roberta-mlm", "electra-mlm", "albert-mlm"])
def test_a_type_claimed_by_structure_passes_the_probe_first(name, monkeypatch):
    monkeypatch.setattr(probe, "_PASSED", {})
    model = encoder(*ENCODERS[name])
    retrofit.convert(model, "alibi")
    assert probe.fingerprint(encoder(*ENCODERS[name])) in probe._PASSED
    assert retrofit.describe(model)["architecture"] == "bert"


def test_bidirectional_shaw_starts_as_symmetric_alibi_and_clips_each_side_on_its_own():
    """Shaw's 2k + 1 offsets initialised from ALiBi are -slope x |i - j| up to k on either side: with k past the
    input, the model equals symmetric ALiBi; a key after the query reads its own entry, not the one before."""
    x, mask = batch(2 * NATIVE)
    shaw, alibi = encoder(*ENCODERS["bert-mlm"]), encoder(*ENCODERS["bert-mlm"])
    retrofit.convert(shaw, "shaw", max_distance=4 * NATIVE)
    retrofit.convert(alibi, "alibi")
    with torch.no_grad():
        torch.testing.assert_close(shaw(x, attention_mask=mask).logits, alibi(x, attention_mask=mask).logits)
        scheme = retrofit.patch.conversion._state(shaw).scheme()
        k = scheme.options.max_distance
        assert scheme.table.shape[-1] == 2 * k + 1
        scheme.table[:, :, k + 1 :] = 0.0  # keys before the query: flat; keys after keep -slope x d
        h, q, j = torch.arange(4)[:, None, None], torch.tensor([[[10]]]), torch.arange(20)[None, None, :]
        b = scheme.bias(0, h, q, j)  # (H, 1, 20)
        assert torch.all(b[:, 0, :10] == 0) and torch.all(b[:, 0, 11:] < 0)


@pytest.mark.parametrize("scheme", ["fire"])
def test_a_scheme_defined_for_keys_before_the_query_only_is_refused_on_an_encoder(scheme):
    model = encoder(*ENCODERS["bert-mlm"])
    with pytest.raises(OptionError, match="bidirectional .*use one of alibi"):
        retrofit.convert(model, scheme)
    assert not retrofit.describe(model)["converted"]


@pytest.mark.parametrize("name", ["bert-mlm", "bert-classifier", "roberta-mlm", "albert-mlm"])
def test_save_and_load_give_back_the_same_class_and_logits(name, tmp_path):
    model = encoder(*ENCODERS[name])
    retrofit.convert(model, "alibi")
    x, mask = batch(3 * NATIVE)
    with torch.no_grad():
        out = model(x, attention_mask=mask).logits
    retrofit.save(model, tmp_path / "m")
    back = retrofit.load(tmp_path / "m")
    assert type(back) is type(model)
    with torch.no_grad():
        assert torch.equal(back(x, attention_mask=mask).logits, out)


@pytest.mark.parametrize(
    "name, saved",
    [("bert-classifier", "RetrofitForSequenceClassification"), ("bert-mlm", "RetrofitForMaskedLm")],
)
def test_a_saved_encoder_names_its_task_and_its_encoder_says_it_is_converted(name, saved, tmp_path):
    """config.json names the task's class (a classifier was saved as "RetrofitForCausalLM"), and the encoder that
    ``AutoModel`` gives for it describes the conversion it runs (it said ``converted: False``)."""
    import json

    retrofit.save(retrofit.convert(encoder(*ENCODERS[name]), "extend", length="4x"), tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["architectures"] == [saved] and config["model_type"] == "retrofit"
    bare = tf.AutoModel.from_pretrained(tmp_path / "m")
    info = retrofit.describe(bare)
    assert type(bare) is tf.BertModel and info["converted"] and info["scheme"] == "extend"
    assert info["max_length"] == 4 * NATIVE
    x, mask = batch(3 * NATIVE)  # past the old table: the encoder reads it
    with torch.no_grad():
        assert bare(x, attention_mask=mask).last_hidden_state.shape[1] == 3 * NATIVE


def modernbert(rope_parameters=None):
    torch.manual_seed(0)
    cfg = tf.ModernBertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=NATIVE,
        local_attention=16,  # the local layers see 8 keys each side (|i - j| <= 8)
        global_attn_every_n_layers=3,
        pad_token_id=0,
        **({"rope_parameters": rope_parameters} if rope_parameters else {}),
    )
    return tf.ModernBertForMaskedLM(cfg).eval()


def test_modernbert_rescales_its_global_layers_as_its_own_config_would(monkeypatch):
    """ModernBERT (rotary; local layers with a two-sided window, global ones): claimed by structure, probed,
    ALiBi matches the reference, and linear x4 RoPE equals transformers' own scaling of the global layers."""
    monkeypatch.setattr(probe, "_PASSED", {})
    local = {"rope_type": "default", "rope_theta": 1e4}
    native = modernbert(
        {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1.6e5}, "sliding_attention": local}
    )
    plain = modernbert({"full_attention": {"rope_type": "default", "rope_theta": 1.6e5}, "sliding_attention": local})
    plain.load_state_dict(native.state_dict())
    x, mask = batch(3 * NATIVE)
    x[1, -5:] = 0
    retrofit.convert(plain, "rope", scaling="linear", factor=4.0)
    assert probe._PASSED, "the probe did not run"
    with torch.no_grad():
        ref, out = native(x, attention_mask=mask).logits, plain(x, attention_mask=mask).logits
    torch.testing.assert_close(out[0], ref[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out[1, :-5], ref[1, :-5], atol=2e-5, rtol=1e-4)
    model = modernbert()
    retrofit.convert(model, "alibi")
    with torch.no_grad():
        out = model(x, attention_mask=mask).logits
        _set_attn(model, "retrofit_reference")
        ref = model(x, attention_mask=mask).logits
    torch.testing.assert_close(out[0], ref[0], atol=2e-5, rtol=1e-4)


def test_retrofit_convert_takes_an_encoder_folder_as_typed_and_eval_asks_a_classifier_for_its_task(tmp_path, capsys):
    """The user's path on an encoder: ``retrofit convert FOLDER --to alibi --out OUT`` keeps the masked-LM head
    (its evaluation: tests/evaluation/test_eval_masked.py); ``retrofit eval`` of a classifier, which has no
    language-model loss to score, asks for the long-document task it is measured on (tests/training/test_tasks.py
    measures one) instead of scoring it wrong."""
    from retrofit.cli import main

    src = encoder(*ENCODERS["bert-mlm"])
    src.save_pretrained(tmp_path / "bert")
    assert main(["convert", str(tmp_path / "bert"), "--to", "alibi", "--out", str(tmp_path / "run")]) == 0
    saved = next(p for p in (tmp_path / "run").rglob("config.json")).parent
    back = retrofit.load(saved)
    assert type(back) is tf.BertForMaskedLM and retrofit.describe(back)["scheme"] == "alibi"
    encoder(*ENCODERS["bert-classifier"]).save_pretrained(tmp_path / "cls")
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "cls"), "--lengths", "1x"]) != 0
    assert (
        "pass --data with one of longdoc:mention, longdoc:both, longdoc:needle, longdoc:passkey, longdoc:context"
        in capsys.readouterr().err
    )


def test_a_classifier_from_a_masked_lm_checkpoint_reloads_as_the_classifier(tmp_path):
    """Its config still names the checkpoint's class (``BertForMaskedLM``): the saved model is what was converted."""
    encoder(*ENCODERS["bert-mlm"]).save_pretrained(tmp_path / "mlm")
    model = tf.BertForSequenceClassification.from_pretrained(tmp_path / "mlm", num_labels=3).eval()
    assert model.config.architectures == ["BertForMaskedLM"]
    retrofit.convert(model, "alibi")
    retrofit.save(model, tmp_path / "m")
    x, mask = batch(NATIVE)
    back = retrofit.load(tmp_path / "m")
    assert type(back) is tf.BertForSequenceClassification
    with torch.no_grad():
        assert torch.equal(back(x, attention_mask=mask).logits, model(x, attention_mask=mask).logits)


def gemma3_bidirectional():
    """EmbeddingGemma's layout: bidirectional layers, local ones with a window of 101 (its config: 200 / 2 + 1)."""
    torch.manual_seed(0)
    cfg = tf.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=200,
        layer_types=["sliding_attention", "full_attention"],
        use_bidirectional_attention=True,
        max_position_embeddings=512,
    )
    return tf.Gemma3ForCausalLM(cfg).eval()


def test_gemma3_bidirectional_window_is_its_own_past_the_probe_length():
    """EmbeddingGemma-style layers see |i - j| < W with W their module's width (its config halves it + 1): converted
    to its own rope, a 160-token input past a window of 101 gives back the original's logits."""
    model = gemma3_bidirectional()
    x = torch.randint(3, VOCAB, (1, 160), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(x).logits
        retrofit.convert(model, "rope")
        torch.testing.assert_close(model(x).logits, before, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("buckets", [5, 33])
def test_t5_on_an_encoder_takes_an_even_number_of_buckets(buckets):
    with pytest.raises(OptionError, match="must be even"):
        retrofit.convert(encoder(*ENCODERS["bert-mlm"]), "t5", num_buckets=buckets)


def test_a_bare_encoder_is_probed_on_its_hidden_states_and_reverts_its_buffers(monkeypatch):
    """An embedding model (``RobertaModel``: no head) passes the probe on its last hidden state; revert gives back
    its own ``position_ids`` buffer (one row per native position)."""
    monkeypatch.setattr(probe, "_PASSED", {})
    model = encoder(tf.RobertaConfig, tf.RobertaModel, {})
    rows = model.embeddings.position_ids.shape
    retrofit.convert(model, "alibi")
    assert probe._PASSED
    with torch.no_grad():
        assert model(batch(3 * NATIVE)[0]).last_hidden_state.shape[1] == 3 * NATIVE
    retrofit.revert(model)
    assert model.embeddings.position_ids.shape == rows


def test_the_probe_runs_past_a_window_so_a_wrong_window_rule_is_caught(monkeypatch):
    """The probe's input crosses every window up to 512 keys: one key too wide is refused, not converted."""
    from retrofit.adapters.llama import LlamaAdapter

    monkeypatch.setattr(probe, "_PASSED", {})
    wrong = LlamaAdapter._window

    def one_wider(self, i, attn=None):
        w = wrong(self, i, attn)
        return w + 1 if w else None

    monkeypatch.setattr(LlamaAdapter, "_window", one_wider)
    with pytest.raises(UnsupportedArchitectureError, match="lossless probe failed"):
        retrofit.convert(gemma3_bidirectional(), "rope")


@pytest.mark.slow
def test_a_converted_encoder_loads_through_each_auto_class_and_sentence_transformers(tmp_path):
    """Once ``import retrofit`` ran: ``AutoModelForMaskedLM`` gives the converted masked LM, ``AutoModel`` its
    encoder (a converted ``BertModel``), and sentence-transformers (its own API, a folder without modules.json:
    the encoder plus mean pooling) embeds a text three times the native length exactly as the encoder's
    hidden states averaged by hand; the wrong task's class is refused with the right one named."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from retrofit.cli import main

    from ..training.test_masked_lm import bert_folder

    src = bert_folder(tmp_path / "bert")
    assert main(["convert", str(src), "--to", "alibi", "--out", str(tmp_path / "run")]) == 0
    mlm = tf.AutoModelForMaskedLM.from_pretrained(tmp_path / "run")
    base = tf.AutoModel.from_pretrained(tmp_path / "run")
    assert type(mlm) is tf.BertForMaskedLM and type(base) is tf.BertModel
    assert retrofit.describe(mlm)["scheme"] == "alibi"
    st = sentence_transformers.SentenceTransformer(str(tmp_path / "run"), device="cpu")
    text = "the quick brown fox jumps over the lazy dog; " * 6
    ids = st.tokenizer(text, return_tensors="pt")
    assert ids["input_ids"].shape[1] > 3 * NATIVE, "the text must run past the native length"
    with torch.no_grad():
        hidden = base(**ids).last_hidden_state[0]  # (T, E)
    got = st.encode([text], convert_to_tensor=True)[0]
    torch.testing.assert_close(got, hidden.mean(0), atol=1e-5, rtol=1e-4)
    with pytest.raises(retrofit.foundation.errors.RetrofitError, match="AutoModelForMaskedLM"):
        tf.AutoModelForCausalLM.from_pretrained(tmp_path / "run")


@pytest.mark.parametrize("scheme", ["alibi", "t5"])
@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_a_padded_row_equals_itself_alone_and_revert_is_exact(name, scheme):
    """Past native, the right-padded row of a batch gives the logits it gives alone; revert gives back the
    original's logits and buffers."""
    model = encoder(*ENCODERS[name])
    x, mask = batch(2 * NATIVE)
    with torch.no_grad():
        before = model(x[:, :NATIVE]).logits
        retrofit.convert(model, scheme, **BOTH_WAYS[scheme])
        together = model(x, attention_mask=mask).logits
        alone = model(x[1:, :-5]).logits
        row = together[1, :-5] if together.dim() == 3 else together[1]  # a classifier: one row of labels
        torch.testing.assert_close(row, alone[0], atol=2e-5, rtol=1e-4)
        retrofit.revert(model)
        assert torch.equal(model(x[:, :NATIVE]).logits, before)
    assert not retrofit.describe(model)["converted"]
