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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ..foundation import run_folder
from ..foundation.atomic import check_creatable, write_text
from ..foundation.quiet import hushed, progress_bars
from ..models import sources
from ..patch.conversion import describe
from ..patch.optim import param_groups
from ..scoring import masking
from ..scoring.masking import Masker, masker_for, seed_of
from . import blocks, copies, outputs, preflight, sharding, stream, tasks
from .interrupt import Interrupts
from .meter import Meter
from .model import (
    base_model,
    convert,
    enable_checkpointing,
    load,
    make_teacher,
    make_trainable,
    mixed_precision,
    set_attention_dropout,
)
from .place import StreamPlace, block_batches
from .positions import Placer
from .recipe import Recipe, resolve_steps
from .teacher import Clock, Teacher, TeacherView, distill_kl, masked_distill_kl

log = logging.getLogger(__name__)


class Progress:
    """Loop state saved with every checkpoint (``register_for_checkpointing``)."""

    def __init__(self):
        self.step = 0
        self.val_loss_before = None
        self.stream = None  # streaming: every process's place in its stream, [[epoch, document, offset], ...]

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
    acc = _accelerator(r.train, r.output_dir)
    from accelerate.utils import set_seed

    set_seed(r.train.seed)
    source = tasks.stream_of(r)  # opened and probed here: a missing dataset, file or field fails now
    train_docs, val_docs = blocks.documents(r.data, r.train.seed) if source is None and r.task is None else (None, None)
    resolve_steps(r, acc.num_processes, None if source is None else source.what)
    sharding.mark_baseline()
    with sharding.whole_models():
        task = tasks.model_task(r, source)
        with acc.main_process_first():
            model, tok = load(r.model, task)
        model.train()
        native = describe(model)["native"].get("length")
        view = TeacherView.of(r.train, r.data.block_length, native, r.task)  # a stride past native fails here
        calibrating = r.convert.calibrate.data is not None and not outputs.resuming(r.checkpoint, out)
        needs_teacher = r.train.objective != "lm" or calibrating
        teacher = make_teacher(model, r.model, task) if needs_teacher else None
        convert(model, r.convert)
        set_attention_dropout(model, r.train)
        placer = Placer.of(r.train, r.data.block_length)
        placer.check(model, r.convert.scheme)  # an impossible block fails before calibrating
        masker = tasks.objective(r, model, tok) or _masker(
            model, tok, r.train.mask_rate, r.data.copies, placer.reach
        )  # what the loss reads
        if calibrating:
            from .calibrate import calibrate, write_record  # every process calibrates alike (same data, seed, order)

            bars = progress_bars() and acc.is_local_main_process
            pair = model.to(acc.device), teacher.to(acc.device)
            write_record(
                acc, out, calibrate(*pair, r.convert.calibrate, tokenizer=tok, seed=r.train.seed, progress=bars)
            )
        if r.train.objective == "lm":
            teacher = None  # the calibration's teacher only
        if r.train.gradient_checkpointing:
            model.config.use_cache = False
            enable_checkpointing(model)
        model = make_trainable(model, r.train)
    if r.task is not None:
        train_set, val_set = tasks.datasets(r, tok, acc.num_processes, source)
    elif source is None:
        train_set, val_set = blocks.datasets(
            r.data, tok, (train_docs, val_docs), r.train.batch_size * acc.num_processes
        )
    else:
        train_set, val_set = source, blocks.stream_validation(r.data, tok, source)
    if acc.is_main_process:
        outputs.write_run_info(r, out, model, train_set, val_set, acc.num_processes)
    handed = Handed(model, tok, teacher, view, placer, masker)
    out = _train(r, acc, handed, train_set, val_set)
    # Every tensor of the run goes before the process group does: gloo's threads must not hold any when
    # the interpreter finalises (a rank aborted at exit, "terminate called without an active exception").
    del model, teacher, handed, train_set, val_set
    acc.free_memory()  # the accelerator's references (prepared model, optimizer, loaders), then gc
    acc.wait_for_everyone()
    acc.end_training()
    return out


# ---- setup -------------------------------------------------------------------------------
def _masker(model, tok, mask_rate: float, copied, reach: int) -> Masker | None:
    """The masked-LM objective for a masked LM (its task decides), None for a causal LM; ``data.copies``
    (``copied``) said or refused for it. Its distillation reads the original's masked predictions
    (``teacher.masked_distill_kl``), and so does its calibration."""
    masker = masker_for(model, tok, mask_rate)
    copies.say(copied, masker, reach)
    if masker is None:
        return None
    log.info("objective: masked LM, %.0f%% of each block's tokens (80/10/10 mask/random/keep)", 100 * masker.rate)
    return masker


