"""``evaluate()``: a (converted) model and its baselines measured on exactly the same tokens (or documents) by
the measures of its task (``measure.CATALOG``, ``measure.by_task``: perplexity, passkey, recall and copy for a causal
LM; masked-token perplexity and copy for a masked LM; the long-document reading for a classifier or an embedding
model), each asked, planned, costed and run alike (``measure.Measure``)."""

from __future__ import annotations

import datetime as _dt
import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from ..foundation import task
from ..foundation.errors import OptionError
from ..foundation.schema import field_help
from ..models import builtin
from ..scoring.tokens import build_stream, resolve_documents
from . import cost, preflight, records
from .lengths import resolve as resolve_lengths
from .measure import Measure, Setup, by_task, check_lengths, check_positive, mechanism
from .models import EvalModel, Loading, check_tokenizers, resolve
from .options import DEFAULTS, NAMES, ORIGINAL, EvalOptions, eval_options, fitted_budget, is_quick
from .preflight import READS_DOCUMENTS
from .report import SCHEMA_VERSION, Report, environment, sections
from .verdict import verdict

log = logging.getLogger(__name__)


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
            mechanism(m),
            limit,
            ", ".join(map(str, dropped)),
            ", ".join(map(str, kept)),
        )
    return kept


@dataclass(frozen=True)
class RunOptions:
    """``evaluate``'s keywords that are neither the evaluation's options (``EvalOptions``) nor how its models load
    (``Loading``'s fields): where the report goes and whether bars show."""

    out: Any = field_help("Folder for report.json, report.md and plots (None: nothing written).", None)
    progress: bool = field_help("Progress bars (one over every measure's work).", True)


LOAD_KEYS = tuple(f.name for f in fields(Loading))  # evaluate()'s keywords that say how to load a model
RUN_KEYS = tuple(f.name for f in fields(RunOptions))


def evaluate(
    model_or_path,
    lengths: Sequence | None = None,
    data=None,
    baselines: Sequence = (),
    *,
    options: EvalOptions | None = None,
    **keywords,
) -> Report:
    """Evaluate a (converted) model and its baselines past the native length.

    ``model_or_path``: an ``nn.Module`` (with ``tokenizer=``), ``(model, tokenizer)``, or a path /
    hub id / retrofit checkpoint / ``.gguf`` file loaded with ``retrofit.load_model`` (``gguf_file=``:
    the GGUF file inside a folder; ``device=``, ``dtype=``). ``baselines``: the same forms (a baseline given
    as an ``nn.Module`` alone uses the model's tokenizer).

    The options (``retrofit.evaluation.options.EvalOptions``, their defaults and help in one place) are
    given as ``options=`` and/or as keywords (``budget=4096, passkey=True``); ``lengths`` and ``data`` may
    also be given by position. Beside them, keywords say how the models load (``tokenizer``, ``gguf_file``,
    ``device``, ``dtype``: ``Loading``), where the report goes (``out``) and whether progress bars show
    (``progress``, default True): ``RunOptions``. Any other keyword is an OptionError naming the valid ones.
    Left unset, ``lengths`` (1x-8x) stops at the model's limit.
    ``data``: a ``retrofit.data.specs`` spec or a list of ``Document``, joined with EOS (or with the text
    ``doc_separator``, e.g. ``"\\n\\n"`` for wikitext's paragraph rows). Every model scores the same first
    ``budget`` tokens (cut to a multiple of the largest length) at every length, with
    non-overlapping windows and, when ``sliding``, sliding windows of stride ``stride``. A baseline
    past its own limit gets only the sliding row, labelled as such.

    ``passkey``: passkey retrieval at ``passkey_lengths`` (default: ``lengths``) x ``passkey_depths``.
    ``recall``: copy a ``recall_span``-token random span from depth d of the eval text when its first
    ``recall_cue`` tokens repeat at the end (``retrofit.evaluation.recall``), at ``recall_lengths``
    (default: ``lengths``) x ``recall_depths``, ``recall_trials`` sequences per cell. ``seed`` seeds both.

    All bad input raises a ``RetrofitError`` before any scoring (what a local model's config.json rules out, before
    it loads: ``preflight``). Writes report.json, report.md and plots to ``out`` when given; returns the ``Report``."""
    started = _dt.datetime.now(_dt.timezone.utc)
    load, run = _call_keywords(keywords)
    o, default_lengths = _gather_options(options, lengths, data, keywords)
    items, asked = _asked(o)
    known = _task_of(model_or_path)  # None: only loading tells (a Hub id), so --data is read after it
    if known is not None:
        _measures_of(known, asked)  # a measure asked that this task has not: said before anything loads
    preflight.check(model_or_path, o, default_lengths)  # what a local model's config rules out, before loading
    lm = known is not None and known not in READS_DOCUMENTS
    text = o.data == DEFAULTS.data or not records.may_hold_records(o.data)  # never a classifier's records
    read_now = not records.is_source(o.data) and (lm or (known is None and text))
    docs = _documents(o) if read_now else None  # bad data is said before a local model loads
    models = load_models(model_or_path, baselines, **load)
    kind = task.of_model(models[0].model).name
    if kind in READS_DOCUMENTS:
        source = records.source_for(o.data, model_or_path, given=o.data != EvalOptions.data)
        lengths = _lengths(models[0], items, default_lengths)
        setup = Setup(o, models, None, getattr(source, "label", source), lengths, source=source)
    else:
        docs, data_label = docs or _documents(o)
        lengths = _lengths(models[0], items, default_lengths)
        setup = Setup(_fit_budget(o, lengths), models, docs, data_label, lengths)
    measures = _measures_of(kind, asked)
    for m in measures:
        m.check(setup, asked.get(m.name))  # against the model, before any tokens are read
    if setup.docs is not None:
        setup.stream = _stream(setup)
    planned = [(m, m.plan(setup, asked.get(m.name))) for m in measures]
    if setup.stream is not None:
        _say_cost(models[0], setup.stream.ids, [w for _, p in planned for w in p.work], is_quick(setup.o))
    measured = _run(setup, planned, run.progress)
    report = _report(setup, planned, measured, started)
    if run.out is not None:
        report.save(run.out)
    return report


