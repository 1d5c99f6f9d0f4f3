"""Shared helpers for the evaluation tests: an offline byte-level tokenizer and tiny random models."""

from __future__ import annotations

import functools

import torch

from retrofit.data.specs import Document
from retrofit.models.builtin import TINY_LLAMA


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what the ByteLevel pre-tokenizer emits)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


@functools.lru_cache(maxsize=None)
def byte_tokenizer(eos: bool = True):
    """One token per byte (ids 0..255) plus ``<eos>`` (256): no download, digits are single tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    kw = {"eos_token": "<eos>"} if eos else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **kw)
    if eos:
        fast.add_special_tokens({"eos_token": "<eos>"})
    return fast


def tiny_gpt2(n_positions: int = 64, seed: int = 0, vocab_size: int = 260):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        n_positions=n_positions,
        vocab_size=vocab_size,
        bos_token_id=256,
        eos_token_id=256,
    )
    return GPT2LMHeadModel(cfg).eval()


def tiny_llama(max_len: int = 64, seed: int = 1, vocab_size: int = 260):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        **TINY_LLAMA,
        max_position_embeddings=max_len,
        vocab_size=vocab_size,
        bos_token_id=256,
        eos_token_id=256,
        pad_token_id=None,
    )
    return LlamaForCausalLM(cfg).eval()


TEXT = (
    "Every model in the run is scored on exactly the same tokens, at every length. "
    "The quick brown fox jumps over the lazy dog 0123456789 times. "
)


def docs(n: int = 6, reps: int = 6) -> list[Document]:
    """Deterministic documents (about n * reps * 140 bytes)."""
    return [Document(f"doc{i}", f"Document {i}. " + TEXT * reps) for i in range(n)]
