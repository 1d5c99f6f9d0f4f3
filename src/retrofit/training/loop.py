"""The one fine-tune loop, in the canonical Accelerate shape.

``finetune(recipe)`` runs unchanged in one process or under ``accelerate launch`` (DDP, FSDP,
DeepSpeed; CPU processes over gloo). Order of work:

1. validate the recipe, resolve the documents or open the stream (missing dataset/field fails here);
2. load the model; keep a frozen copy as distillation teacher; convert; wrap (LoRA/full) --
   unmatched LoRA targets fail here;
3. tokenize and cut blocks -- a block length larger than the documents fails here; a stream is
   tokenized and packed as it is read (``stream.py``), each process reading its own part;
4. ``prepare``; resume (``load_state``) from the latest checkpoint when asked;
5. train: ``accumulate`` / ``backward`` / clip / step, checkpoints with ``save_state``;
6. write ``final/`` (merged, patched, through ``retrofit.save``) and ``adapter/`` (LoRA).
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ..data import specs as rdata
from ..foundation import run_folder as rf
from ..foundation.atomic import check_creatable, write_text
from ..foundation.errors import LengthError, RecipeError
from ..foundation.quiet import hushed, progress_bars
from ..foundation.versions import library_versions
from ..models import sources
from ..patch.conversion import describe, max_length, set_position_controls
from ..patch.optim import param_groups
from ..scheme import SCHEMES
from ..scoring import masking
from ..scoring.masking import Masker, masker_for, seed_of
from . import blocks as blk
from . import copies, outputs, positions, preflight, sharding, stream, tasks
from . import model as mdl
from .interrupt import Interrupts
from .meter import Meter
from .place import StreamPlace, block_batches
from .recipe import Recipe, budget, tokens_per_step
from .teacher import Clock, TeacherView, distill_kl, masked_distill_kl

log = logging.getLogger(__name__)


class Progress:
    """Loop state saved with every checkpoint (``register_for_checkpointing``)."""

    def __init__(self):
        self.step = 0
        self.val_loss_before = None
        self.stream = None  # streaming: every process's stream.Position, [[epoch, document, offset], ...]

    def state_dict(self):
        return {"step": self.step, "val_loss_before": self.val_loss_before, "stream": self.stream}

    def load_state_dict(self, state):
        self.step, self.val_loss_before = state["step"], state["val_loss_before"]
        self.stream = state.get("stream")


def finetune(recipe, overrides: list[str] | dict | None = None) -> Path:
    """Fine-tune as a recipe (a YAML path, a dict or a Recipe) says; return the output folder.

    ``overrides``: ``["train.steps=200", ...]`` applied on top (values parsed as YAML).
    The merged, patched model is in ``<output_dir>/final`` (read it with ``retrofit.load``).
    Library messages that are harmless here (``retrofit.foundation.quiet.HARMLESS``) are kept quiet.
    """
    with hushed("shared_tensor", "loss_type", "gradient_checkpointing_name"):
        return _finetune(Recipe.coerce(recipe, overrides))


def _finetune(r: Recipe) -> Path:
    out = Path(r.output_dir)
    check_creatable(out, "output_dir")  # before anything is loaded or trained
    sources.precheck(r.model.name_or_path, r.model.gguf_file)  # a missing or uncached model: before the data
    preflight.check(r)  # the model's config and the first records against the recipe: before any weights load
    acc = _accelerator(r)
    from accelerate.utils import set_seed

    set_seed(r.train.seed)
    source = tasks.stream_of(r)  # opened and probed here: a missing dataset, file or field fails now
    train_docs, val_docs = _documents(r) if source is None and r.task is None else (None, None)
    _budget(r, acc, source)
    sharding.mark_baseline()
    with sharding.whole_models():
        with acc.main_process_first():
            model, tok = mdl.load(r.model, tasks.model_task(r, source))
        model.train()
        native = describe(model)["native"].get("length")
        view = TeacherView.of(r.train, r.data.block_length, native)  # a stride past native fails here
        calibrating = r.convert.calibrate.data is not None and not _resuming(r, out)
        needs_teacher = r.train.objective != "lm" or calibrating
        teacher = mdl.make_teacher(model, r.model) if needs_teacher else None
        mdl.convert(model, r.convert)
        mdl.set_attention_dropout(model, r.train)
        fade_offset_cap = _check_lengths(r, model)  # an impossible block fails before calibrating
        masker = tasks.objective(r, model) or _masker(r, model, tok)  # what the loss reads
        if calibrating:
            _calibrate(r, acc, out, model.to(acc.device), teacher.to(acc.device), tok)
        if r.train.objective == "lm":
            teacher = None  # the calibration's teacher only
        if r.train.gradient_checkpointing:
            model.config.use_cache = False
            mdl.enable_checkpointing(model)
        model = mdl.make_trainable(model, r.train)
    if r.task is not None:
        train_set, val_set = tasks.datasets(r, tok, acc.num_processes, source)
    elif source is None:
        train_set, val_set = _datasets(r, tok, train_docs, val_docs, acc)
    else:
        train_set, val_set = source, _stream_validation(r, tok, source)
    if acc.is_main_process:
        _write_run_info(r, out, model, train_set, val_set, acc.num_processes)
    handed = Handed(model, tok, teacher, view, fade_offset_cap, masker)
    out = _train(r, acc, handed, train_set, val_set)
    # Every tensor of the run goes before the process group does: gloo's threads must not hold any when
    # the interpreter finalises (a rank aborted at exit, "terminate called without an active exception").
    del model, teacher, handed, train_set, val_set
    acc.free_memory()  # the accelerator's references (prepared model, optimizer, loaders), then gc
    acc.wait_for_everyone()
    acc.end_training()
    return out


# ---- setup -------------------------------------------------------------------------------
def _resuming(r: Recipe, out: Path) -> bool:
    """A run that will load a checkpoint (its position parameters included): calibrating again is wasted."""
    if r.checkpoint.resume == "never":
        return False
    if r.checkpoint.resume != "auto" or outputs.checkpoints(out):
        log.info("convert.calibrate: not calibrating again, the run resumes from a checkpoint")
        return True
    return False


def _calibrate(r: Recipe, acc, out: Path, model, teacher, tok) -> None:
    """The recipe's ``convert.calibrate``: every process calibrates alike (same data, seed and order); the main
    one writes calibrate.json."""
    from .calibrate import calibrate, summary_line

    c = r.convert.calibrate
    record = calibrate(
        model,
        teacher,
        c.data,
        tokenizer=tok,
        steps=c.steps,
        learning_rate=c.learning_rate,
        batch_size=c.batch_size,
        heldout=c.heldout,
        budget=c.budget,
        seed=r.train.seed,
        progress=progress_bars() and acc.is_local_main_process,
    )
    if acc.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / rf.CALIBRATE, json.dumps(record, indent=2) + "\n")
        log.info("%s", summary_line(record))


def _masker(r: Recipe, model, tok) -> Masker | None:
    """The masked-LM objective for a masked LM (its task decides), None for a causal LM. Its distillation reads
    the original's masked predictions (``teacher.masked_distill_kl``), and so does its calibration."""
    masker = masker_for(model, tok, r.train.mask_rate)
    _say_copies(r, masker)
    if masker is None:
        return None
    log.info("objective: masked LM, %.0f%% of each block's tokens (80/10/10 mask/random/keep)", 100 * masker.rate)
    return masker