def _call_keywords(keywords: dict) -> tuple[dict, RunOptions]:
    """(how the models load, ``RunOptions``) taken out of evaluate()'s ``keywords``; what is left must be options of
    the evaluation: any other keyword is an OptionError naming every valid one."""
    unknown = sorted(set(keywords) - set(NAMES) - set(LOAD_KEYS) - set(RUN_KEYS))
    if unknown:
        raise OptionError(
            f"evaluate() got unknown keyword(s) {', '.join(map(repr, unknown))}; valid: the evaluation's options "
            f"({', '.join(NAMES)}), how the models load ({', '.join(LOAD_KEYS)}) and {', '.join(RUN_KEYS)}"
        )
    load = {k: keywords.pop(k) for k in LOAD_KEYS if k in keywords}
    return load, RunOptions(**{k: keywords.pop(k) for k in RUN_KEYS if k in keywords})


def _lengths(m: EvalModel, items: list, default: bool) -> list[int]:
    """The evaluation's lengths in tokens (multiples of ``m``'s native resolved); the defaults stop at its limit.
    A classifier's or embedding model's baselines read in native-size pieces, so it needs its native length."""
    native = (m.info.get("native") or {}).get("length")
    if not native and task.of_model(m.model).name in READS_DOCUMENTS:
        raise OptionError(f"{m.name}: its native length is unknown; the baselines' readings need it")
    lengths = resolve_lengths(items, native)
    return _within_limit(m, lengths) if default and m.max_length else lengths


def _documents(o: EvalOptions) -> tuple:
    """(documents, label) of a language model's evaluation: ``--data`` read (a Hub dataset streamed)."""
    if records.is_source(o.data):
        raise OptionError(f"--data {o.data}: a long-document task is for a classifier or an embedding model")
    return resolve_documents(o.data, max_tokens=2 * max(o.budget, 1 << 17))


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


def _asked(o: EvalOptions) -> tuple[list, dict]:
    """(the lengths' items, what each measure was asked), checked: bad input is said before anything is read."""
    items = check_lengths(o.lengths)
    check_positive(budget=o.budget)
    fitted_budget(o, 1)  # a bad budget_windows too
    # every task's measures are asked (their options checked) before anything is loaded: only loading may tell the task
    return items, {m.name: m.asked(o) for ms in by_task().values() for m in ms}


def _measures_of(kind: str, asked: dict) -> tuple[Measure, ...]:
    """The measures of a model's task. One that is off by default, asked, and not of this task is an OptionError
    (the user asked for it by name); one on by default that the task has not is left out without a word."""
    tasks = by_task()
    measures = tasks.get(kind, tasks["causal-lm"])
    names, default = {m.name for m in measures}, _asked(DEFAULTS)[1]
    refused = [name for name, a in asked.items() if default[name] is None and a is not None and name not in names]
    if refused:
        runs = [name for name, ms in tasks.items() if set(refused) <= {m.name for m in ms}]
        raise OptionError(
            f"{', '.join(refused)} asked, but the model is a {kind} model, whose evaluation is "
            f"{', '.join(m.name for m in measures)}; {', '.join(refused)} {'is' if len(refused) == 1 else 'are'} "
            f"measured on {' and '.join(runs) or 'other'} models: drop the option"
        )
    return measures


