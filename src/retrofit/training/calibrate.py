"""``retrofit.calibrate``: train only a converted model's own position parameters to match the original at its native length.

``calibrate(model, teacher, data, tokenizer=...)`` minimises KL(original || converted), the next-token
distributions of the frozen unconverted model (``teacher``) against the converted one (a masked LM: their
predictions at the masked tokens of a seeded draw, BERT's rule, both reading the same masked block), on native-length
blocks of ``data`` (a ``retrofit.data.specs`` spec). Only the parameters of the scheme module
(``model.retrofit_positions``: T5/Shaw tables, FIRE's MLP, Transformer-XL's vectors, learned ALiBi slopes
(``learn_slopes=true``), QK-norm gains, a stretched table's rows) are trained; every other tensor is left
bit-identical. Before and after, the zero-shot ratio (perplexity of the converted model / perplexity of the
original, both at 1x the native length, non-overlapping windows) is measured as ``retrofit.evaluate`` measures
it (``scoring``: the same tokens, windows and masked draw) on held-out text that shares no document with ``data``.

The teacher is a frozen copy of the model taken before converting (``copy.deepcopy``): the one exact
way to get the original's distributions that costs one forward per step and the weights once more in
memory. Mixing the native mechanism back in (``native_fade``) keeps the new scheme on too, so it is
not the original; reverting and converting again every step would rebuild the scheme module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..foundation.errors import DataError, LengthError, OptionError
from ..foundation.schema import check_limits, field_help
from ..scoring.masking import IGNORE, masker_for, seed_of
from .recipe import CalibrateConfig

log = logging.getLogger(__name__)

_DEFAULTS = CalibrateConfig()  # one set of defaults: the recipe's convert.calibrate section
STEPS, LEARNING_RATE, BATCH_SIZE = _DEFAULTS.steps, _DEFAULTS.learning_rate, _DEFAULTS.batch_size
HELDOUT, BUDGET = _DEFAULTS.heldout, _DEFAULTS.budget
SEED = 0


def position_parameters(model) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of the converted model's scheme module (``retrofit_positions``): what calibration trains."""
    from ..patch.conversion import scheme_of

    return list(scheme_of(model).named_parameters())


def check_calibratable(model) -> None:
    """OptionError (exit 2) when the model's scheme has no position parameters."""
    from ..patch.conversion import scheme_of

    if position_parameters(model):
        return
    scheme = scheme_of(model)
    raise OptionError(
        f"nothing to calibrate: scheme {scheme.name!r} has no position parameters ({scheme.fixed_because}; "
        "qk_norm=true adds learned gains). Calibration trains only the scheme's own parameters."
    )


def _doc_hashes(docs) -> set[str]:
    return {hashlib.sha256(d.text.encode()).hexdigest() for d in docs}


def _documents(data, heldout, train_tokens: int, held_tokens: int):
    """The calibration and held-out documents (a Hub dataset streamed until it holds about twice the tokens
    each side reads), which must share none."""
    from ..scoring.tokens import resolve_documents

    train, _ = resolve_documents(data, max_tokens=2 * train_tokens)
    held, _ = resolve_documents(heldout, max_tokens=2 * held_tokens)
    shared = _doc_hashes(train) & _doc_hashes(held)
    if shared:
        raise DataError(
            f"calibration data {data!r} and held-out data {heldout!r} share {len(shared)} document(s): the "
            "before/after ratio must be read on text the calibration never saw (e.g. calibrate on "
            "shakespeare:train and hold out shakespeare:heldout)"
        )
    return train, held


def _blocks(tokenizer, docs, length: int, want: int) -> torch.Tensor:
    """Packed native-length blocks of the documents, tokenized in order until ``want`` blocks are there (a few
    hundred steps read a small part of a large corpus; the rest is not tokenized)."""
    from ..data.specs import tokenize_documents
    from .blocks import check_blocks, make_blocks

    ids, total = [], 0
    for d in docs:
        if total >= want * length:
            break
        ids += tokenize_documents(tokenizer, [d])
        total += len(ids[-1])
    blocks = make_blocks(ids, length, packing=True)
    if not len(blocks):
        total = sum(map(len, ids))
        raise LengthError(f"calibration needs blocks of the native length {length}; the data gives {total} tokens")
    check_blocks(blocks, ids, length, True, "calibration")
    return blocks


@dataclass(frozen=True)
class Pair:
    """The two models calibration reads: the converted ``model`` and the unconverted original (``teacher``), their
    ``tokenizer``, and whether progress bars show."""

    model: Any
    teacher: Any
    tokenizer: Any
    progress: bool = False