def _accelerator(r: Recipe):
    from accelerate import Accelerator
    from accelerate.utils import GradientAccumulationPlugin

    precision, why = mdl.mixed_precision(r)
    if why:
        log.warning(why)
    acc = Accelerator(
        cpu=_cpu_processes(),
        # "no" said explicitly when fp32 replaces an emulated bf16 (else a launch config's would come back)
        mixed_precision="no" if why else (None if precision == "no" else precision),
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=r.train.gradient_accumulation_steps, sync_with_dataloader=False
        ),
        project_dir=r.output_dir,
    )
    sharding.cpu_route(acc, precision)
    log.info("processes: %d (%s)", acc.num_processes, sharding.route(acc))
    return acc


def _cpu_processes() -> bool:
    """Several processes and no GPU: tell Accelerate to use CPU processes over gloo (it does not
    infer that under torchrun / ``accelerate launch --multi_gpu`` on a CPU-only machine)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    xpu = hasattr(torch, "xpu") and torch.xpu.is_available()
    return world > 1 and not torch.cuda.is_available() and not xpu


def _budget(r: Recipe, acc, source) -> None:
    """Resolve train.steps from data.max_tokens (the smaller bound wins) and say the arithmetic."""
    steps, _, words = budget(r, acc.num_processes)
    if steps < 1:
        raise LengthError(
            f"'data.max_tokens' = {r.data.max_tokens:,} is less than one step of "
            f"{tokens_per_step(r, acc.num_processes):,} tokens"
        )
    r.train.steps = steps
    log.info("budget: %s%s", words, f", streamed from {source.what}" if source is not None else "")


def _documents(r: Recipe):
    docs = blk.load_recipe_documents(r.data)
    return rdata.split_documents(docs, r.data.validation_fraction, seed=r.train.seed)


def _warn_if_offset_is_a_no_op(r: Recipe) -> None:
    """A uniform shift of every position cannot change a scheme whose scores depend only on i - j
    (measured: docs/finetune.md, "Position augmentation")."""
    from ..scheme.base import SCHEMES

    scheme = r.convert.scheme
    if r.train.positions.random_offset and scheme in SCHEMES and getattr(SCHEMES.get(scheme), "shift_invariant", False):
        log.warning(
            "train.positions.random_offset = %d has no effect on %r: its attention depends only on "
            "distances, and the offset shifts every position of a block alike (it matters only while "
            "native_fade_steps fades an absolute table out)",
            r.train.positions.random_offset,
            scheme,
        )


def _check_lengths(r: Recipe, model) -> int | None:
    """The block plus the largest offset must fit what the model accepts. While the native
    mechanism fades in, the native table bounds positions: returns the largest offset allowed
    then (offsets are clamped to it during the fade), or None when there is no fade."""
    pos, L = r.train.positions, r.data.block_length
    info = describe(model)
    limit = info.get("max_length")
    if pos.method != "none":
        if limit is not None and pos.target_length > limit:
            raise LengthError(
                f"'train.positions.target_length' = {pos.target_length} exceeds the {limit} positions the model accepts"
            )
        if SCHEMES.get(info["scheme"]).kind == "none":
            log.warning(
                "train.positions.method = %s has no effect on %r: it reads no positions", pos.method, info["scheme"]
            )
        log.info("positions: %s, blocks of %d spread over [0, %d)", pos.method, L, pos.target_length)
    if limit is not None and L + pos.random_offset > limit:
        # the scheme says how far it reads (Scheme.max_length(): a stretched table its rows, relative schemes
        # no limit); an unconverted model reads its native length
        reach = (
            f"the reach of scheme {info['scheme']!r}"
            if info["converted"]
            else "its native length; 'convert.scheme' reads further"
        )
        raise LengthError(
            f"'data.block_length' = {L} + 'train.positions.random_offset' = {pos.random_offset} exceeds the "
            f"{limit} positions the model accepts ({reach})"
        )
    if not pos.native_fade_steps:
        _warn_if_offset_is_a_no_op(r)
        return None
    fade_limit = max_length(model, fading=True)
    if fade_limit is not None and L > fade_limit:
        raise LengthError(
            f"'data.block_length' = {L} exceeds the {fade_limit} native positions; "
            "'train.positions.native_fade_steps' needs blocks the native mechanism can read"
        )
    return None if fade_limit is None else fade_limit - L


def _say_no_validation(d, val_docs) -> None:
    """Why this fine-tune has no validation loss: chosen (a warning when it was not)."""
    if d.validation_fraction == 0:
        log.info("no validation loss: data.validation_fraction is 0")
    elif not val_docs:
        log.warning(
            "no validation loss: too few documents to hold one out for validation (data.validation_fraction "
            "= %g); add documents",
            d.validation_fraction,
        )
    else:
        log.warning(
            "no validation loss: the validation documents give no block of %d tokens; raise "
            "data.validation_fraction or lower data.block_length",
            d.block_length,
        )


def _datasets(r: Recipe, tok, train_docs, val_docs, acc):
    d = r.data
    train_ids = rdata.tokenize_documents(tok, train_docs)
    train = blk.make_blocks(train_ids, d.block_length, d.packing)
    blk.check_blocks(train, train_ids, d.block_length, d.packing, "training")
    val = torch.empty(0, d.block_length, dtype=torch.long)
    if val_docs:
        val_ids = rdata.tokenize_documents(tok, val_docs)
        val = blk.make_blocks(val_ids, d.block_length, d.packing)[: d.max_validation_blocks]
    if not len(val):
        _say_no_validation(d, val_docs)
    need = r.train.batch_size * acc.num_processes
    if len(train) < need:
        raise LengthError(
            f"only {len(train)} training blocks of 'data.block_length' = {d.block_length}; "
            f"train.batch_size x processes needs {need}"
        )
    log.info("data: %d training blocks, %d validation blocks of %d tokens", len(train), len(val), d.block_length)
    return train, val


def _stream_validation(r: Recipe, tok, source):
    val = source.validation(tok, r.data.block_length, r.data.packing, r.data.max_validation_blocks)
    if not len(val) and r.data.validation_documents != 0:
        log.warning("no validation loss: the validation documents give no block of %d tokens", r.data.block_length)
    return val


def _write_run_info(r: Recipe, out: Path, model, train, val, processes: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / rf.RECIPE, r.to_yaml())  # resolved: train.steps as the budget sets it
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    info = {
        "versions": library_versions(),
        "trainable_parameters": trainable,
        "total_parameters": sum(p.numel() for p in model.parameters()),
        "validation_blocks": len(val),
    }
    if r.task is not None:
        info["task"] = r.task
    if r.task is not None and not isinstance(train, stream.StreamSource):
        info["train_examples"] = len(train)
    elif isinstance(train, stream.StreamSource):
        info.update(
            train_stream=train.what,
            validation_documents=train.validation_documents,
            budget_tokens=r.train.steps * tokens_per_step(r, processes),
        )
    else:
        info.update(
            train_blocks=len(train),
            train_fingerprint=rdata.fingerprint(train.flatten().tolist()),
            validation_fingerprint=rdata.fingerprint(val.flatten().tolist()),
        )
    write_text(out / rf.VERSIONS, json.dumps(info, indent=2) + "\n")


# ---- training ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Handed:
    """What ``_finetune`` hands the loop besides the recipe, the accelerator and the data: the model (converted,
    made trainable) and its tokenizer, the distillation teacher (or None) and how it reads a block, the cap on the
    random offset while the native mechanism fades in, and what the loss reads (a masker, a task's objective)."""

    model: Any
    tok: Any
    teacher: Any
    view: TeacherView
    fade_offset_cap: int | None
    masker: Any = None


@dataclass
class Steps:
    """What a training step's bookkeeping and the finish read: the recipe, the accelerator, the prepared model, the
    validation loader, the base model (its position controls), the loop state, the meter, the stream's place (or
    None) and what the loss reads."""

    r: Recipe
    acc: Any
    model: Any
    val_loader: Any
    base: Any
    progress: Progress
    meter: Meter
    where: StreamPlace | None = None
    masker: Any = None


def _train(r, acc, handed: Handed, train_set, val_set) -> Path:
    t, out = r.train, Path(r.output_dir)
    teacher, view, masker = handed.teacher, handed.view, handed.masker
    model, optimizer, train_loader, val_loader, scheduler, sampler = _prepare(r, acc, handed.model, train_set, val_set)
    if teacher is not None:
        teacher.to(acc.device)
    shards = sharding.sharded_parameters(model) if sharding.route(acc).startswith("fsdp2") else None
    if shards is not None:
        log.info("fsdp2: %d parameters sharded, unsharded: %s", shards["sharded"], shards["unsharded"] or "none")
    progress = Progress()
    acc.register_for_checkpointing(progress)
    outputs.resume(r, acc, out)
    if acc.is_main_process and progress.step:
        outputs.truncate_log(out, progress.step)
    base = mdl.base_model(acc.unwrap_model(model))
    clock = Clock(acc.device) if teacher is not None else None
    if teacher is not None:
        log.info("distillation teacher: %s per block of %d", view.describe(r.data.block_length), r.data.block_length)
    if progress.val_loss_before is None:
        progress.val_loss_before = _evaluate(acc, model, val_loader, base, r, masker)
        outputs.log_record(acc, out, {"step": 0, "val_loss": progress.val_loss_before})

    acc.step = progress.step * t.gradient_accumulation_steps  # micro-batches seen: where the data resumes
    where = StreamPlace(r, acc, progress) if sampler is None else None
    model.train()
    # What the optimizer steps is what gets clipped. Not model.parameters(): under FSDP2 a unit left
    # gathered after a forward (the tail: final norm, lm_head) lists its unsharded tensors there, whose
    # .grad stays None, and the clip norm would leave them out (measured: docs/finetune.md, "Sharded fine-tunes").
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    meter = Meter(r, acc, progress.step, clock, view)
    steps = Steps(r, acc, model, val_loader, base, progress, meter, where, masker)
    batches = block_batches(acc, train_loader, sampler) if where is None else where.batches(train_set, handed.tok)
    with Interrupts() as stop:  # Ctrl-C: a checkpoint at the step reached, then KeyboardInterrupt
        for batch in batches if progress.step < t.steps else ():
            drawn = _position_controls(base, r, progress.step, handed.fade_offset_cap)
            batch = _with_copies(r, acc, batch, drawn)
            with acc.accumulate(model):
                loss, parts = _loss(acc, model, teacher, batch, r, view, clock, masker)
                acc.backward(loss)
                meter.add(loss, parts)
                if acc.sync_gradients:
                    meter.grad_norm = sharding.clip_grad_norm(acc, params, t.max_grad_norm or float("inf"))
                    meter.lr = scheduler.get_last_lr()[0]
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if not acc.sync_gradients:
                continue
            progress.step += 1
            _after_step(steps)
            if stop.agreed(acc):
                _save_interrupted(r, acc, out, progress.step, where, meter)
            if progress.step >= t.steps:
                break
    if progress.step < t.steps:
        optimizer.zero_grad()  # a partial accumulation at the stream's end is not stepped
        where.say_short(progress.step, meter.tokens_per_step)
    meter.close()
    return _finish(steps, handed.tok, shards)


def _save_interrupted(r, acc, out: Path, step: int, where, meter) -> None:
    """Ctrl-C: a checkpoint at ``step`` (unless one was just written there), then KeyboardInterrupt."""
    meter.bar.close()
    if not (r.checkpoint.every and step % r.checkpoint.every == 0):
        if where is not None:
            where.save()
        outputs.save_checkpoint(acc, out, step, max(r.checkpoint.keep_last, 1))
    resumes = (
        "the same command resumes from it"
        if r.checkpoint.resume != "never"
        else (
            "this recipe has checkpoint.resume: never, so a re-run starts again; pass --set checkpoint.resume=auto "
            "to resume from it"
        )
    )
    log.warning(
        "interrupted after step %d of %d: saved %s; %s",
        step,
        r.train.steps,
        out / rf.CHECKPOINTS / f"step_{step:08d}",
        resumes,
    )
    raise KeyboardInterrupt


def _prepare(r, acc, model, train_set, val_set):
    """Loaders (seeded order; own generators), AdamW, schedule; all through ``accelerator.prepare``.
    A stream (``train_set`` a StreamSource) has no train loader: each process reads its own part."""
    from transformers import get_scheduler

    t = r.train
    streaming = isinstance(train_set, stream.StreamSource)
    sampler = None if streaming else blk.EpochShuffle(len(train_set), t.seed)
    # Each loader gets its own generator: a new iterator draws a seed from it, and drawing from the
    # global RNG would shift dropout after a resume.
    collate = getattr(train_set, "collate", None)  # a task's examples pad themselves; blocks are one tensor
    train_loader = (
        None
        if streaming
        else DataLoader(
            train_set if collate else blk.Blocks(train_set),
            batch_size=t.batch_size,
            sampler=sampler,
            drop_last=True,
            generator=torch.Generator().manual_seed(t.seed),
            collate_fn=collate,
        )
    )
    val_loader = DataLoader(
        val_set if collate else blk.Blocks(val_set),
        batch_size=t.batch_size,
        generator=torch.Generator().manual_seed(t.seed),
        collate_fn=collate,
    )
    optimizer = torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.learning_rate)
    scheduler = get_scheduler(  # a prepared scheduler steps once per process: scale like the HF examples
        t.lr_scheduler,
        optimizer,
        num_warmup_steps=t.warmup_steps * acc.num_processes,
        num_training_steps=t.steps * acc.num_processes,
    )
    if streaming:
        model, optimizer, val_loader, scheduler = acc.prepare(model, optimizer, val_loader, scheduler)
        return model, optimizer, None, val_loader, scheduler, None
    prepared = acc.prepare(model, optimizer, train_loader, val_loader, scheduler)
    return (*prepared, sampler)


