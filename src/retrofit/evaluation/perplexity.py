"""Perplexity against length: what the per-token losses (``scoring.losses``) are summarised into.

Both methods score exactly the same *targets*: with a stream ``ids`` of ``n + 1`` tokens, the
targets are ``ids[1:n + 1]`` (every token except the first, which only serves as context).

- non-overlapping, length ``L``: window ``k`` feeds ``ids[k*L : k*L + L]`` and scores
  ``ids[k*L + 1 : k*L + L + 1]``; every window scores all of its ``L`` targets.
- sliding, window ``W``, stride ``S`` (the protocol of the HF perplexity guide, PI and YaRN): the
  first window scores all of its ``W`` targets; each later window ends ``S`` tokens further and
  scores only its last ``S`` targets (fewer for the last one), so every target is scored once and
  sees at least ``W - S`` tokens of context.

Here: a 95% interval over blocks of targets (``summarize``) and the loss by position in a window.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from ..foundation.errors import OptionError
from ..scoring.losses import nonoverlapping_nll, sliding_nll
from ..scoring.windows import sliding_window_count
from .cost import Meter
from .farcontext import far_context
from .measure import Measure, Planned, Setup, check_positive, check_supported
from .models import EvalModel, describe_model

# ----------------------------------------------------------------------------- statistics

# two-sided 95% Student-t quantiles, df = 1..30
_T975 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]

log = logging.getLogger(__name__)


def t_quantile_975(df: int) -> float:
    """0.975 quantile of Student's t (table up to 30 df, Cornish-Fisher expansion beyond)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def summarize(nll: np.ndarray, block: int) -> dict:
    """ppl, mean NLL, tokens and a 95% CI over blocks of ``block`` consecutive targets.

    For non-overlapping windows the blocks are the windows; for a sliding evaluation they are the
    same target spans, so CIs of both methods cover the same units. The CI is a t interval on the
    per-block mean NLL, mapped through exp.
    """
    tokens = int(nll.size)
    mean = float(nll.mean())
    blocks = nll[: tokens - tokens % block].reshape(-1, block).mean(axis=1) if tokens >= block else nll[None].mean(1)
    n_blocks = int(blocks.size)
    out = {"ppl": math.exp(mean), "nll": mean, "tokens": tokens, "ci_blocks": n_blocks, "ci_low": None, "ci_high": None}
    if n_blocks >= 2:
        half = t_quantile_975(n_blocks - 1) * float(blocks.std(ddof=1)) / math.sqrt(n_blocks)
        out["ci_low"], out["ci_high"] = math.exp(mean - half), math.exp(mean + half)
    return out


def loss_by_position(nll: np.ndarray, length: int, buckets: int) -> dict:
    """Mean NLL by the target's position inside its non-overlapping window.

    Buckets are log-spaced (position 0, then edges at 1 .. L geometrically; duplicates after
    rounding merge), so the first tokens of a window, where loss changes fastest, get their own.
    """
    per_pos = nll.reshape(-1, length).mean(axis=0)  # [L]
    buckets = max(1, min(buckets, length))
    edges = [0, *sorted({int(round(x)) for x in np.geomspace(1, length, buckets)})]
    starts, ends, losses = [], [], []
    for a, b in zip(edges[:-1], edges[1:]):
        if b > a:
            starts.append(int(a))
            ends.append(int(b))
            losses.append(float(per_pos[a:b].mean()))
    return {"bucket_start": starts, "bucket_end": ends, "loss": losses, "windows": int(nll.size // length)}


@dataclass(frozen=True)
class Job:
    """One perplexity measurement: a model, a length and a method."""

    model: int  # index into the run's models
    length: int
    method: str  # "non-overlapping" | "sliding" | "native-window" (a sliding window of the native length)
    window: int
    stride: int | None
    note: str | None = None


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


def windows(job: Job, n: int) -> int:
    """Windows (model inputs) a job scores over ``n`` targets."""
    if job.method == "non-overlapping":
        return n // job.length
    return sliding_window_count(n, job.window, job.stride)


def _kernel(model) -> str | None:
    d = describe_model(model)
    return d.get("last_kernel") or getattr(model.config, "_attn_implementation", None)


def _device_of(model):
    return next(model.parameters()).device


def run(models, jobs, stream, batch_size, buckets, bar) -> tuple[list, list, list, dict]:
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
            cache[key] = (nll, meter.result(stream.targets), _kernel(m.model), job.length)
        nll, cost, kernel, first_length = cache[key]
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
                "windows": windows(job, stream.targets),
                "kernel": kernel,
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


def unique(jobs: list[Job]) -> list[Job]:
    seen, out = set(), []
    for j in jobs:
        key = (j.model, j.method, j.window, j.stride)
        if key not in seen:
            seen.add(key)
            out.append(j)
    return out


class Perplexity(Measure):
    """Perplexity at each length (non-overlapping windows, and sliding ones), loss by position, the far-context
    gain (the same scores against a native window: ``farcontext``) and the cost of each pass. Always run."""

    name = "perplexity"
    keys = ("rows", "far_context", "loss_by_position", "cost")

    def asked(self, o) -> bool:
        stride = 1 if o.stride is None else o.stride
        check_positive(stride=stride, batch_size=o.batch_size, position_buckets=o.position_buckets)
        return True

    def check(self, setup: Setup, asked) -> None:
        check_supported(setup.models[0], setup.lengths, "lengths")

    def plan(self, setup: Setup, asked) -> Planned:
        o, n = setup.o, len(setup.models)
        log.info("evaluating %d model(s) on %d tokens of %s at lengths %s", n, setup.stream.targets, setup.label,
                 setup.lengths)  # fmt: skip
        jobs = plan_jobs(setup.models, setup.lengths, o.stride, o.sliding)
        settings = {"lengths": setup.lengths, "stride": o.stride, "sliding": o.sliding, "batch_size": o.batch_size}
        settings["position_buckets"] = o.position_buckets
        work = [(j.window, windows(j, setup.stream.targets)) for j in unique(jobs)]
        return Planned(work=work, settings=settings, state=jobs)

    def run(self, setup: Setup, planned: Planned, bar) -> dict:
        o, jobs = setup.o, planned.state
        rows, positions, costs, scored = run(setup.models, jobs, setup.stream, o.batch_size, o.position_buckets, bar)
        far = far_context(setup.models, jobs, scored)
        return {"rows": rows, "far_context": far, "loss_by_position": positions, "cost": costs}

    def markdown(self, report, plots: dict) -> list[str]:
        from .markdown import perplexity_section

        return perplexity_section(report, plots)


MEASURE = Perplexity()