def zero_shot(pair: Pair, heldout_docs, length: int, budget: int, original: dict | None = None) -> dict:
    """ppl of ``model`` and of the original (``teacher``) at ``length`` on the held-out documents, read as
    ``retrofit eval`` reads them (its first ``budget`` tokens, non-overlapping windows; a masked LM: the masked
    tokens of its seeded draw); ``original``: a previous call's original row (same tokens). Both models are left
    in eval mode."""
    from ..foundation import task
    from ..scoring.tokens import build_stream, resolve_documents

    model, teacher, tokenizer, progress = pair.model, pair.teacher, pair.tokenizer, pair.progress
    docs, label = resolve_documents(heldout_docs)
    stream = build_stream(tokenizer, docs, label, budget, [length])
    models = [model] if original else [model, teacher]
    for m in models:
        m.eval()
    if task.of_model(model).name == "masked-lm":
        ppls, tokens, fingerprint = _masked_ppl(models, tokenizer, stream.ids[:-1], length, progress)
        fingerprint = f"{label}:{fingerprint}"
    else:
        ppls, tokens, fingerprint = _causal_ppl(models, stream, length, progress), stream.targets, stream.fingerprint
    orig = original or {"ppl": ppls[1], "tokens": tokens, "fingerprint": fingerprint}
    if fingerprint != orig["fingerprint"]:
        raise RuntimeError("the held-out tokens changed between the two evaluations")
    return {"ppl": ppls[0], "original": orig, "ratio": ppls[0] / orig["ppl"]}


