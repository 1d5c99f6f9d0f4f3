"""Recall: copy a random span of tokens seen earlier in the context (an induction test).

Passkey asks a model to follow an instruction and read out a number, which models of a few million
parameters cannot do even at their native length. Recall asks only for copying, the behaviour of
induction heads (Olsson et al., 2022). Each trial of length ``L`` is, in tokens:

    [BOS] <text> <span: k random tokens> <text> <the span's first m tokens> | <the span's last k - m tokens>
    '----------- filler of the eval text, the span at depth d -----------'   '------ continuation ------'

* **The span** is ``k`` (``span``) random token ids, drawn uniformly, with replacement, from the distinct
  non-special tokens of the eval text. Random order: no language knowledge predicts it, only copying
  does. The pool is the eval text's tokens rather than the whole vocabulary so that every token is one
  the model was trained on (a vocabulary also holds tokens no training text reached, whose
  embeddings are noise: a failure to copy those says little about positions).
* **The filler** is a window of the eval text (the tokens the perplexity rows score) at a seeded
  offset; the span is inserted at depth ``d`` of it (0 = first, 1 = just before the cue).
* **The cue** is the span's first ``m`` (``cue``) tokens, at the very end; the model must continue with the
  other ``k - m``.

Scoring takes **one forward pass** over the whole ``L`` tokens (prompt and continuation), teacher
forced: at each continuation position, the argmax given the true previous tokens, and the
log-probability of the true token. Greedy decoding produces the same tokens as these argmaxes for as
long as every earlier one was right, so "every argmax right" (``exact``) is exactly "greedy decoding
produces the whole continuation": the exact-match accuracy equals greedy generation's at the cost of
one forward instead of ``k - m``. ``token_accuracy`` (share of continuation tokens whose teacher-forced
argmax is right) and ``mean_logprob`` (mean log-probability per continuation token, natural log) are
graded measures beside it: they still move when no trial is exactly right.

Trials are paired: trial ``j`` of every cell (every model, length and depth) copies the same span,
so the cells differ only in where it sits and how much text surrounds it.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass

import torch

from ..foundation.errors import LengthError, OptionError
from ..scoring.tokens import first_tokens
from .lengths import resolve as resolve_lengths
from .measure import Measure, Planned, Setup, check_depths, check_lengths, check_positive, check_supported
from .models import EvalModel
from .passkey import bos_prefix, cell, not_run


@dataclass(frozen=True)
class RecallPrompt:
    ids: list[int]  # [length]: prompt then continuation
    span: list[int]
    depth: float
    span_index: int  # where the span starts, in tokens
    cue: int  # m

    @property
    def continuation_start(self) -> int:
        """Index of the first continuation token (the model predicts it from the position before)."""
        return len(self.ids) - (len(self.span) - self.cue)


def token_pool(text_ids: list[int], tokenizer) -> list[int]:
    """The distinct non-special token ids of the eval text, sorted (the spans' alphabet)."""
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    pool = sorted(set(text_ids) - special)
    if len(pool) < 2:
        raise ValueError(f"the eval text has {len(pool)} distinct ordinary token(s); recall needs at least 2")
    return pool


def make_spans(seed: int, n: int, k: int, pool: list[int]) -> list[list[int]]:
    """``n`` reproducible spans of ``k`` tokens drawn uniformly (with replacement) from ``pool``."""
    rng = random.Random(f"recall-spans:{seed}")
    return [[rng.choice(pool) for _ in range(k)] for _ in range(n)]


def offsets(seed: int, length: int, n: int, filler: int, available: int) -> list[int]:
    """Where each trial's filler starts in the eval text (``filler`` tokens of ``available``)."""
    rng = random.Random(f"recall-offsets:{seed}:{length}")
    return [rng.randrange(0, available - filler + 1) for _ in range(n)]


def room(tokenizer, span: int) -> int:
    """The shortest length a recall prompt fits in: BOS (when the tokenizer adds one), span and its repeat."""
    return len(bos_prefix(tokenizer)) + 2 * span


@dataclass(frozen=True)
class Layout:
    """What every recall prompt of a run shares: the ``cue`` (the span's first tokens, given before the rest is
    scored) and the ``prefix`` that opens the sequence (a BOS)."""

    cue: int
    prefix: tuple[int, ...] = ()


def build(text_ids: list[int], length: int, depth: float, span: list[int], offset: int, layout: Layout) -> RecallPrompt:
    """A recall sequence of exactly ``length`` tokens, its filler read from ``text_ids[offset:]`` (see the module
    docstring)."""
    cue, prefix = layout.cue, layout.prefix
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    if not 0 < cue < len(span):
        raise ValueError(f"the cue must be shorter than the span and at least 1 token: cue {cue}, span {len(span)}")
    n = length - len(prefix) - 2 * len(span)
    if n < 0:
        raise ValueError(
            f"a recall prompt with a {len(span)}-token span needs at least {length - n} tokens, got length {length}"
        )
    if offset + n > len(text_ids):
        raise ValueError(f"the eval text has {len(text_ids)} tokens; a filler of {n} from {offset} does not fit")
    filler = list(text_ids[offset : offset + n])
    cut = round(depth * n)
    before = list(prefix) + filler[:cut]
    ids = before + list(span) + filler[cut:] + list(span)
    return RecallPrompt(ids=ids, span=list(span), depth=depth, span_index=len(before), cue=cue)


def _keeps_logits(model) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def score(model, prompt: RecallPrompt) -> dict:
    """One teacher-forced forward: ``{"exact", "tokens_right", "tokens", "logprob"}`` (``logprob``: mean
    natural-log probability per continuation token)."""
    dev = next(model.parameters()).device
    x = torch.tensor([prompt.ids], device=dev)  # [1, L]
    start = prompt.continuation_start
    n = len(prompt.ids) - start  # continuation tokens
    kw = {"logits_to_keep": n + 1} if _keeps_logits(model) else {}
    with torch.inference_mode():
        logits = model(input_ids=x, **kw).logits[0]  # [L or n + 1, V]
    logits = logits[-(n + 1) : -1].float()  # [n, V]: the positions that predict the continuation
    target = x[0, start:]  # [n]
    right = logits.argmax(-1) == target
    logprob = logits.log_softmax(-1).gather(1, target[:, None])[:, 0]
    return {
        "exact": bool(right.all()),
        "tokens_right": int(right.sum()),
        "tokens": n,
        "logprob": round(float(logprob.mean()), 4),
    }


def run(models, text_ids: list[int], lengths, depths, o, bar) -> list[dict]:
    """Recall per (model, length, depth): exact-match accuracy (with its Wilson interval), per-token
    accuracy and mean log-probability of the continuation; lengths past a model's limit are not run.
    Every model sees the same sequences (``text_ids``: the eval text, in the shared tokenizer's ids).
    ``o``: the options (``recall_trials``, ``recall_span``, ``recall_cue``, ``seed``)."""
    trials, span, cue, seed = o.recall_trials, o.recall_span, o.recall_cue, o.seed
    pool = token_pool(text_ids, models[0].tokenizer)
    spans = make_spans(seed, trials, span, pool)
    prefix = bos_prefix(models[0].tokenizer)
    layout = Layout(cue, tuple(prefix))
    results = []
    for m in models:
        for L in lengths:
            starts = offsets(seed, L, trials, L - len(prefix) - 2 * span, len(text_ids))
            for d in depths:
                skipped = not_run(m, L, d, bar, trials)
                if skipped:
                    results.append({**skipped, "token_accuracy": None, "mean_logprob": None})
                    continue
                bar.set_description(f"{m.name[-24:]} recall L={L} depth={d:g}")
                scores = []
                for s, at in zip(spans, starts):
                    scores.append(score(m.model, build(text_ids, L, d, s, at, layout)))
                    bar.update(1)
                n_tokens = sum(x["tokens"] for x in scores)
                results.append(
                    {
                        **cell(m, L, d, sum(x["exact"] for x in scores), trials),
                        "token_accuracy": round(sum(x["tokens_right"] for x in scores) / n_tokens, 4),
                        "mean_logprob": round(sum(x["logprob"] for x in scores) / trials, 4),
                        "scores": [{k: x[k] for k in ("exact", "tokens_right", "logprob")} for x in scores],
                    }
                )
    return results


def check_room(m: EvalModel, length: int, span: int) -> None:
    need = room(m.tokenizer, span)
    if length < need:
        raise LengthError(f"recall length {length} is too short: a {span}-token span and its repeat take {need} tokens")


def eval_text(m: EvalModel, setup, o, longest: int, span: int, what: str | None = None) -> list[int]:
    """The eval text recall (and copy) draw fillers and spans from: the perplexity's tokens (``setup``'s documents,
    joined as the options ``o`` say), as many as the budget or the longest sequence asks for."""
    label = setup.label
    ids, _ = first_tokens(m.tokenizer, setup.docs, max(o.budget, longest) + 1, o.doc_separator)
    need = longest - room(m.tokenizer, span)  # filler tokens of the longest sequence
    if len(ids) < need:
        raise LengthError(
            f"{what or f'recall length {longest}'} is larger than the available text: {label!r} gives only "
            f"{len(ids)} tokens and it needs {need}; use shorter lengths (or --copy-distances), or more data"
        )
    return ids


def work(lengths: list[int], models: int, depths: list, trials: int) -> list[tuple[int, int]]:
    """(sequence length, forward passes) of the recall cells: the cost line's and the progress bar's."""
    return [(L, models * len(depths) * trials) for L in lengths]


def settings(lengths: list[int], depths: list, o, text: list[int] | None) -> dict:
    """The report's ``settings.recall``: what the measure ran with (``o``: the options; ``text``: its eval text)."""
    return {
        "lengths": lengths,
        "depths": depths,
        "trials": o.recall_trials,
        "span": o.recall_span,
        "cue": o.recall_cue,
        "text_tokens": len(text or []),
        "scoring": "teacher-forced argmax (one forward per trial)",
    }


class Recall(Measure):
    """Recall at ``recall_lengths`` (default: the lengths) x ``recall_depths``: a random span of the eval text
    continued from its first ``recall_cue`` tokens repeated at the end, teacher-forced (``retrofit eval --recall``)."""

    name = "recall"

    def asked(self, o) -> tuple | None:
        if not o.recall:
            return None
        check_positive(recall_trials=o.recall_trials, recall_span=o.recall_span, recall_cue=o.recall_cue)
        depths = check_depths(o.recall_depths, "recall")
        if not o.recall_cue < o.recall_span:
            raise OptionError(
                f"recall_cue ({o.recall_cue}) must be smaller than recall_span ({o.recall_span}): "
                "the model continues with the span's other tokens"
            )
        return check_lengths(o.recall_lengths, "recall lengths") if o.recall_lengths else None, depths

    def lengths(self, setup: Setup, asked) -> list[int]:
        items = asked[0]
        return resolve_lengths(items, setup.native, "recall lengths") if items else setup.lengths

    def check(self, setup: Setup, asked) -> None:
        if asked is not None:
            lengths = self.lengths(setup, asked)
            check_supported(setup.models[0], lengths, "recall lengths")
            check_room(setup.models[0], min(lengths), setup.o.recall_span)

    def plan(self, setup: Setup, asked) -> Planned:
        if asked is None:
            return Planned(settings={"recall": None})
        lengths, depths, o, m = self.lengths(setup, asked), asked[1], setup.o, setup.models[0]
        text = eval_text(m, setup, o, max(lengths), o.recall_span)
        return Planned(
            work=work(lengths, len(setup.models), depths, o.recall_trials),
            settings={"recall": settings(lengths, depths, o, text)},
            seeds={"recall": o.seed},
            state=(lengths, depths, text),
        )

    def run(self, setup: Setup, planned: Planned, bar) -> dict:
        lengths, depths, text = planned.state
        return {"recall": run(setup.models, text, lengths, depths, setup.o, bar)}

    def markdown(self, report, plots: dict) -> list[str]:
        from .markdown import recall_section

        return recall_section(report, plots)


MEASURE = Recall()
