"""``evaluate()``: perplexity vs length, loss by position, passkey, recall and cost, for a
converted model and its baselines on exactly the same tokens."""

from __future__ import annotations

import datetime as _dt
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from ..foundation import run_folder as rf
from ..foundation import task
from ..foundation.errors import LengthError, OptionError
from ..scoring.copying import Probe
from ..scoring.losses import nonoverlapping_nll, sliding_nll
from ..scoring.masked import RATE as MASK_RATE
from ..scoring.tokens import build_stream, first_tokens, resolve_documents
from ..scoring.windows import sliding_window_count
from . import cost, longdoc, masked, records, retrieval
from . import passkey as pk
from . import recall as rc
from .cost import Meter
from .farcontext import far_context
from .lengths import parse_item
from .lengths import resolve as resolve_lengths
from .models import EvalModel, check_tokenizers, describe_model, resolve
from .options import DEFAULTS, ORIGINAL, QUICK, EvalOptions, eval_options, fitted_budget
from .perplexity import loss_by_position, summarize
from .report import SCHEMA_VERSION, Report, environment
from .verdict import verdict

log = logging.getLogger(__name__)
READS_DOCUMENTS = ("sequence-classification", "embeddings")  # models evaluated on documents (evaluation.longdoc)

PASSKEY_NEW_TOKENS = 8


@dataclass(frozen=True)
class Job:
    """One perplexity measurement: a model, a length and a method."""

    model: int  # index into the run's models
    length: int
    method: str  # "non-overlapping" | "sliding" | "native-window" (a sliding window of the native length)
    window: int
    stride: int | None
    note: str | None = None


def _check_lengths(lengths, what: str = "lengths") -> list:
    """Validated length items (token counts or ``"4x"`` multiples), before anything is loaded."""
    if isinstance(lengths, (int, str)):
        lengths = [lengths]
    if not lengths:
        raise OptionError(f"{what}: give at least one length")
    return [parse_item(x, what) for x in lengths]


def _check_options(budget, stride, batch_size, position_buckets, depths, trials, recall=None):
    """``recall``: (depths, trials, span, cue) when recall runs."""
    ints = [
        ("budget", budget),
        ("stride", stride),
        ("batch_size", batch_size),
        ("position_buckets", position_buckets),
        ("passkey_trials", trials),
    ]
    all_depths = [("passkey", depths)]
    if recall is not None:
        r_depths, r_trials, span, cue = recall
        ints += [("recall_trials", r_trials), ("recall_span", span), ("recall_cue", cue)]
        all_depths.append(("recall", r_depths))
    for name, v in ints:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise OptionError(f"{name} must be a positive integer, got {v!r}")
    for what, ds in all_depths:
        for d in ds:
            if not isinstance(d, (int, float)) or not 0.0 <= float(d) <= 1.0:
                raise OptionError(f"{what} depths must lie in [0, 1], got {d!r}")
    if recall is not None and not recall[3] < recall[2]:
        raise OptionError(
            f"recall_cue ({recall[3]}) must be smaller than recall_span ({recall[2]}): "
            "the model continues with the span's other tokens"
        )


def _within_limit(m: EvalModel, lengths: list[int]) -> list[int]:
    """The default lengths ``m`` runs plainly; those past its limit are dropped with a message."""
    limit = m.max_length
    kept, dropped = [L for L in lengths if L <= limit] or [limit], [L for L in lengths if L > limit]
    if dropped:
        what = "is not converted" if m.role == "original" else "is converted"
        log.warning(
            "%s %s (%s: at most %d tokens): the default lengths %s are not evaluated, only %s. Convert it "
            "to a scheme without that limit, or evaluate it as a baseline (it then gets sliding-window "
            "figures)",
            m.name,
            what,
            _mechanism(m),
            limit,
            ", ".join(map(str, dropped)),
            ", ".join(map(str, kept)),
        )
    return kept


def _mechanism(m: EvalModel) -> str:
    return m.info.get("scheme") or (m.info.get("native") or {}).get("kind") or "its positional mechanism"


def _check_supported(m: EvalModel, lengths: list[int], what: str) -> None:
    """The converted model must run every length plainly: a clear LengthError otherwise."""
    limit = m.max_length
    too_long = [L for L in lengths if limit is not None and L > limit]
    if too_long:
        raise LengthError(
            f"{what} {', '.join(map(str, too_long))} exceed what {m.name!r} supports ({_mechanism(m)}: at most {limit} "
            "tokens). Drop those lengths, convert to a scheme without a limit, or evaluate this model as a "
            "baseline (it then gets a sliding-window figure)."
        )