def _accelerator(t, output_dir: str):
    """The run's Accelerator for the ``train`` section ``t`` (precision, accumulation), its project ``output_dir``."""
    from accelerate import Accelerator
    from accelerate.utils import GradientAccumulationPlugin

    precision, why = mixed_precision(t)
    if why:
        log.warning(why)
    acc = Accelerator(
        cpu=sharding.cpu_processes(),
        # "no" said explicitly when fp32 replaces an emulated bf16 (else a launch config's would come back)
        mixed_precision="no" if why else (None if precision == "no" else precision),
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=t.gradient_accumulation_steps, sync_with_dataloader=False
        ),
        project_dir=output_dir,
    )
    sharding.cpu_route(acc, precision)
    log.info("processes: %d (%s)", acc.num_processes, sharding.route(acc))
    return acc


# ---- training ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Handed:
    """What ``_finetune`` hands the loop besides the recipe, the accelerator and the data: the model (converted,
    made trainable) and its tokenizer, the distillation teacher (or None) and how it reads a block, each step's
    placement of the blocks (a ``Placer``), and what the loss reads (a masker, a task's objective)."""

    model: Any
    tok: Any
    teacher: Any
    view: TeacherView
    placer: Placer
    masker: Any = None


@dataclass
class Steps:
    """What a training step's bookkeeping and the finish read: the recipe, the accelerator, the prepared model, the
    validation loader, the base model and its ``Placer``, the loop state, the meter, the stream's
    place (or None) and what the loss reads."""

    r: Recipe
    acc: Any
    model: Any
    val_loader: Any
    base: Any
    placer: Placer
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
    outputs.resume(r.checkpoint, acc, out)
    if acc.is_main_process and progress.step:
        outputs.truncate_log(out, progress.step)
    base = base_model(acc.unwrap_model(model))
    clock = Clock(acc.device) if teacher is not None else None
    distill = Teacher(teacher, view, t.temperature, acc.autocast, clock) if teacher is not None else None
    if teacher is not None:
        _say_teacher(r, view, masker)
    if progress.val_loss_before is None:
        handed.placer.apply(base, None)
        progress.val_loss_before = _evaluate(acc, model, val_loader, masker, t.seed)
        outputs.log_record(acc, out, {"step": 0, "val_loss": progress.val_loss_before})

    acc.step = progress.step * t.gradient_accumulation_steps  # micro-batches seen: where the data resumes
    where = StreamPlace(r, acc, progress) if sampler is None else None
    model.train()
    # What the optimizer steps is what gets clipped. Not model.parameters(): under FSDP2 a unit left
    # gathered after a forward (the tail: final norm, lm_head) lists its unsharded tensors there, whose
    # .grad stays None, and the clip norm would leave them out (measured: docs/finetune.md, "Sharded fine-tunes").
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    meter = Meter(r, acc, progress.step, clock, view)
    steps = Steps(r, acc, model, val_loader, base, handed.placer, progress, meter, where, masker)
    batches = block_batches(acc, train_loader, sampler) if where is None else where.batches(train_set, handed.tok)
    with Interrupts() as stop:  # Ctrl-C: a checkpoint at the step reached, then KeyboardInterrupt
        for batch in batches if progress.step < t.steps else ():
            drawn = handed.placer.apply(base, progress.step)
            seed = seed_of(t.seed + 2, acc.step, acc.process_index)
            batch = copies.added(r.data.copies, batch, drawn, handed.placer.reach, seed)
            with acc.accumulate(model):
                loss, parts = _loss(acc, model, batch, distill, t, masker)
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
                outputs.save_interrupted(r.checkpoint, acc, out, (progress.step, t.steps), where, meter)
            if progress.step >= t.steps:
                break
    if progress.step < t.steps:
        optimizer.zero_grad()  # a partial accumulation at the stream's end is not stepped
        where.say_short(progress.step, meter.tokens_per_step)
    meter.close()
    return _finish(steps, handed.tok, shards)


def _say_teacher(r, view: TeacherView, masker) -> None:
    """Which distillation runs: an embedding model's vectors of cut texts, or a language model's windows."""
    if isinstance(masker, tasks.Embedding):
        what = masker.teacher_reads(view.window)
        log.info("distillation teacher: %s (original positions), %s", r.model.name_or_path, what)
    else:
        log.info("distillation teacher: %s per block of %d", view.describe(r.data.block_length), r.data.block_length)