def _after_step(s: Steps) -> None:
    r, acc, meter, where = s.r, s.acc, s.meter, s.where
    out, t, step = Path(r.output_dir), r.train, s.progress.step
    if step % t.log_every == 0 or step == t.steps:
        outputs.log_record(acc, out, meter.record(acc, step))
        meter.reset()
    meter.bar.update(meter.tokens_per_step)
    t0 = time.perf_counter()
    if t.eval_every and step % t.eval_every == 0 and step < t.steps:
        val = _evaluate(acc, s.model, s.val_loader, s.base, r, s.masker)
        outputs.log_record(acc, out, {"step": step, "val_loss": val})
    if r.checkpoint.every and step % r.checkpoint.every == 0:
        if where is not None:
            where.save()
        outputs.save_checkpoint(acc, out, step, r.checkpoint.keep_last)
    meter.skip(time.perf_counter() - t0)


def _finish(s: Steps, tok, shards=None) -> Path:
    """Validation after training, rank checksums, final/ + adapter/, summary.json."""
    r, acc, model, val_loader, base = s.r, s.acc, s.model, s.val_loader, s.base
    progress, meter, where, masker = s.progress, s.meter, s.where, s.masker
    out = Path(r.output_dir)
    _position_controls(base, r, None)
    val_after = _evaluate(acc, model, val_loader, base, r, masker)
    outputs.log_record(acc, out, {"step": progress.step, "val_loss": val_after})
    _rank_checksums(r, acc, base, where)
    heldout = _heldout(acc, model, val_loader, masker)
    peak = sharding.peak_memory_mib(acc)  # training's peak, before final/ is gathered and written
    outputs.write_final(r, acc, model, tok)
    if acc.is_main_process:
        summary = {
            "steps": progress.step,
            "resumed_from_step": meter.start_step,
            "val_loss_before": progress.val_loss_before,
            "val_loss_after": val_after,
            "train_seconds": round(meter.elapsed, 3),
            "tokens_per_s": round(
                meter.tokens_per_step * (progress.step - meter.start_step) / max(meter.elapsed, 1e-9), 1
            ),
            "num_processes": acc.num_processes,
            "route": sharding.route(acc),
            "final": str(out / rf.FINAL),
            "tokens": progress.step * meter.tokens_per_step,
            "budget_tokens": r.train.steps * meter.tokens_per_step,
            **({"stream_ended_early": where.short} if getattr(where, "short", None) else {}),
            "peak_memory_mib": peak,
            **(heldout or {}),
        }
        teacher = meter.teacher_summary(progress.step - meter.start_step)
        if teacher is not None:
            summary["teacher"] = teacher
            log.info(
                "teacher: %s, %.3g s/step (%.0f%% of the step)",
                meter.view.describe(r.data.block_length),
                teacher["seconds_per_step"],
                100 * teacher["share_of_step"],
            )
        if shards is not None:
            summary["parameters"] = shards
        write_text(out / rf.SUMMARY, json.dumps(summary, indent=2) + "\n")  # last: the fine-tune is complete
        log.info("done: %s; %s", _val_change(progress.val_loss_before, val_after), out / rf.FINAL)
    return out