def _stream(setup: Setup):
    """The first ``budget`` tokens of the documents (``scoring.tokens.build_stream``), the models' tokenizers checked
    on them first."""
    check_tokenizers(setup.models, setup.docs[0].text[:4000])
    o = setup.o
    return build_stream(setup.models[0].tokenizer, setup.docs, setup.label, o.budget, setup.lengths, o.doc_separator)


def _run(setup: Setup, planned: list, progress: bool) -> dict:
    """Every planned measure, one progress bar over all their forward passes; their report keys merged."""
    total = sum(c for _, p in planned for _, c in p.work) or None  # None: known only as it runs (records)
    measured = {}
    with tqdm(total=total, disable=not progress, unit=planned[0][0].unit, dynamic_ncols=True) as bar:
        for m, p in planned:
            measured.update(m.run(setup, p, bar) if p.state is not None else m.absent())
    return measured


def _report(setup: Setup, planned: list, measured: dict, started):
    """The report of a task whose first measure writes its own (``Measure.report``: a masked LM's, a classifier's or
    embedding model's: their measures' keys), else a causal LM's (``report.Report``: the measures' keys in the
    report's order, ``report.sections``)."""
    own = planned[0][0].report
    if own is not None:
        return own({**measured, "environment": environment(setup.models[0].model)})
    finished = _dt.datetime.now(_dt.timezone.utc)
    o = setup.o
    data = {
        "schema_version": SCHEMA_VERSION,
        "models": [_model_entry(m) for m in setup.models],
        "data": {**setup.stream.describe(), "budget": o.budget, "doc_separator": o.doc_separator or "eos"},
        "settings": {k: v for _, p in planned for k, v in p.settings.items()},
        "seeds": {k: v for _, p in planned for k, v in p.seeds.items()},
        "environment": environment(setup.models[0].model),
        **{k: measured[k] for k in sections()},
        "timing": {"started": started.isoformat(), "finished": finished.isoformat()},
    }
    data["timing"]["seconds"] = (finished - started).total_seconds()
    report = Report(data)
    report.data["verdict"] = verdict(report.data)
    return report


def _task_of(model_or_path) -> str | None:
    """The task of what ``evaluate`` was given, before loading it: a model's class, or a local folder's config
    (its architecture); None when only loading tells."""
    import torch.nn as nn

    m = model_or_path[0] if isinstance(model_or_path, tuple) else model_or_path
    if isinstance(m, nn.Module):
        return task.of_model(m).name
    if isinstance(m, str) and builtin.task_of(m):  # tiny-gpt2, smollm2, standin:<preset>
        return builtin.task_of(m)
    config = preflight.config_of(m)  # None: loading says what is wrong with it
    return preflight.task_of_config(config) if config else None


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
    models = [resolve(model_or_path, None, Loading(tokenizer, gguf_file, device, dtype), default_name="model")]
    for j, b in enumerate(baselines):
        if isinstance(b, str) and b == ORIGINAL:
            b = original_of(model_or_path, models[0], device=device, dtype=dtype)
        models.append(
            resolve(b, "baseline", Loading(models[0].tokenizer, None, device, dtype), default_name=f"baseline{j}")
        )
    _dedupe_names(models)
    return models


def original_of(model_or_path, evaluated: EvalModel, *, device=None, dtype=None):
    """The baseline "original" of a run folder or checkpoint: the model it was converted from, as the run
    recorded it (reverted when that is itself a retrofit checkpoint). ``(name, model, tokenizer)``. A model
    converted in memory is not copied (its hooks belong to it): pass its original as a baseline instead."""

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


def _dedupe_names(models: list[EvalModel]) -> None:
    seen: dict[str, int] = {}
    for m in models:
        if m.name in seen:
            seen[m.name] += 1
            m.name = f"{m.name} ({m.role} {seen[m.name]})"
        else:
            seen[m.name] = 1


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


def _say_cost(m: EvalModel, ids, work: list[tuple[int, int]], quick: bool) -> None:
    """What the evaluation will cost, said before it starts: at once the tokens and forward passes of ``work``
    ((window length, passes) pairs), then a time from forwards of the evaluated model timed now on the eval's
    tokens, up to its longest window (``cost.time_forwards``: a few seconds at most)."""
    log.info("%s", cost.plan_line(work))
    target = max(n for n, c in work if c)
    if m.max_length is not None:
        target = min(target, m.max_length)
    log.info("%s", cost.time_line(m.name, work, cost.time_forwards(m.model, ids, target), quick))


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
