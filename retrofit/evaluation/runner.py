"""``evaluate()``: perplexity vs length, loss by position, passkey retrieval and cost, for a
converted model and its baselines on exactly the same tokens."""

from __future__ import annotations

import datetime as _dt
import logging
from dataclasses import dataclass
from typing import Sequence

from tqdm.auto import tqdm

from ..errors import LengthError, OptionError
from . import defaults as D
from . import passkey as pk
from .cost import Meter
from .lengths import parse_item
from .lengths import resolve as resolve_lengths
from .models import EvalModel, check_tokenizers, describe_model, resolve
from .perplexity import loss_by_position, nonoverlapping_nll, sliding_nll, sliding_window_count, summarize
from .report import SCHEMA_VERSION, Report, environment
from .tokens import build_stream, resolve_documents

log = logging.getLogger(__name__)

PASSKEY_NEW_TOKENS = 8


@dataclass(frozen=True)
class Job:
    """One perplexity measurement: a model, a length and a method."""

    model: int  # index into the run's models
    length: int
    method: str  # "non-overlapping" | "sliding"
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


def _check_options(budget, stride, batch_size, position_buckets, depths, trials):
    for name, v in (("budget", budget), ("stride", stride), ("batch_size", batch_size),
                    ("position_buckets", position_buckets), ("passkey_trials", trials)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise OptionError(f"{name} must be a positive integer, got {v!r}")
    for d in depths:
        if not isinstance(d, (int, float)) or not 0.0 <= float(d) <= 1.0:
            raise OptionError(f"passkey depths must lie in [0, 1], got {d!r}")


def _within_limit(m: EvalModel, lengths: list[int]) -> list[int]:
    """The default lengths ``m`` runs plainly; those past its limit are dropped with a message."""
    limit = m.max_length
    kept, dropped = [L for L in lengths if L <= limit] or [limit], [L for L in lengths if L > limit]
    if dropped:
        what = "is not converted" if m.role == "original" else "is converted"
        log.warning("%s %s (%s: at most %d tokens): the default lengths %s are not evaluated, only %s. Convert it "
                    "to a scheme without that limit, or evaluate it as a baseline (it then gets sliding-window "
                    "figures)", m.name, what, _mechanism(m), limit, ", ".join(map(str, dropped)),
                    ", ".join(map(str, kept)))
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
                note = (f"{m.name} accepts at most {limit} tokens, so longer inputs are not run plainly: these rows "
                        f"are sliding-window evaluations (window {limit}, stride {stride})")
                jobs.append(Job(i, L, "sliding", limit, stride, note))
                continue
            past = f"past the native length {native}" if native and L > native else None
            jobs.append(Job(i, L, "non-overlapping", L, None, past))
            stride = given or max(1, L // 2)
            if sliding and stride < L:
                jobs.append(Job(i, L, "sliding", L, stride, past))
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


def run_perplexity(models, jobs, stream, batch_size, buckets, bar) -> tuple[list, list, list]:
    """Score every job; (rows, loss_by_position entries, cost entries). Same-window jobs share one pass."""
    cache: dict[tuple, tuple] = {}
    rows, positions, costs = [], [], []
    for job in jobs:
        m = models[job.model]
        key = (job.model, job.method, job.window, job.stride)
        reused = key in cache
        if not reused:
            bar.set_description(f"{m.name[-24:]} L={job.length} {job.method}")
            with Meter(_device_of(m.model)) as meter:
                if job.method == "non-overlapping":
                    nll = nonoverlapping_nll(m.model, stream.ids, job.window, batch_size=batch_size, on_window=bar.update)
                else:
                    nll = sliding_nll(m.model, stream.ids, job.window, job.stride, on_window=bar.update)
            cache[key] = (nll, meter.result(stream.targets), _attention_path(m.model), job.length)
        nll, cost, path, first_length = cache[key]
        rows.append({
            "model": m.name, "role": m.role, "length": job.length, "method": job.method,
            "window": job.window, "stride": job.stride, **summarize(nll, job.length),
            "windows": _windows(job, stream.targets), "attention_path": path, "note": job.note,
        })
        costs.append({"model": m.name, "length": job.length, "method": job.method, "window": job.window,
                      "stride": job.stride, "batch_size": batch_size if job.method == "non-overlapping" else 1,
                      "same_pass_as_length": first_length if reused else None, **cost})
        if job.method == "non-overlapping":
            positions.append({"model": m.name, "role": m.role, "length": job.length,
                              **loss_by_position(nll, job.length, buckets)})
    return rows, positions, costs


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
                if m.max_length is not None and L > m.max_length:
                    results.append({"model": m.name, "role": m.role, "length": L, "depth": d, "trials": 0,
                                    "correct": 0, "accuracy": None,
                                    "note": f"not run: {m.name} accepts at most {m.max_length} tokens"})
                    bar.update(trials)
                    continue
                answers = []
                bar.set_description(f"{m.name[-24:]} passkey L={L} depth={d:g}")
                for key in cell_keys:
                    prompt = builder.build(L - PASSKEY_NEW_TOKENS, d, key)
                    answers.append(pk.run_trial(m.model, m.tokenizer, prompt, PASSKEY_NEW_TOKENS))
                    bar.update(1)
                correct = sum(a["correct"] for a in answers)
                low, high = pk.wilson(correct, trials)
                results.append({"model": m.name, "role": m.role, "length": L, "depth": d, "trials": trials,
                                "correct": correct, "accuracy": correct / trials, "note": None,
                                "ci_low": round(low, 4), "ci_high": round(high, 4),
                                "answers": [{"key": a["key"], "answer": a["answer"]} for a in answers]})
    return results


def evaluate(
    model_or_path,
    lengths: Sequence | None = None,
    data=D.DATA,
    baselines: Sequence = (),
    *,
    tokenizer=None,
    gguf_file: str | None = None,
    doc_separator: str | None = None,
    budget: int = D.BUDGET,
    stride: int | None = None,
    sliding: bool = True,
    batch_size: int = D.BATCH_SIZE,
    position_buckets: int = D.POSITION_BUCKETS,
    passkey: bool = False,
    passkey_lengths: Sequence[int] | None = None,
    passkey_depths: Sequence[float] = D.PASSKEY_DEPTHS,
    passkey_trials: int = D.PASSKEY_TRIALS,
    seed: int = D.SEED,
    device=None,
    dtype=None,
    out=None,
    progress: bool = True,
) -> Report:
    """Evaluate a (converted) model and its baselines past the native length.

    ``model_or_path``: an ``nn.Module`` (with ``tokenizer=``), ``(model, tokenizer)``, or a path /
    hub id / retrofit checkpoint / ``.gguf`` file loaded with ``retrofit.load_model`` (``gguf_file``:
    the GGUF file inside a folder). ``baselines``: the same forms (a baseline given as an
    ``nn.Module`` alone uses the model's tokenizer).
    ``data``: a ``retrofit.data`` spec or a list of ``Document``, joined with EOS (or with the text
    ``doc_separator``, e.g. ``"\\n\\n"`` for wikitext's paragraph rows). Every model scores the same first
    ``budget`` tokens (cut to a multiple of the largest length) at every length, with
    non-overlapping windows and, when ``sliding``, sliding windows of stride ``stride``. A baseline
    past its own limit gets only the sliding row, labelled as such.

    All bad input raises a ``RetrofitError`` before any scoring. Writes report.json, report.md and
    plots to ``out`` when given. Returns the ``Report``.
    """
    started = _dt.datetime.now(_dt.timezone.utc)
    default_lengths = lengths is None  # D.LENGTHS, up to the evaluated model's limit
    lengths = _check_lengths(D.LENGTHS if default_lengths else lengths)
    pk_items = _check_lengths(passkey_lengths, "passkey lengths") if passkey and passkey_lengths else None
    depths = [float(d) for d in passkey_depths]
    _check_options(budget, 1 if stride is None else stride, batch_size, position_buckets, depths, passkey_trials)
    docs, data_label = resolve_documents(data)
    models = load_models(model_or_path, baselines, tokenizer=tokenizer, gguf_file=gguf_file, device=device, dtype=dtype)
    native = (models[0].info.get("native") or {}).get("length")
    lengths = resolve_lengths(lengths, native)
    if default_lengths and models[0].max_length:
        lengths = _within_limit(models[0], lengths)
    pk_lengths = resolve_lengths(pk_items, native, "passkey lengths") if pk_items else lengths
    _check_supported(models[0], lengths, "lengths")
    if passkey:
        _check_supported(models[0], pk_lengths, "passkey lengths")
        _check_passkey_room(models[0], min(pk_lengths))
    check_tokenizers(models, docs[0].text[:4000])
    stream = build_stream(models[0].tokenizer, docs, data_label, budget, lengths, doc_separator)
    jobs = plan_jobs(models, lengths, stride, sliding)
    total = sum(_windows(j, stream.targets) for j in _unique(jobs))
    if passkey:
        total += len(models) * len(pk_lengths) * len(depths) * passkey_trials
    log.info("evaluating %d model(s) on %d tokens of %s at lengths %s", len(models), stream.targets, data_label, lengths)
    with tqdm(total=total, disable=not progress, unit="window", dynamic_ncols=True) as bar:
        rows, positions, costs = run_perplexity(models, jobs, stream, batch_size, position_buckets, bar)
        pk_results = run_passkey(models, pk_lengths, depths, passkey_trials, seed, bar) if passkey else None
    finished = _dt.datetime.now(_dt.timezone.utc)
    report = Report({
        "schema_version": SCHEMA_VERSION,
        "models": [_model_entry(m) for m in models],
        "data": {**stream.describe(), "budget": budget, "doc_separator": doc_separator or "eos"},
        "settings": {"lengths": lengths, "stride": stride, "sliding": sliding, "batch_size": batch_size,
                     "position_buckets": position_buckets,
                     "passkey": {"lengths": pk_lengths, "depths": depths, "trials": passkey_trials,
                                 "new_tokens": PASSKEY_NEW_TOKENS} if passkey else None},
        "seeds": {"passkey": seed},
        "environment": environment(models[0].model),
        "rows": rows,
        "loss_by_position": positions,
        "passkey": pk_results,
        "cost": costs,
        "timing": {"started": started.isoformat(), "finished": finished.isoformat(),
                   "seconds": (finished - started).total_seconds()},
    })
    if out is not None:
        report.save(out)
    return report


def load_models(model_or_path, baselines, *, tokenizer=None, gguf_file=None, device=None, dtype=None) -> list[EvalModel]:
    """The evaluated model first, then each baseline (which defaults to the model's tokenizer)."""
    if isinstance(baselines, str) or hasattr(baselines, "forward") or (
        isinstance(baselines, tuple) and any(hasattr(b, "forward") for b in baselines)
    ):
        baselines = [baselines]  # one baseline given bare
    models = [resolve(model_or_path, None, tokenizer=tokenizer, gguf_file=gguf_file, device=device, dtype=dtype,
                      default_name="model")]
    for j, b in enumerate(baselines):
        models.append(resolve(b, "baseline", tokenizer=models[0].tokenizer, device=device, dtype=dtype,
                              default_name=f"baseline{j}"))
    _dedupe_names(models)
    return models


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


def _model_entry(m: EvalModel) -> dict:
    i = m.info
    return {
        "name": m.name, "role": m.role, "base_model": i.get("base_model"), "converted": bool(i.get("converted")),
        "scheme": i.get("scheme"), "options": i.get("options") or {}, "model_type": i.get("model_type"),
        "native": i.get("native"), "max_length": i.get("max_length"), "parameters": i.get("parameters"),
        "dtype": i.get("dtype"), "described_by": i.get("source"),
    }
