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
from ..models import builtin
from ..scoring.copying import Probe
from ..scoring.masked import RATE as MASK_RATE
from ..scoring.tokens import build_stream, resolve_documents
from . import cost, longdoc, masked, perplexity, records, retrieval
from . import passkey as pk
from . import recall as rc
from .farcontext import far_context
from .lengths import parse_item
from .lengths import resolve as resolve_lengths
from .models import EvalModel, check_tokenizers, resolve
from .options import DEFAULTS, ORIGINAL, EvalOptions, eval_options, fitted_budget
from .report import SCHEMA_VERSION, Report, environment
from .verdict import verdict

log = logging.getLogger(__name__)
READS_DOCUMENTS = ("sequence-classification", "embeddings")  # models evaluated on documents (evaluation.longdoc)


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
    jobs: list[perplexity.Job]
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
        work = [(j.window, perplexity.windows(j, self.stream.targets)) for j in perplexity.unique(self.jobs)]
        work += pk.work(self.passkey_lengths if o.passkey else [], n, self.asked.depths, o.passkey_trials)
        work += rc.work(self.recall_lengths if o.recall else [], n, self.asked.recall_depths, o.recall_trials)
        return work + retrieval.work(self.copy_distances, n, o)


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
    ``data``: a ``retrofit.data.specs`` spec or a list of ``Document``, joined with EOS (or with the text
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
    known = _task_of(model_or_path)  # None: only loading tells (a Hub id), so --data is read after it
    lm = known is not None and known not in READS_DOCUMENTS
    text = o.data == DEFAULTS.data or not records.may_hold_records(o.data)  # never a classifier's records
    read_now = not records.is_source(o.data) and (lm or (known is None and text))
    docs = _documents(o) if read_now else None  # bad data is said before a local model loads
    models = load_models(model_or_path, baselines, **load)
    if task.of_model(models[0].model).name in READS_DOCUMENTS:
        source = records.source_for(o.data, model_or_path, given=o.data != EvalOptions.data)
        return _long_documents(models, source, asked.lengths if not default_lengths else None, progress, out)
    docs, data_label = docs or _documents(o)
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
    o = retrieval.sizes(o, native) if o.copy else o
    distances = retrieval.distances(asked.copy, native, lengths, o) if o.copy else []
    rc_lengths = resolve_lengths(asked.recall, native, "recall lengths") if asked.recall else lengths
    _check_supported(m, lengths, "lengths")
    if o.passkey:
        _check_supported(m, pk_lengths, "passkey lengths")
        pk.check_room(m, min(pk_lengths))
    if o.recall:
        _check_supported(m, rc_lengths, "recall lengths")
        rc.check_room(m, min(rc_lengths), o.recall_span)
    check_tokenizers(models, docs[0].text[:4000])
    stream = build_stream(m.tokenizer, docs, label, o.budget, lengths, o.doc_separator)
    plan = Plan(
        o=o,
        models=models,
        stream=stream,
        jobs=perplexity.plan_jobs(models, lengths, o.stride, o.sliding),
        lengths=lengths,
        passkey_lengths=pk_lengths,
        recall_lengths=rc_lengths,
        copy_distances=distances,
        asked=asked,
    )
    if o.recall:
        plan.recall_text = rc.eval_text(m, docs, label, o.budget, max(rc_lengths), o.recall_span, o.doc_separator)
    if distances:
        longest = max(distances) + (o.copy_keys + 1) * o.copy_span
        what = f"copy distance {max(distances)}"
        plan.copy_text = rc.eval_text(m, docs, label, o.budget, longest, 0, o.doc_separator, what=what)
        plan.copy_prefix = pk.bos_prefix(m.tokenizer)
    return plan


def _measure(plan: Plan, progress: bool) -> dict:
    """Every measure of the plan, one progress bar over all their forward passes."""
    o, models = plan.o, plan.models
    out = {"passkey": None, "recall": None, "copy": None}
    with tqdm(total=sum(c for _, c in plan.work()), disable=not progress, unit="window", dynamic_ncols=True) as bar:
        ppl = perplexity.run(models, plan.jobs, plan.stream, o.batch_size, o.position_buckets, bar)
        out["rows"], out["loss_by_position"], out["cost"], out["scored"] = ppl
        if o.passkey:
            out["passkey"] = pk.run(models, plan.passkey_lengths, plan.asked.depths, o.passkey_trials, o.seed, bar)
        if o.recall:
            out["recall"] = rc.run(models, plan.recall_text, plan.recall_lengths, plan.asked.recall_depths, o, bar)
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
    passkey = pk.settings(plan.passkey_lengths, plan.asked.depths, o)
    recall = rc.settings(plan.recall_lengths, plan.asked.recall_depths, o, plan.recall_text)
    copy = retrieval.settings(plan.copy_distances, o)
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
    if isinstance(m, str) and builtin.task_of(m):  # tiny-gpt2, smollm2, baseline:<preset>
        return builtin.task_of(m)
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
        o = retrieval.sizes(o, native)
        distances = retrieval.distances(cp_items, native, lengths, o)
        longest = max(distances) + (o.copy_keys + 1) * o.copy_span
        text = rc.eval_text(
            models[0], docs, data_label, o.budget, longest, 0, o.doc_separator, f"copy distance {max(distances)}"
        )
        prefix = (
            [models[0].tokenizer.cls_token_id] if getattr(models[0].tokenizer, "cls_token_id", None) is not None else []
        )
        cp = (distances, text, prefix)
        work += retrieval.work(distances, len(models), o)
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


def _say_cost(m: EvalModel, ids, work: list[tuple[int, int]]) -> None:
    """What the evaluation will cost, said before it starts: at once the tokens and forward passes of ``work``
    ((window length, passes) pairs), then a time from forwards of the evaluated model timed now on the eval's
    tokens, up to its longest window (``cost.time_forwards``: a few seconds at most)."""
    log.info("%s", cost.plan_line(work))
    target = max(n for n, c in work if c)
    if m.max_length is not None:
        target = min(target, m.max_length)
    log.info("%s", cost.time_line(m.name, work, cost.time_forwards(m.model, ids, target)))


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