def _causal_ppl(models, stream, length: int, progress: bool) -> list[float]:
    """Each model's perplexity over the stream's targets in non-overlapping windows of ``length``."""
    from tqdm.auto import tqdm

    from ..scoring.losses import nonoverlapping_nll

    with tqdm(total=len(models) * (stream.targets // length), disable=not progress, unit="window") as bar:
        return [math.exp(float(nonoverlapping_nll(m, stream.ids, length, on_window=bar.update).mean())) for m in models]


def _masked_ppl(models, tokenizer, ids: torch.Tensor, length: int, progress: bool) -> tuple[list[float], int, str]:
    """A masked LM's: each model's masked-token perplexity in windows of ``length`` on one seeded draw over
    ``ids`` (n,); the masked tokens, and the stream's tokens and draw (the held-out fingerprint's tail)."""
    from tqdm.auto import tqdm

    from ..scoring import masked

    vocab = models[0].get_input_embeddings().weight.shape[0]
    s = masked.masked_stream(ids, tokenizer, vocab, masked.RATE)
    with tqdm(total=len(models) * -(-ids.numel() // length), disable=not progress, unit="window") as bar:
        rows = [masked.summary(masked.full_nll(m, s, length, bar.update), s.chars_per_token) for m in models]
    return [r["ppl"] for r in rows], rows[0]["masked_tokens"], f"{ids.numel()}:{masked.SEED}"


@dataclass(frozen=True)
class RunOptions:
    """``calibrate``'s keywords beside its section's (``CalibrateConfig``): how this call runs, which no recipe
    section holds (a fine-tune passes its ``train.seed``)."""

    seed: int = field_help("Seeds the order of the blocks and a masked LM's draws.", SEED)
    progress: bool | None = field_help("Progress bars (None: as RETROFIT_PROGRESS says).", None)


OPTIONS = tuple(f.name for f in dataclasses.fields(CalibrateConfig) if f.name != "data")  # the section's keywords
# every keyword calibrate() takes in ``options``
KEYWORDS = OPTIONS + tuple(f.name for f in dataclasses.fields(RunOptions))


def calibrate(model, teacher, data, *, tokenizer, **options) -> dict:
    """Train ``model``'s position parameters (only them) for ``steps`` Adam steps on KL(teacher || model) over
    native-length blocks of ``data``; returns the record (also what ``retrofit convert --calibrate`` saves as
    ``calibrate.json``): the ratio to the original at 1x on ``heldout`` before and after, the KL per step,
    seconds. ``teacher``: the unconverted original (frozen here). ``data``/``heldout``: data specs or lists of
    ``Document``; they must share no document. Documents are tokenized in order until there are
    ``steps * batch_size`` blocks (each block is seen once; fewer blocks are cycled in seeded orders). Raises
    OptionError when there is nothing to calibrate.
    ``data`` may be the whole section (a ``CalibrateConfig``, the recipe's ``convert.calibrate``: what the fine-tune,
    the study and ``retrofit convert --calibrate`` pass). ``options``, keywords (``KEYWORDS``; any other is a
    TypeError naming them): the section's other keys (``steps``, ``learning_rate``, ``batch_size``, ``heldout``,
    ``budget``: ``OPTIONS``; their defaults and help the section's, set over ``data``'s when it is the section)
    and ``RunOptions``'s: ``seed`` (the blocks' order and a masked LM's draws; default 0) and ``progress`` (bars;
    default: as RETROFIT_PROGRESS says)."""
    from ..foundation.quiet import progress_bars
    from ..patch.conversion import describe, set_position_controls

    o, run = _options(data, options)
    data, seed = o.data, run.seed
    check_calibratable(model)
    check_limits(o, error=OptionError, key="calibrate: {}")
    progress = progress_bars() if run.progress is None else run.progress
    info = describe(model)
    length = info["native"]["length"]
    if info["max_length"]:
        length = min(length, info["max_length"])
    train_docs, held_docs = _documents(data, o.heldout, o.steps * o.batch_size * length, o.budget)
    blocks = _blocks(tokenizer, train_docs, length, o.steps * o.batch_size)
    device = next(model.parameters()).device
    teacher.to(device).eval().requires_grad_(False)
    set_position_controls(model)  # no offset, fade or override: the model as it will be used

    t0 = time.perf_counter()
    pair = Pair(model, teacher, tokenizer, progress)
    before = zero_shot(pair, held_docs, length, o.budget)
    eval_seconds = time.perf_counter() - t0
    log.info("calibrate: ratio to the original at 1x before: %.4f", before["ratio"])

    was_training = model.training
    fit = _fit(pair, blocks, o, seed, device)

    t2 = time.perf_counter()
    after = zero_shot(pair, held_docs, length, o.budget, original=before["original"])
    model.train(was_training)  # the evaluation leaves it in eval mode: the caller's mode back
    eval_seconds += time.perf_counter() - t2
    record = {
        "data": _label(data),
        "heldout": _label(o.heldout),
        "native_length": length,
        "blocks": len(blocks),
        "steps": o.steps,
        "batch_size": o.batch_size,
        "learning_rate": o.learning_rate,
        "seed": seed,
        "schedule": f"Adam, linear warmup {fit.warmup} steps, cosine to 10%",
        "parameters": fit.parameters,
        **_kl_fields(fit.losses),
        **_ppl_fields(before, after),
        "train_seconds": round(fit.seconds, 2),
        "train_cpu_seconds": round(fit.cpu_seconds, 2),
        "eval_seconds": round(eval_seconds, 2),
        "threads": torch.get_num_threads(),
    }
    log.info(
        "calibrate: %d steps in %.1f s, KL %.4f -> %.4f; ratio to the original at 1x %.4f -> %.4f",
        o.steps,
        fit.seconds,
        record["kl_first10"],
        record["kl_last10"],
        before["ratio"],
        after["ratio"],
    )
    return record


def _options(data, given: dict) -> tuple[CalibrateConfig, RunOptions]:
    """(the section: ``data``, or the recipe's defaults with ``data`` set, and the section's keywords ``given`` set
    over it; ``RunOptions``'s keywords ``given``); any other keyword is the TypeError of a call, naming the valid
    ones."""
    unknown = sorted(set(given) - set(KEYWORDS))
    if unknown:
        raise TypeError(
            f"calibrate() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"valid: {', '.join(KEYWORDS)}"
        )
    section = data if isinstance(data, CalibrateConfig) else dataclasses.replace(_DEFAULTS, data=data)
    section = dataclasses.replace(section, **{k: v for k, v in given.items() if k in OPTIONS})
    return section, RunOptions(**{k: v for k, v in given.items() if k not in OPTIONS})


def write_record(acc, out, record: dict) -> None:
    """A fine-tune's calibration record: the main process writes ``calibrate.json`` and says the summary line."""
    import json

    from ..foundation import run_folder
    from ..foundation.atomic import write_text

    if acc.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / run_folder.CALIBRATE, json.dumps(record, indent=2) + "\n")
        log.info("%s", summary_line(record))


@dataclass(frozen=True)
class Fit:
    """What calibrating's optimizer steps leave: the trained parameters' sizes by name, the KL per step, the warmup,
    wall and CPU seconds."""

    parameters: dict[str, int]
    losses: list[float]
    warmup: int
    seconds: float
    cpu_seconds: float


def _fit(pair: Pair, blocks, o: CalibrateConfig, seed: int, device) -> Fit:
    """``o.steps`` Adam steps of the position parameters alone (every other parameter frozen, the model in eval
    mode) on KL(teacher || model) over ``blocks`` in seeded orders; requires_grad flags and mode put back."""
    from tqdm.auto import tqdm

    model, teacher, tokenizer, progress = pair.model, pair.teacher, pair.tokenizer, pair.progress
    steps, batch_size = o.steps, o.batch_size
    named = position_parameters(model)
    params = [p for _, p in named]
    trains = {id(p) for p in params}
    flags = [(p, p.requires_grad) for p in model.parameters()]
    was_training = model.training
    for p in model.parameters():
        p.requires_grad_(id(p) in trains)
    model.eval()  # no dropout: the converted model's distribution as it is used, against the original's
    optimizer = torch.optim.Adam(params, lr=o.learning_rate)
    warmup = max(1, min(10, steps // 10))
    schedule = torch.optim.lr_scheduler.LambdaLR(  # linear warmup, then cosine to 10% of the peak
        optimizer,
        lambda s: (
            (s + 1) / warmup
            if s < warmup
            else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup)))
        ),
    )
    order = _order(len(blocks), steps * batch_size, seed)
    masker = masker_for(model, tokenizer)  # a masked LM: its seeded draws; None for a causal LM
    losses: list[float] = []
    t1, c1 = time.perf_counter(), time.process_time()
    try:
        with tqdm(total=steps, disable=not progress, desc="calibrate", unit="step", dynamic_ncols=True) as bar:
            for step in range(steps):
                batch = blocks[order[step * batch_size : (step + 1) * batch_size]].to(device)
                loss = _kl_step(model, teacher, batch, masker, seed_of(seed, step))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
                losses.append(loss.item())
                bar.update(1)
                bar.set_postfix(kl=f"{losses[-1]:.4f}")
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was_training)
    seconds, cpu_seconds = time.perf_counter() - t1, time.process_time() - c1
    return Fit({name: p.numel() for name, p in named}, losses, warmup, seconds, cpu_seconds)


def _kl_fields(losses: list[float]) -> dict:
    """The record's KL: the mean of the first and of the last ten steps, and every step's (rounded)."""
    head = losses[: min(10, len(losses))]
    tail = losses[-min(10, len(losses)) :]
    return {
        "kl_first10": sum(head) / len(head),
        "kl_last10": sum(tail) / len(tail),
        "kl": [round(x, 6) for x in losses],
    }


def _ppl_fields(before: dict, after: dict) -> dict:
    """The record's held-out measure: its tokens, the original's perplexity, the converted model's and the ratio
    before and after."""
    return {
        "heldout_tokens": before["original"]["tokens"],
        "heldout_fingerprint": before["original"]["fingerprint"],
        "ppl_original": before["original"]["ppl"],
        "ppl_before": before["ppl"],
        "ppl_after": after["ppl"],
        "ratio_before": before["ratio"],
        "ratio_after": after["ratio"],
    }


def _kl_step(model, teacher, batch: torch.Tensor, masker, draw: int) -> torch.Tensor:
    """KL(original || converted) on one batch (B, T): a causal LM's next-token distributions at every token; a
    masked LM's predictions at the masked tokens of one seeded draw, both models reading the same masked block."""
    if masker is None:
        with torch.no_grad():
            target = teacher(input_ids=batch, use_cache=False).logits  # (B, T, V)
        return kl_to_original(model(input_ids=batch, use_cache=False).logits, target)
    inputs, labels = masker(batch, draw)
    chosen = labels != IGNORE  # (B, T)
    with torch.no_grad():
        target = teacher(input_ids=inputs).logits[chosen]  # (masked, V)
    return kl_to_original(model(input_ids=inputs).logits[chosen], target)


def kl_to_original(logits: torch.Tensor, original_logits: torch.Tensor) -> torch.Tensor:
    """KL(original || converted) per token, summed over the vocabulary, averaged over tokens (temperature 1)."""
    from .teacher import kl_sum

    return kl_sum(logits, original_logits, 1.0) / logits.shape[:-1].numel()


def _order(n: int, count: int, seed: int) -> torch.Tensor:
    """``count`` block indices: seeded permutations of ``range(n)``, one after another."""
    g = torch.Generator().manual_seed(seed)
    perms = [torch.randperm(n, generator=g) for _ in range(-(-count // n))]
    return torch.cat(perms)[:count]


def _label(data) -> str | list:
    if isinstance(data, str):
        return data
    if isinstance(data, Sequence) and all(isinstance(x, str) for x in data):
        return list(data)
    return f"{len(data)} documents"


def summary_line(record: dict) -> str:
    return (
        f"calibrated {sum(record['parameters'].values()):,} position parameters in {record['steps']} steps "
        f"({record['train_seconds']:.1f} s): KL {record['kl_first10']:.4f} -> {record['kl_last10']:.4f}; "
        f"ppl / original's at 1x on {record['heldout']}: {record['ratio_before']:.4f} -> {record['ratio_after']:.4f}"
    )
