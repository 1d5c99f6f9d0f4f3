"""Tiny random models, one factory per registered architecture (the meta-test checks coverage).

Each factory returns an eval-mode model whose native length is ``NATIVE`` positions."""

from __future__ import annotations

import torch
import transformers as tf

from retrofit.models.builtin import TINY_LLAMA

NATIVE = 32
VOCAB = 128


def _llama_like(config_cls, model_cls, **extra):
    def make():
        defaults = dict(
            vocab_size=VOCAB,
            **TINY_LLAMA,
            max_position_embeddings=NATIVE,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
        return model_cls(config_cls(**{**defaults, **extra})).eval()

    return make


def gpt2():
    cfg = tf.GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=NATIVE,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return tf.GPT2LMHeadModel(cfg).eval()


def gpt_neo():
    cfg = tf.GPTNeoConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        attention_types=[[["global", "local"], 1]],
        window_size=8,
        max_position_embeddings=NATIVE,
        intermediate_size=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return tf.GPTNeoForCausalLM(cfg).eval()


def opt():
    cfg = tf.OPTConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=128,
        max_position_embeddings=NATIVE,
        word_embed_proj_dim=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return tf.OPTForCausalLM(cfg).eval()


def gpt_neox():
    cfg = tf.GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=NATIVE,
        rotary_pct=0.25,
        initializer_range=0.05,  # sharper attention: a 4-dim rotary change is visible
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return tf.GPTNeoXForCausalLM(cfg).eval()


def gpt_bigcode():
    cfg = tf.GPTBigCodeConfig(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=NATIVE,
        multi_query=True,  # StarCoder 1's one key/value head
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return tf.GPTBigCodeForCausalLM(cfg).eval()


def _gptj_like(config_cls, model_cls):
    def make():
        cfg = config_cls(
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=NATIVE,
            rotary_dim=8,  # interleaved pairs over half of each 16-dim head
            n_inner=128,
            initializer_range=0.1,  # sharper attention: a rotary change is visible
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        return model_cls(cfg).eval()

    return make


def bert():
    """BERT as a decoder (``BertLMHeadModel``, is_decoder): causal attention read from its modules."""
    cfg = tf.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=NATIVE,
        is_decoder=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return tf.BertLMHeadModel(cfg).eval()


def bloom():
    """BLOOM: native ALiBi; its config names no length, so the tiny one states its native length."""
    cfg = tf.BloomConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        n_layer=2,
        n_head=4,
        seq_length=NATIVE,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return tf.BloomForCausalLM(cfg).eval()


def falcon(**extra):
    """Falcon: rotary by default, ALiBi with ``alibi=True``; multi-query unless the new decoder architecture."""
    cfg = tf.FalconConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=NATIVE,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **extra,
    )
    return tf.FalconForCausalLM(cfg).eval()


def mpt(**extra):
    """MPT: native ALiBi built for max_seq_len keys (the original cannot run past it)."""
    cfg = tf.MptConfig(
        **{"vocab_size": VOCAB, "d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": NATIVE, **extra}
    )
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = 1, 2, 0
    return tf.MptForCausalLM(cfg).eval()


def biogpt():
    """BioGPT: OPT's layout (a learned table with OPT's offset of 2) on the base model itself, scaled token
    embeddings; no adapter names it (claimed by structure)."""
    cfg = tf.BioGptConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=NATIVE,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return tf.BioGptForCausalLM(cfg).eval()


def bart_decoder():
    """BART's decoder as a causal LM: OPT's layout beside an encoder whose head count (16) its config's standard
    names report; the decoder's own is 4."""
    cfg = tf.BartConfig(
        vocab_size=VOCAB,
        d_model=64,
        encoder_layers=3,
        encoder_attention_heads=16,
        decoder_layers=2,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=NATIVE,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return tf.BartForCausalLM(cfg).eval()


# GPT-J and CodeGen with one rotary module (transformers 5.24; 5.2 rotates inside the attention, which the gptj
# adapter refuses by name): their tiny models exist only where the installed transformers has that layout
GPTJ_LAYOUT = hasattr(tf.models.gptj.modeling_gptj, "GPTJRotaryEmbedding")
UNAVAILABLE = set() if GPTJ_LAYOUT else {"gptj", "codegen"}

# model_type -> factory. Architecture adapters list several model types; each gets a model here.
TINY = {
    "bert": bert,
    "bloom": bloom,
    "falcon": falcon,
    "gpt2": gpt2,
    "gpt_bigcode": gpt_bigcode,
    "gpt_neo": gpt_neo,
    "opt": opt,
    "gpt_neox": gpt_neox,
    "llama": _llama_like(tf.LlamaConfig, tf.LlamaForCausalLM),
    "mpt": mpt,
    "mistral": _llama_like(tf.MistralConfig, tf.MistralForCausalLM, sliding_window=8),
    "qwen2": _llama_like(tf.Qwen2Config, tf.Qwen2ForCausalLM),
    "qwen3": _llama_like(tf.Qwen3Config, tf.Qwen3ForCausalLM, head_dim=16),
    "granite": _llama_like(tf.GraniteConfig, tf.GraniteForCausalLM),
    "olmo": _llama_like(tf.OlmoConfig, tf.OlmoForCausalLM),
    "olmo2": _llama_like(tf.Olmo2Config, tf.Olmo2ForCausalLM),
    "starcoder2": _llama_like(tf.Starcoder2Config, tf.Starcoder2ForCausalLM, sliding_window=8),
}
if GPTJ_LAYOUT:
    TINY.update(
        gptj=_gptj_like(tf.GPTJConfig, tf.GPTJForCausalLM), codegen=_gptj_like(tf.CodeGenConfig, tf.CodeGenForCausalLM)
    )

# scheme -> options used in the matrix: chosen so the converted model differs from the original
MATRIX_OPTIONS = {
    "alibi": {},
    "rope": {"scaling": "yarn", "factor": 2.0},
    "t5": {"num_buckets": 16, "max_distance": 64},  # 4x native (128) reaches the shared last bucket
    "shaw": {"max_distance": 48},  # clipped inside the 4x-native test
    "nope": {},
    "sinusoidal": {},
    "fire": {},  # threshold = native length: the 4x test runs with a growing normaliser
    "xl": {"init": "random"},  # zero (the default) would leave the positional terms out of the comparison
    "nezha": {"max_distance": 48},  # clipped inside the 4x-native test
    "extend": {"length": 4 * NATIVE, "init": "interpolate"},  # copy is exact below native: interpolate is live
}
ONLY_LEARNED_ABSOLUTE = ("extend",)  # schemes that stretch a learned table: the matrix runs them on those families


def ids(batch=1, length=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


def train_step(model, kernel: str, x):
    """One loss and backward of converted ``model`` on ``kernel`` (``set_kernel``): (loss, {name: gradient})."""
    from retrofit.patch.conversion import set_kernel

    set_kernel(model, kernel)
    model.zero_grad()
    loss = model(x, labels=x).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