def _rank_checksums(r, acc, base, where) -> None:
    """``train.rank_checksums``: a digest of this process's trainable weights (and of the stream blocks it read)."""
    if not r.train.rank_checksums:
        return
    d = Path(r.output_dir) / rf.RANK_CHECKSUMS
    d.mkdir(parents=True, exist_ok=True)
    write_text(d / f"rank{acc.process_index}.txt", mdl.trainable_hash(base) + "\n")
    if where is not None:  # the blocks this process read from the stream, one digest per line
        write_text(d / f"rank{acc.process_index}.blocks.txt", "".join(x + "\n" for x in where.seen))


def _heldout(acc, model, val_loader, objective) -> dict | None:
    """A classifier's accuracy and macro-F1, an embedding model's top-1, on the validation examples (said)."""
    if not isinstance(objective, tasks.Objective):
        return None
    metrics = objective.metrics(model, val_loader, acc.gather_for_metrics)
    log.info("held out: %s", ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
    return {"heldout": metrics}


def _val_change(before: float | None, after: float | None) -> str:
    if before is None and after is None:
        return "no validation loss (no validation blocks)"
    show = lambda v: "none" if v is None else f"{v:.4f}"  # noqa: E731
    return f"val loss {show(before)} -> {show(after)}"


def _loss(acc, model, teacher, batch, r, view: TeacherView, clock: Clock | None = None, masker=None):
    """(loss, {part: value}) for the recipe's objective; the teacher reads the block as ``view`` says. A masked
    LM (``masker``) reads its block with a draw of tokens masked (seeded by the micro-batch) and predicts those."""
    t = r.train
    if isinstance(masker, tasks.Objective):
        return masker.loss(model, batch), {}
    if masker is not None:
        inputs, labels = masker(batch, seed_of(t.seed, acc.step, acc.process_index))
        outputs = model(input_ids=inputs, labels=labels)
        if teacher is None:
            return outputs.loss, {}
        kd = masked_distill_kl(outputs.logits, teacher, inputs, labels, view, t.temperature, acc.autocast, clock)
        return _mix(t, outputs.loss, kd)
    if t.objective == "distill":
        batch = batch[:, : view.student_length(batch.shape[1])]
    labels = batch if t.objective != "distill" else None
    outputs = model(input_ids=batch, labels=labels)
    if teacher is None:
        return outputs.loss, {}
    kd = distill_kl(outputs.logits, teacher, batch, view, t.temperature, acc.autocast, clock)
    return _mix(t, outputs.loss, kd)


def _mix(t, lm_loss, kd):
    """(loss, parts) of the objective: the distillation term alone, or the model's loss plus its weight of it."""
    if t.objective == "distill":
        return kd, {"distill_loss": kd}
    return lm_loss + t.distill_weight * kd, {"lm_loss": lm_loss, "distill_loss": kd}


def _copies_target(r: Recipe) -> int:
    """The length ``data.copies`` draws distances up to by default: the positions' target, else the block."""
    return r.train.positions.target_length or r.data.block_length


def _say_copies(r: Recipe, masker) -> None:
    """``data.copies``: refused for a masked LM, else said before training."""
    cp = r.data.copies
    if not cp.spans:
        return
    if masker is not None:
        raise RecipeError("'data.copies' places retrieval targets for a causal LM; this model is a masked LM")
    lo, hi = copies.distance_range(cp, _copies_target(r))
    log.info(
        "data.copies: up to %d spans of %d tokens a block, copied %d-%d positions later (drawn uniformly)",
        cp.spans,
        cp.span_length,
        lo,
        hi,
    )


def _with_copies(r, acc, batch, drawn):
    """``batch`` (B, L) with ``data.copies`` retrieval targets placed at distances in the block's positions
    ``drawn`` (None: 0..L-1); as it was when the option is off."""
    cp = r.data.copies
    if not cp.spans:
        return batch
    seed = seed_of(r.train.seed + 2, acc.step, acc.process_index)
    placed, _ = copies.place(batch.cpu(), drawn, cp, _copies_target(r), seed)
    return placed.to(batch.device)


def _position_controls(base, r, step: int | None, fade_offset_cap: int | None = None):
    """Random offset and native fade for this step (same on every process and on resume);
    ``step=None`` resets both. Returns the positions drawn by ``train.positions.method`` (else None)."""
    pos = r.train.positions
    if not (pos.random_offset or pos.native_fade_steps or pos.method != "none"):
        return None
    if step is None:
        set_position_controls(base)
        return None
    if pos.method != "none":
        drawn = positions.draw(pos.method, r.data.block_length, pos.target_length, pos.pose_chunks, r.train.seed, step)
        set_position_controls(base, positions=drawn)
        return drawn
    offset = random.Random(r.train.seed * 1_000_003 + step).randint(0, pos.random_offset) if pos.random_offset else 0
    fade = max(0.0, 1.0 - step / pos.native_fade_steps) if pos.native_fade_steps else 0.0
    if fade > 0 and fade_offset_cap is not None:
        offset = min(offset, fade_offset_cap)
    set_position_controls(base, offset=offset, native_fade=fade)


@torch.no_grad()
def _evaluate(acc, model, loader, base, r, masker=None) -> float | None:
    """Mean per-block next-token loss over the validation blocks (all processes, no duplicates); a masked LM's
    masked-token loss, each block masked alike at every evaluation."""
    if len(loader.dataset) == 0:
        return None
    _position_controls(base, r, None)
    model.eval()
    losses = []
    for i, batch in enumerate(loader):
        if isinstance(masker, tasks.Objective):
            per = masker.per_example(model, batch)
        elif masker is not None:
            inputs, labels = masker(batch, seed_of(r.train.seed + 1, i, acc.process_index))  # (B, T) each
            logits = model(input_ids=inputs).logits.float()
            nll = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", ignore_index=masking.IGNORE)
            per = nll.sum(1) / (labels != masking.IGNORE).sum(1).clamp(min=1)
        else:
            logits = model(input_ids=batch).logits[:, :-1].float()
            per = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none").mean(1)
        losses.append(acc.gather_for_metrics(per))
    model.train()
    return torch.cat(losses).mean().item()