def plan_jobs(models: list[EvalModel], lengths: list[int], stride: int | None, sliding: bool) -> list[Job]:
    """Every (model, length, method) to score. Past a model's limit: a labelled sliding row, never a silent swap.
    ``stride`` None: each sliding window advances by half its width."""
    jobs = []
    given = stride
    for i, m in enumerate(models):
        limit, native = m.max_length, (m.info.get("native") or {}).get("length")
        for L in lengths:
            if limit is not None and L > limit:
                stride = given or max(1, limit // 2)
                if stride >= limit:
                    raise OptionError(f"stride {stride} must be smaller than {m.name!r}'s window {limit}")
                # the same words for every length past the limit: a table's footnote says it once
                note = (
                    f"{m.name} accepts at most {limit} tokens, so longer inputs are not run plainly: these rows "
                    f"are sliding-window evaluations (window {limit}, stride {stride})"
                )
                jobs.append(Job(i, L, "sliding", limit, stride, note))
                continue
            past = f"past the native length {native}" if native and L > native else None
            jobs.append(Job(i, L, "non-overlapping", L, None, past))
            stride = given or max(1, L // 2)
            if sliding and stride < L:
                jobs.append(Job(i, L, "sliding", L, stride, past))
            if past and m.role != "baseline":  # the far-context gain's other side (farcontext.py): one pass
                jobs.append(Job(i, L, "native-window", native, max(1, native // 2), None))
    return jobs


def _windows(job: Job, n: int) -> int:
    """Windows (model inputs) a job scores over ``n`` targets."""
    if job.method == "non-overlapping":
        return n // job.length
    return sliding_window_count(n, job.window, job.stride)


def _attention_path(model) -> str | None:
    d = describe_model(model)
    return d.get("attention_path") or getattr(model.config, "_attn_implementation", None)


def _device_of(model):
    return next(model.parameters()).device


def run_perplexity(models, jobs, stream, batch_size, buckets, bar) -> tuple[list, list, list, dict]:
    """Score every job; (rows, loss_by_position entries, cost entries, per-target NLL by (model index,
    method, length)). Same-window jobs share one pass."""
    cache: dict[tuple, tuple] = {}
    rows, positions, costs, scored = [], [], [], {}
    for job in jobs:
        m = models[job.model]
        key = (job.model, job.method, job.window, job.stride)
        reused = key in cache
        if not reused:
            bar.set_description(f"{m.name[-24:]} L={job.length} {job.method}")
            with Meter(_device_of(m.model)) as meter:
                if job.method == "non-overlapping":
                    nll = nonoverlapping_nll(
                        m.model, stream.ids, job.window, batch_size=batch_size, on_window=bar.update
                    )
                else:
                    nll = sliding_nll(m.model, stream.ids, job.window, job.stride, on_window=bar.update)
            cache[key] = (nll, meter.result(stream.targets), _attention_path(m.model), job.length)
        nll, cost, path, first_length = cache[key]
        scored[(job.model, job.method, job.length)] = nll
        rows.append(
            {
                "model": m.name,
                "role": m.role,
                "length": job.length,
                "method": job.method,
                "window": job.window,
                "stride": job.stride,
                **summarize(nll, job.length),
                "windows": _windows(job, stream.targets),
                "attention_path": path,
                "note": job.note,
            }
        )
        costs.append(
            {
                "model": m.name,
                "length": job.length,
                "method": job.method,
                "window": job.window,
                "stride": job.stride,
                "batch_size": batch_size if job.method == "non-overlapping" else 1,
                "same_pass_as_length": first_length if reused else None,
                **cost,
            }
        )
        if job.method == "non-overlapping":
            positions.append(
                {"model": m.name, "role": m.role, "length": job.length, **loss_by_position(nll, job.length, buckets)}
            )
    return rows, positions, costs, scored


def _not_run(m: EvalModel, L: int, d: float, bar, trials: int) -> dict | None:
    """The cell of a length past the model's limit (recorded as not run), else None."""
    if m.max_length is None or L <= m.max_length:
        return None
    bar.update(trials)
    return {
        "model": m.name,
        "role": m.role,
        "length": L,
        "depth": d,
        "trials": 0,
        "correct": 0,
        "accuracy": None,
        "note": f"not run: {m.name} accepts at most {m.max_length} tokens",
    }


def _cell(m: EvalModel, L: int, d: float, correct: int, trials: int) -> dict:
    """A retrieval cell's accuracy with its 95% Wilson interval."""
    low, high = pk.wilson(correct, trials)
    return {
        "model": m.name,
        "role": m.role,
        "length": L,
        "depth": d,
        "trials": trials,
        "correct": correct,
        "accuracy": correct / trials,
        "note": None,
        "ci_low": round(low, 4),
        "ci_high": round(high, 4),
    }


def run_passkey(models, lengths, depths, trials, seed, bar) -> list[dict]:
    """Accuracy per (model, length, depth); lengths past a model's limit are recorded as not run."""
    results = []
    keys = pk.make_keys(seed, len(lengths) * len(depths) * trials)
    for m in models:
        builder = pk.PromptBuilder(m.tokenizer)
        k = 0
        for L in lengths:
            for d in depths:
                cell_keys, k = keys[k : k + trials], k + trials
                skipped = _not_run(m, L, d, bar, trials)
                if skipped:
                    results.append(skipped)
                    continue
                answers = []
                bar.set_description(f"{m.name[-24:]} passkey L={L} depth={d:g}")
                for key in cell_keys:
                    prompt = builder.build(L - PASSKEY_NEW_TOKENS, d, key)
                    answers.append(pk.run_trial(m.model, m.tokenizer, prompt, PASSKEY_NEW_TOKENS))
                    bar.update(1)
                correct = sum(a["correct"] for a in answers)
                results.append(
                    {
                        **_cell(m, L, d, correct, trials),
                        "answers": [{"key": a["key"], "answer": a["answer"]} for a in answers],
                    }
                )
    return results


def run_recall(models, text_ids: list[int], lengths, depths, o, bar) -> list[dict]:
    """Recall per (model, length, depth): exact-match accuracy (with its Wilson interval), per-token
    accuracy and mean log-probability of the continuation; lengths past a model's limit are not run.
    Every model sees the same sequences (``text_ids``: the eval text, in the shared tokenizer's ids).
    ``o``: the options (``recall_trials``, ``recall_span``, ``recall_cue``, ``seed``)."""
    trials, span, cue, seed = o.recall_trials, o.recall_span, o.recall_cue, o.seed
    pool = rc.token_pool(text_ids, models[0].tokenizer)
    spans = rc.make_spans(seed, trials, span, pool)
    prefix = pk.bos_prefix(models[0].tokenizer)
    results = []
    for m in models:
        for L in lengths:
            starts = rc.offsets(seed, L, trials, L - len(prefix) - 2 * span, len(text_ids))
            for d in depths:
                skipped = _not_run(m, L, d, bar, trials)
                if skipped:
                    results.append({**skipped, "token_accuracy": None, "mean_logprob": None})
                    continue
                bar.set_description(f"{m.name[-24:]} recall L={L} depth={d:g}")
                scores = []
                for s, at in zip(spans, starts):
                    scores.append(rc.score(m.model, rc.build(text_ids, L, d, s, cue, at, prefix)))
                    bar.update(1)
                n_tokens = sum(x["tokens"] for x in scores)
                results.append(
                    {
                        **_cell(m, L, d, sum(x["exact"] for x in scores), trials),
                        "token_accuracy": round(sum(x["tokens_right"] for x in scores) / n_tokens, 4),
                        "mean_logprob": round(sum(x["logprob"] for x in scores) / trials, 4),
                        "scores": [{k: x[k] for k in ("exact", "tokens_right", "logprob")} for x in scores],
                    }
                )
    return results


LOAD_KEYS = ("tokenizer", "gguf_file", "device", "dtype")  # evaluate()'s keywords that say how to load a model


@dataclass
class Asked:
    """What each measure asked for, checked before anything is read (multiples of native resolved later)."""

    lengths: list
    passkey: list | None  # None: the perplexity lengths
    recall: list | None
    copy: list | None  # copy distances; None: none asked
    depths: list[float]  # passkey depths
    recall_depths: list[float]


@dataclass
class Plan:
    """One evaluation, resolved: the models, the tokens they all score, and each measure's lengths and text."""

    o: EvalOptions
    models: list[EvalModel]
    stream: object  # tokens.build_stream's: the perplexity's tokens
    jobs: list[Job]
    lengths: list[int]
    passkey_lengths: list[int]
    recall_lengths: list[int]
    copy_distances: list[int]
    asked: Asked
    recall_text: list[int] | None = None
    copy_text: list[int] | None = None
    copy_prefix: list[int] = ()

    def work(self) -> list[tuple[int, int]]:
        """(window length, forward passes) of every measure: what the cost line and the progress bar count."""
        o, n = self.o, len(self.models)
        work = [(j.window, _windows(j, self.stream.targets)) for j in _unique(self.jobs)]
        work += [
            (L, n * len(self.asked.depths) * o.passkey_trials) for L in (self.passkey_lengths if o.passkey else [])
        ]
        work += [
            (L, n * len(self.asked.recall_depths) * o.recall_trials) for L in (self.recall_lengths if o.recall else [])
        ]
        return work + [(d + o.copy_span, n * o.copy_trials) for d in self.copy_distances]


def evaluate(
    model_or_path,
    lengths: Sequence | None = None,
    data=None,
    baselines: Sequence = (),
    *,
    options: EvalOptions | None = None,
    out=None,
    progress: bool = True,
    **keywords,
) -> Report:
    """Evaluate a (converted) model and its baselines past the native length.

    ``model_or_path``: an ``nn.Module`` (with ``tokenizer=``), ``(model, tokenizer)``, or a path /
    hub id / retrofit checkpoint / ``.gguf`` file loaded with ``retrofit.load_model`` (``gguf_file=``:
    the GGUF file inside a folder; ``device=``, ``dtype=``). ``baselines``: the same forms (a baseline given
    as an ``nn.Module`` alone uses the model's tokenizer).

    The options (``retrofit.evaluation.options.EvalOptions``, their defaults and help in one place) are
    given as ``options=`` and/or as keywords (``budget=4096, passkey=True``); ``lengths`` and ``data`` may
    also be given by position. Left unset, ``lengths`` (1x-8x) stops at the model's limit.
    ``data``: a ``retrofit.models.data`` spec or a list of ``Document``, joined with EOS (or with the text
    ``doc_separator``, e.g. ``"\\n\\n"`` for wikitext's paragraph rows). Every model scores the same first
    ``budget`` tokens (cut to a multiple of the largest length) at every length, with
    non-overlapping windows and, when ``sliding``, sliding windows of stride ``stride``. A baseline
    past its own limit gets only the sliding row, labelled as such.

    ``passkey``: passkey retrieval at ``passkey_lengths`` (default: ``lengths``) x ``passkey_depths``.
    ``recall``: copy a ``recall_span``-token random span from depth d of the eval text when its first
    ``recall_cue`` tokens repeat at the end (``retrofit.evaluation.recall``), at ``recall_lengths``
    (default: ``lengths``) x ``recall_depths``, ``recall_trials`` sequences per cell. ``seed`` seeds both.

    All bad input raises a ``RetrofitError`` before any scoring. Writes report.json, report.md and
    plots to ``out`` when given. Returns the ``Report``.
    """
    started = _dt.datetime.now(_dt.timezone.utc)
    load = {k: keywords.pop(k) for k in LOAD_KEYS if k in keywords}
    o, default_lengths = _gather_options(options, lengths, data, keywords)
    asked = _asked(o)
    reads_records = records.is_source(o.data) or _task_of(model_or_path) in READS_DOCUMENTS
    docs, data_label = (
        (None, o.data)  # a classifier's or embedding model's documents: read once the tokenizer is known
        if reads_records
        else resolve_documents(o.data, max_tokens=2 * max(o.budget, 1 << 17))  # a Hub dataset: streamed
    )
    models = load_models(model_or_path, baselines, **load)
    if task.of_model(models[0].model).name in READS_DOCUMENTS:
        source = records.source_for(o.data, model_or_path, given=o.data != EvalOptions.data)
        return _long_documents(models, source, asked.lengths if not default_lengths else None, progress, out)
    native = (models[0].info.get("native") or {}).get("length")
    lengths = resolve_lengths(asked.lengths, native)
    if default_lengths and models[0].max_length:
        lengths = _within_limit(models[0], lengths)
    o = _fit_budget(o, lengths)
    if task.of_model(models[0].model).name == "masked-lm":
        return _masked(models, (docs, data_label), lengths, o, asked.copy, progress, out)
    plan = _plan(models, (docs, data_label), o, asked, lengths)
    log.info(
        "evaluating %d model(s) on %d tokens of %s at lengths %s", len(models), plan.stream.targets, data_label, lengths
    )
    _say_cost(models[0], plan.stream.ids, plan.work())
    results = _measure(plan, progress)
    report = Report(_report_data(plan, results, started))
    report.data["verdict"] = verdict(report.data)
    if out is not None:
        report.save(out)
    return report


def _gather_options(options, lengths, data, keywords) -> tuple[EvalOptions, bool]:
    """(the options from ``options=``, the positional lengths and data, and keywords; whether the lengths are
    the defaults, which then stop at the model's limit)."""
    given = {k: v for k, v in (("lengths", lengths), ("data", data)) if v is not None}
    o = eval_options(options, **given, **keywords)
    default_lengths = (
        "lengths" not in given
        and "lengths" not in keywords
        and (options is None or options.lengths == DEFAULTS.lengths)
    )
    return o, default_lengths


def _asked(o: EvalOptions) -> Asked:
    """Every measure's lengths and depths, checked (bad input is said before anything is read)."""
    asked = Asked(
        lengths=_check_lengths(o.lengths),
        passkey=_check_lengths(o.passkey_lengths, "passkey lengths") if o.passkey and o.passkey_lengths else None,
        recall=_check_lengths(o.recall_lengths, "recall lengths") if o.recall and o.recall_lengths else None,
        copy=_check_lengths(o.copy_distances, "copy distances") if o.copy else None,
        depths=[float(d) for d in o.passkey_depths],
        recall_depths=[float(d) for d in o.recall_depths] if o.recall else [],
    )
    recall = (asked.recall_depths, o.recall_trials, o.recall_span, o.recall_cue) if o.recall else None
    stride = 1 if o.stride is None else o.stride
    _check_options(o.budget, stride, o.batch_size, o.position_buckets, asked.depths, o.passkey_trials, recall)
    fitted_budget(o, 1)  # a bad budget_windows is said before anything is read
    return asked


def _plan(models: list[EvalModel], data: tuple, o: EvalOptions, asked: Asked, lengths: list[int]) -> Plan:
    """The resolved evaluation of a causal LM: each measure's lengths checked against the model, the tokens
    every model scores, the windows to score, and the text recall and retrieval draw from."""
    docs, label = data
    m, native = models[0], (models[0].info.get("native") or {}).get("length")
    pk_lengths = resolve_lengths(asked.passkey, native, "passkey lengths") if asked.passkey else lengths
    o = _copy_sizes(o, native) if o.copy else o
    distances = _copy_distances(asked.copy, native, lengths, o) if o.copy else []
    rc_lengths = resolve_lengths(asked.recall, native, "recall lengths") if asked.recall else lengths
    _check_supported(m, lengths, "lengths")
    if o.passkey:
        _check_supported(m, pk_lengths, "passkey lengths")
        _check_passkey_room(m, min(pk_lengths))
    if o.recall:
        _check_supported(m, rc_lengths, "recall lengths")
        _check_recall_room(m, min(rc_lengths), o.recall_span)
    check_tokenizers(models, docs[0].text[:4000])
    stream = build_stream(m.tokenizer, docs, label, o.budget, lengths, o.doc_separator)
    plan = Plan(
        o=o,
        models=models,
        stream=stream,
        jobs=plan_jobs(models, lengths, o.stride, o.sliding),
        lengths=lengths,
        passkey_lengths=pk_lengths,
        recall_lengths=rc_lengths,
        copy_distances=distances,
        asked=asked,
    )
    if o.recall:
        plan.recall_text = _recall_text(m, docs, label, o.budget, max(rc_lengths), o.recall_span, o.doc_separator)
    if distances:
        longest = max(distances) + (o.copy_keys + 1) * o.copy_span
        what = f"copy distance {max(distances)}"
        plan.copy_text = _recall_text(m, docs, label, o.budget, longest, 0, o.doc_separator, what=what)
        plan.copy_prefix = pk.bos_prefix(m.tokenizer)
    return plan


def _measure(plan: Plan, progress: bool) -> dict:
    """Every measure of the plan, one progress bar over all their forward passes."""
    o, models = plan.o, plan.models
    out = {"passkey": None, "recall": None, "copy": None}
    with tqdm(total=sum(c for _, c in plan.work()), disable=not progress, unit="window", dynamic_ncols=True) as bar:
        ppl = run_perplexity(models, plan.jobs, plan.stream, o.batch_size, o.position_buckets, bar)
        out["rows"], out["loss_by_position"], out["cost"], out["scored"] = ppl
        if o.passkey:
            out["passkey"] = run_passkey(models, plan.passkey_lengths, plan.asked.depths, o.passkey_trials, o.seed, bar)
        if o.recall:
            out["recall"] = run_recall(models, plan.recall_text, plan.recall_lengths, plan.asked.recall_depths, o, bar)
        if plan.copy_distances:
            probe = Probe(o.copy_span, o.copy_cue, o.copy_keys, o.seed, tuple(plan.copy_prefix))
            out["copy"] = retrieval.run(models, plan.copy_text, plan.copy_distances, o.copy_trials, probe, bar)
    return out


def _report_data(plan: Plan, results: dict, started) -> dict:
    """report.json's content (``report.schema``) from the plan and what its measures gave."""
    o, finished = plan.o, _dt.datetime.now(_dt.timezone.utc)
    return {
        "schema_version": SCHEMA_VERSION,
        "models": [_model_entry(m) for m in plan.models],
        "data": {**plan.stream.describe(), "budget": o.budget, "doc_separator": o.doc_separator or "eos"},
        "settings": _settings(plan),
        "seeds": {
            "passkey": o.seed,
            **({"recall": o.seed} if o.recall else {}),
            **({"copy": o.seed} if plan.copy_distances else {}),
        },
        "environment": environment(plan.models[0].model),
        "rows": results["rows"],
        "far_context": far_context(plan.models, plan.jobs, results["scored"]),
        "loss_by_position": results["loss_by_position"],
        "passkey": results["passkey"],
        "recall": results["recall"],
        "copy": results["copy"],
        "cost": results["cost"],
        "timing": {
            "started": started.isoformat(),
            "finished": finished.isoformat(),
            "seconds": (finished - started).total_seconds(),
        },
    }


def _settings(plan: Plan) -> dict:
    """The report's ``settings``: what each measure ran with."""
    o = plan.o
    passkey = {
        "lengths": plan.passkey_lengths,
        "depths": plan.asked.depths,
        "trials": o.passkey_trials,
        "new_tokens": PASSKEY_NEW_TOKENS,
    }
    recall = {
        "lengths": plan.recall_lengths,
        "depths": plan.asked.recall_depths,
        "trials": o.recall_trials,
        "span": o.recall_span,
        "cue": o.recall_cue,
        "text_tokens": len(plan.recall_text or []),
        "scoring": "teacher-forced argmax (one forward per trial)",
    }
    copy = {
        "distances": plan.copy_distances,
        "trials": o.copy_trials,
        "span": o.copy_span,
        "cue": o.copy_cue,
        "keys": o.copy_keys,
        "text": "the eval text (natural)",
    }
    return {
        "lengths": plan.lengths,
        "stride": o.stride,
        "sliding": o.sliding,
        "batch_size": o.batch_size,
        "position_buckets": o.position_buckets,
        "passkey": passkey if o.passkey else None,
        "recall": recall if o.recall else None,
        "copy": copy if plan.copy_distances else None,
    }


def _long_documents(models, source, asked_lengths, progress: bool, out) -> longdoc.LongDocReport:
    """A classifier's or an embedding model's evaluation (``evaluation.longdoc``): accuracy or top-1 at each length
    (default 1x, 2x, 4x, 8x of native, up to the model's limit) against the original truncated and chunked, on a
    task's documents (``longdoc:`` spec) or on records (``records.Records``)."""
    native = (models[0].info.get("native") or {}).get("length")
    if not native:
        raise OptionError(f"{models[0].name}: its native length is unknown; the baselines' readings need it")
    lengths = resolve_lengths(asked_lengths or ["1x", "2x", "4x", "8x"], native)
    if asked_lengths is None and models[0].max_length:
        lengths = _within_limit(models[0], lengths)
    readings = len(longdoc.reads_of(models, native))
    on_records = isinstance(source, records.Records)
    n = None if on_records else longdoc.EXAMPLES
    log.info(
        "%s: %s at the lengths %s, %d readings (models x ways of reading)",
        getattr(source, "label", source),
        "its records" if on_records else f"{n} documents",
        lengths,
        readings,
    )
    with tqdm(total=None if on_records else n * readings * len(lengths), disable=not progress, unit="doc") as bar:
        if on_records:
            data = longdoc.run_records(models, source, lengths, native, bar)
        else:
            data = longdoc.run(models, source, lengths, native, n, bar)
    data["verdict"] = longdoc.verdict(data)
    data["environment"] = environment(models[0].model)
    report = longdoc.LongDocReport(data)
    if out is not None:
        report.save(out)
    return report


def _task_of(model_or_path) -> str | None:
    """The task of what ``evaluate`` was given, before loading it: a model's class, or a local folder's config
    (its architecture); None when only loading tells."""
    import torch.nn as nn

    m = model_or_path[0] if isinstance(model_or_path, tuple) else model_or_path
    if isinstance(m, nn.Module):
        return task.of_model(m).name
    folder = Path(str(m)).expanduser() if isinstance(m, (str, Path)) else None
    cfg = (
        next((f for f in (folder / "config.json", folder / rf.FINAL / "config.json") if f.is_file()), None)
        if folder
        else None
    )
    if cfg is None:
        return None
    try:
        arch = (json.loads(cfg.read_text()).get("architectures") or [None])[0]
    except (OSError, ValueError):
        return None  # loading it says what is wrong
    return task.of_class(arch).name if arch else None


def _masked(models, data: tuple, lengths, o, cp_items, progress, out) -> masked.MaskedReport:
    """A masked LM's evaluation (``evaluation.masked``): masked-token NLL, perplexity and BPC at each length
    against its own and the original's native sliding window, on one draw of masked tokens; and retrieval at
    distance scored by masking (``retrieval.score_masked``). ``data``: (documents, their label)."""
    docs, data_label = data
    native = (models[0].info.get("native") or {}).get("length")
    if not native:
        raise OptionError(
            f"{models[0].name}: its native length is unknown (no adapter describes it and its config names none); "
            "a masked-LM evaluation needs it for the sliding window"
        )
    skipped = [k for k in ("passkey", "recall") if getattr(o, k)]
    if skipped:
        log.info("masked LM: %s (generation) not run", ", ".join(skipped))
    check_tokenizers(models, docs[0].text[:4000])
    stream = build_stream(models[0].tokenizer, docs, data_label, o.budget, lengths, o.doc_separator)
    ids = stream.ids[:-1]  # (n,) a multiple of the longest length
    mask_id = getattr(models[0].tokenizer, "mask_token_id", None)
    if o.copy and mask_id is None:
        log.warning("masked LM: its tokenizer has no mask token, so retrieval at distance is not run")
    cp = None
    work = masked.work(ids.numel(), lengths, native, models)
    if o.copy and mask_id is not None:
        o = _copy_sizes(o, native)
        distances = _copy_distances(cp_items, native, lengths, o)
        longest = max(distances) + (o.copy_keys + 1) * o.copy_span
        text = _recall_text(
            models[0], docs, data_label, o.budget, longest, 0, o.doc_separator, f"copy distance {max(distances)}"
        )
        prefix = (
            [models[0].tokenizer.cls_token_id] if getattr(models[0].tokenizer, "cls_token_id", None) is not None else []
        )
        cp = (distances, text, prefix)
        work += [(d + o.copy_span, len(models) * o.copy_trials) for d in distances]
    _say_cost(models[0], ids, work)
    with tqdm(total=sum(c for _, c in work), disable=not progress, unit="window") as bar:
        scores = masked.run(models, ids, lengths, native, data_label, MASK_RATE, bar)
        if cp is not None:
            distances, text, prefix = cp
            probe = Probe(o.copy_span, o.copy_cue, o.copy_keys, o.seed, tuple(prefix))
            scores["copy"] = retrieval.run(models, text, distances, o.copy_trials, probe, bar, mask_id)
            scores["copy_settings"] = {
                "trials": o.copy_trials,
                "span": o.copy_span,
                "cue": o.copy_cue,
                "keys": o.copy_keys,
            }
    report = masked.MaskedReport({**scores, "environment": environment(models[0].model)})
    if out is not None:
        report.save(out)
    return report


def load_models(
    model_or_path, baselines, *, tokenizer=None, gguf_file=None, device=None, dtype=None
) -> list[EvalModel]:
    """The evaluated model first, then each baseline (which defaults to the model's tokenizer)."""
    if (
        isinstance(baselines, str)
        or hasattr(baselines, "forward")
        or (isinstance(baselines, tuple) and any(hasattr(b, "forward") for b in baselines))
    ):
        baselines = [baselines]  # one baseline given bare
    models = [
        resolve(
            model_or_path,
            None,
            tokenizer=tokenizer,
            gguf_file=gguf_file,
            device=device,
            dtype=dtype,
            default_name="model",
        )
    ]
    for j, b in enumerate(baselines):
        if isinstance(b, str) and b == ORIGINAL:
            b = original_of(model_or_path, models[0], device=device, dtype=dtype)
        models.append(
            resolve(
                b, "baseline", tokenizer=models[0].tokenizer, device=device, dtype=dtype, default_name=f"baseline{j}"
            )
        )
    _dedupe_names(models)
    return models


def original_of(model_or_path, evaluated: EvalModel, *, device=None, dtype=None):
    """The baseline "original" of a run folder or checkpoint: the model it was converted from, as the run
    recorded it (reverted when that is itself a retrofit checkpoint). ``(name, model, tokenizer)``. A model
    converted in memory is not copied (its hooks belong to it): pass its original as a baseline instead."""
    from pathlib import Path

    from ..foundation.run_folder import original_source
    from ..models.io import load_original

    if isinstance(model_or_path, (str, Path)) and Path(model_or_path).exists():
        src = original_source(model_or_path)
        if src is not None:
            return load_original(
                src["name_or_path"], gguf_file=src["gguf_file"], dtype=dtype or src["dtype"], device=device
            )
    raise OptionError(
        f"baseline 'original': {evaluated.name} records no model it was converted from (no run folder, run "
        "recipe or retrofit block in its config to read); name that model instead"
    )


def _unique(jobs: list[Job]) -> list[Job]:
    seen, out = set(), []
    for j in jobs:
        key = (j.model, j.method, j.window, j.stride)
        if key not in seen:
            seen.add(key)
            out.append(j)
    return out


def _dedupe_names(models: list[EvalModel]) -> None:
    seen: dict[str, int] = {}
    for m in models:
        if m.name in seen:
            seen[m.name] += 1
            m.name = f"{m.name} ({m.role} {seen[m.name]})"
        else:
            seen[m.name] = 1


def _check_passkey_room(m: EvalModel, length: int) -> None:
    need = pk.PromptBuilder(m.tokenizer).fixed_tokens() + PASSKEY_NEW_TOKENS
    if length < need:
        raise LengthError(f"passkey length {length} is too short: the prompt alone takes {need} tokens")


def _check_recall_room(m: EvalModel, length: int, span: int) -> None:
    need = rc.room(m.tokenizer, span)
    if length < need:
        raise LengthError(f"recall length {length} is too short: a {span}-token span and its repeat take {need} tokens")


def _fit_budget(o, lengths: list[int]):
    """The options with the budget fitted to the longest length (``budget_windows``), said when it grows."""
    fitted = fitted_budget(o, max(lengths))
    if fitted.budget != o.budget:
        log.info(
            "budget: %s tokens, %d windows of the longest length %s (budget_windows), instead of %s",
            f"{fitted.budget:,}",
            o.budget_windows,
            f"{max(lengths):,}",
            f"{o.budget:,}",
        )
    return fitted


def _say_cost(m: EvalModel, ids, work: list[tuple[int, int]]) -> None:
    """What the evaluation will cost, said before it starts: at once the tokens and forward passes of ``work``
    ((window length, passes) pairs), then a time from forwards of the evaluated model timed now on the eval's
    tokens, up to its longest window (``cost.time_forwards``: a few seconds at most)."""
    log.info("%s", cost.plan_line(work))
    target = max(n for n, c in work if c)
    if m.max_length is not None:
        target = min(target, m.max_length)
    log.info("%s", cost.time_line(m.name, work, cost.time_forwards(m.model, ids, target)))


def _copy_sizes(o, native: int | None):
    """The options with the copy span and cue resolved (defaults: min(32, native / 4) and a quarter of it),
    checked."""
    span = o.copy_span or min(32, max(4, (native or 128) // 4))
    cue = o.copy_cue or max(1, span // 4)
    for name, v in (("copy_trials", o.copy_trials), ("copy_span", span), ("copy_cue", cue), ("copy_keys", o.copy_keys)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise OptionError(f"{name} must be a positive integer, got {v!r}")
    if not cue < span:
        raise OptionError(f"copy_cue ({cue}) must be smaller than copy_span ({span})")
    return eval_options(o, copy_span=span, copy_cue=cue)


def _copy_distances(items, native: int | None, lengths: list[int], o) -> list[int]:
    """The copy distances in tokens: as given, or (the defaults, --quick's too) those up to the longest length."""
    distances = resolve_lengths(items, native, "copy distances")
    if o.copy_distances in (DEFAULTS.copy_distances, QUICK["copy_distances"]):
        distances = [d for d in distances if d <= max(lengths)]
    small = [d for d in distances if d < o.copy_keys * o.copy_span]
    if small:
        raise LengthError(f"copy distance {small[0]} cannot hold {o.copy_keys} span(s) of {o.copy_span} tokens")
    return distances


def _recall_text(
    m: EvalModel, docs, label: str, budget: int, longest: int, span: int, separator, what: str | None = None
) -> list[int]:
    """The eval text recall (and copy) draw fillers and spans from: the perplexity's tokens (the same
    documents, joined the same way), as many as the budget or the longest sequence asks for."""
    ids, _ = first_tokens(m.tokenizer, docs, max(budget, longest) + 1, separator)
    need = longest - rc.room(m.tokenizer, span)  # filler tokens of the longest sequence
    if len(ids) < need:
        raise LengthError(
            f"{what or f'recall length {longest}'} is larger than the available text: {label!r} gives only "
            f"{len(ids)} tokens and it needs {need}; use shorter lengths (or --copy-distances), or more data"
        )
    return ids


def _model_entry(m: EvalModel) -> dict:
    i = m.info
    return {
        "name": m.name,
        "role": m.role,
        "base_model": i.get("base_model"),
        "converted": bool(i.get("converted")),
        "scheme": i.get("scheme"),
        "options": i.get("options") or {},
        "model_type": i.get("model_type"),
        "native": i.get("native"),
        "max_length": i.get("max_length"),
        "parameters": i.get("parameters"),
        "dtype": i.get("dtype"),
        "described_by": i.get("source"),
    }