def _prepare(r, acc, model, train_set, val_set):
    """Loaders (seeded order; own generators), AdamW, schedule; all through ``accelerator.prepare``.
    A stream (``train_set`` a StreamSource) has no train loader: each process reads its own part."""
    from transformers import get_scheduler

    t = r.train
    streaming = isinstance(train_set, stream.StreamSource)
    sampler = None if streaming else blocks.EpochShuffle(len(train_set), t.seed)
    # Each loader gets its own generator: a new iterator draws a seed from it, and drawing from the
    # global RNG would shift dropout after a resume.
    collate = getattr(train_set, "collate", None)  # a task's examples pad themselves; blocks are one tensor
    train_loader = (
        None
        if streaming
        else DataLoader(
            train_set if collate else blocks.Blocks(train_set),
            batch_size=t.batch_size,
            sampler=sampler,
            drop_last=True,
            generator=torch.Generator().manual_seed(t.seed),
            collate_fn=collate,
        )
    )
    val_loader = DataLoader(
        val_set if collate else blocks.Blocks(val_set),
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
        s.placer.apply(s.base, None)
        val = _evaluate(acc, s.model, s.val_loader, s.masker, t.seed)
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
    s.placer.apply(base, None)
    val_after = _evaluate(acc, model, val_loader, masker, r.train.seed)
    outputs.log_record(acc, out, {"step": progress.step, "val_loss": val_after})
    if r.train.rank_checksums:
        outputs.rank_checksums(out, acc, base, where)
    heldout = outputs.heldout(acc, model, val_loader, masker)
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
            "final": str(out / run_folder.FINAL),
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
        write_text(out / run_folder.SUMMARY, json.dumps(summary, indent=2) + "\n")  # last: the fine-tune is complete
        log.info("done: %s; %s", outputs.val_change(progress.val_loss_before, val_after), out / run_folder.FINAL)
    return out


def _loss(acc, model, batch, teacher: Teacher | None, t, masker=None):
    """(loss, {part: value}) for the ``train`` section's objective (``t``); the teacher reads the block as its view
    says. A masked LM (``masker``) reads its block with a draw of tokens masked (seeded by the micro-batch) and
    predicts those."""
    if isinstance(masker, tasks.Objective):
        if teacher is None:
            return masker.loss(model, batch), {}
        return masker.distilled(model, batch, teacher, t.distill_weight if t.objective == "both" else None)
    if masker is not None:
        inputs, labels = masker(batch, seed_of(t.seed, acc.step, acc.process_index))
        outputs = model(input_ids=inputs, labels=labels)
        if teacher is None:
            return outputs.loss, {}
        kd = masked_distill_kl(outputs.logits, inputs, labels, teacher)
        return _mix(t, outputs.loss, kd)
    if t.objective == "distill":
        batch = batch[:, : teacher.view.student_length(batch.shape[1])]
    labels = batch if t.objective != "distill" else None
    outputs = model(input_ids=batch, labels=labels)
    if teacher is None:
        return outputs.loss, {}
    kd = distill_kl(outputs.logits, batch, teacher)
    return _mix(t, outputs.loss, kd)


def _mix(t, lm_loss, kd):
    """(loss, parts) of the objective: the distillation term alone, or the model's loss plus its weight of it."""
    if t.objective == "distill":
        return kd, {"distill_loss": kd}
    return lm_loss + t.distill_weight * kd, {"lm_loss": lm_loss, "distill_loss": kd}


@torch.no_grad()
def _evaluate(acc, model, loader, masker, seed: int) -> float | None:
    """Mean per-block next-token loss over the validation blocks (all processes, no duplicates); a masked LM's
    masked-token loss, each block masked alike at every evaluation (seeded by the run's ``seed``)."""
    if len(loader.dataset) == 0:
        return None
    model.eval()
    losses = []
    for i, batch in enumerate(loader):
        if isinstance(masker, tasks.Objective):
            per = masker.per_example(model, batch)
        elif masker is not None:
            inputs, labels = masker(batch, seed_of(seed + 1, i, acc.process_index))  # (B, T) each
            logits = model(input_ids=inputs).logits.float()
            nll = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", ignore_index=masking.IGNORE)
            per = nll.sum(1) / (labels != masking.IGNORE).sum(1).clamp(min=1)
        else:
            logits = model(input_ids=batch).logits[:, :-1].float()
            per = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none").mean(1)
        losses.append(acc.gather_for_metrics(per))
    model.train()
    return torch.cat(losses).mean().item()
