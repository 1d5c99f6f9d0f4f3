"""Masked-LM evaluation against length (issue 43): the encoder's counterpart of perplexity and far-context gain.

One draw of masked tokens over the whole token stream (``scoring.masking``'s rule, seeded; its scoring: ``scoring.masked``) is scored by every model
at every length, so rows compare token by token:

- **full**, length ``L``: non-overlapping windows of ``L`` tokens; each masked token reads its whole window
  (Longformer's measure, Beltagy et al. 2020, at 4,096 against RoBERTa's 512).
- **sliding**, window ``W`` (the native length): windows advancing by ``W / 2``; each token is scored from the
  window where it is most central, so it reads at least ``W / 4`` tokens on either side (at the stream's ends
  fewer). The same model restricted to its native reach, and the original read as it was trained.

Far-context gain at ``L``: the model's own sliding NLL minus its full NLL on the same masked tokens, with a 95%
t interval over the ``L``-token windows: above zero, the model *reads* past native; at zero it only *runs* there.
Bits per character: the masked-token NLL in bits over the stream's mean characters per token.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..foundation import run_folder
from ..foundation.atomic import write_text
from ..foundation.errors import OptionError
from ..scoring.masked import RATE, SEED, full_nll, masked_stream, sliding_nll, summary
from ..scoring.masking import IGNORE
from ..scoring.windows import centred_spans
from .farcontext import reads
from .markdown import copy_table
from .measure import Measure, Planned, Setup
from .perplexity import t_quantile_975

log = logging.getLogger(__name__)


def gain(sliding: np.ndarray, full: np.ndarray, length: int) -> dict:
    """Paired far-context gain: mean (sliding - full) NLL over the masked tokens, with a 95% t interval over the
    ``length``-token windows; ``reads`` when the interval is above zero (its perplexity ratio above 1 to 4 decimals)."""
    n = full.size - full.size % length
    d = (sliding - full)[:n].reshape(-1, length)  # (windows, L)
    per = np.array([np.nanmean(row) for row in d if np.any(~np.isnan(row))])
    mean = float(np.nanmean(d))
    out = {"gain_nats": mean, "ci_low": None, "ci_high": None, "windows": int(per.size), "reads": None}
    if per.size >= 2:
        half = t_quantile_975(per.size - 1) * float(per.std(ddof=1)) / math.sqrt(per.size)
        low = round(math.exp(mean - half), 4)  # the perplexity ratio's low end, as the causal report rounds it
        out.update(ci_low=mean - half, ci_high=mean + half, reads=reads({"ci_low": low}))
    return out


@dataclass
class MaskedReport:
    """What ``retrofit eval`` writes for a masked LM: report.json and report.md."""

    data: dict
    kind = "masked-lm"

    def save(self, out: str | os.PathLike, plots: bool = True) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / run_folder.REPORT, json.dumps(self.data, indent=2, default=str) + "\n")
        write_text(out / run_folder.REPORT_MD, markdown(self.data) + "\n")
        return out

    def table(self) -> str:
        return markdown(self.data, heading=False)


def markdown(data: dict, heading: bool = True) -> str:
    native = data["native_length"]
    lines = [f"# Masked-LM evaluation: {data['models'][0]['name']}", ""] if heading else []
    lines += [
        f"{data['masked_tokens']} masked tokens ({data['mask_rate']:.0%} of {data['tokens']} tokens of "
        f"{data['data']}, one draw for every row); native length {native}; sliding: window {native}, "
        f"stride {native // 2}, each token read from the window where it is most central.",
        "",
        "| model | length | read as | masked NLL | ppl | BPC | far-context gain (nats, 95% CI) |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for r in data["rows"]:
        g = r.get("gain")
        shown = (
            ""
            if not g
            else f"{g['gain_nats']:+.4f}"
            + (
                f" [{g['ci_low']:+.4f}, {g['ci_high']:+.4f}] {'reads' if g['reads'] else 'runs only'}"
                if g["ci_low"] is not None
                else ""
            )
        )
        lines.append(
            f"| {r['model']} | {r['length']} | {r['read_as']} | {r['nll']:.4f} | {r['ppl']:.2f} | {r['bpc']:.4f} "
            f"| {shown} |"
        )
    if data.get("copy"):
        s = data["copy_settings"]
        lines += [
            "",
            "## Retrieval at distance" if heading else "Retrieval at distance:",
            "",
            f"A {s['span']}-token span of the eval text stands d tokens before its second occurrence at the end, "
            f"whose last {s['span'] - s['cue']} tokens are masked; each cell: the copy gain (masked NLL with the "
            "displaced text in the first occurrence's place minus with the span there, nats per token) with its "
            f"bootstrap 95% interval, and trials whose every masked token is right, of {s['trials']} paired "
            "trials. Effective reach: the longest distance keeping half of the gain at the shortest one.",
            "",
            copy_table({"copy": data["copy"], "models": [{**m, "native": {"length": native}} for m in data["models"]]}),
        ]
    return "\n".join(lines)


def run(setup: Setup, stream_ids: torch.Tensor, rate: float, bar):
    """Every model of ``setup`` at every length it runs (full), and its native sliding window; gains for the
    evaluated model past native (``setup.models``: EvalModel list, the evaluated first)."""
    models, lengths, native, data_label = setup.models, setup.lengths, setup.native, setup.label
    first = models[0]
    vocab = first.model.get_input_embeddings().weight.shape[0]
    s = masked_stream(stream_ids, first.tokenizer, vocab, rate)
    rows = []
    for m in models:
        slide = sliding_nll(m.model, s, native, on_window=bar.update)
        rows.append({"model": m.name, "role": m.role, "length": native, "method": "sliding",
                     "read_as": f"sliding {native}", **summary(slide, s.chars_per_token)})  # fmt: skip
        for L in lengths:
            if m.max_length and L > m.max_length:
                log.info("%s: no row at %d tokens (its limit is %d); its sliding row stands for it", m.name, L,
                         m.max_length)  # fmt: skip
                continue
            full = full_nll(m.model, s, L, on_window=bar.update)
            row = {
                "model": m.name,
                "role": m.role,
                "length": L,
                "method": "non-overlapping",
                "read_as": f"windows of {L}",
            }
            row.update(summary(full, s.chars_per_token))
            if L > native:
                row["gain"] = gain(slide, full, L)
            rows.append(row)
    return {
        "kind": "masked-lm",
        "models": [{"name": m.name, "role": m.role, "max_length": m.max_length} for m in models],
        "data": data_label,
        "tokens": int(stream_ids.numel()),
        "masked_tokens": int((s.labels != IGNORE).sum()),
        "mask_rate": rate,
        "mask_seed": SEED,
        "chars_per_token": s.chars_per_token,
        "native_length": native,
        "lengths": lengths,
        "rows": rows,
        "far_context": [as_far_context(r, native) for r in rows if r.get("gain")],
    }


def as_far_context(row: dict, native: int) -> dict:
    """A row's gain in the causal report's terms (``evaluation.farcontext``): the ratio of the masked-token
    perplexities, own native window over full context, with the t interval's ends taken through exp."""
    g = row["gain"]
    ends = {k: None if g[k] is None else round(math.exp(g[k]), 4) for k in ("ci_low", "ci_high")}
    out = {"model": row["model"], "length": row["length"], "native": native, "against": "own native window",
           "gain": round(math.exp(g["gain_nats"]), 4), **ends, "blocks": g["windows"]}  # fmt: skip
    return {**out, "reads": reads(out)}  # the causal report's rule: the interval's low end above 1


def work(n: int, lengths: list[int], native: int, models) -> list[tuple[int, int]]:
    """(window length, forward passes) ``run`` makes: every model's native sliding window, and its full
    windows at each length it runs (for the progress bar and the cost said before it starts)."""
    per = len(centred_spans(n, native, max(1, native // 2)))
    out = []
    for m in models:
        out.append((native, per))
        out += [(L, -(-n // L)) for L in lengths if not (m.max_length and L > m.max_length)]
    return out


def windows(n: int, lengths: list[int], native: int, models) -> int:
    """Forward passes ``run`` makes (for the progress bar)."""
    return sum(c for _, c in work(n, lengths, native, models))


class MaskedLM(Measure):
    """A masked LM's reading (``run``): masked-token NLL, perplexity and BPC at each length against its own native
    sliding window and the original's, on one draw of masked tokens. Its keys are the masked report's."""

    name = "masked-lm"
    tasks = ("masked-lm",)
    report = MaskedReport

    def asked(self, o) -> bool:
        return True

    def check(self, setup: Setup, asked) -> None:
        if not setup.native:
            raise OptionError(
                f"{setup.models[0].name}: its native length is unknown (no adapter describes it and its config "
                "names none); a masked-LM evaluation needs it for the sliding window"
            )

    def plan(self, setup: Setup, asked) -> Planned:
        native = setup.native
        ids = setup.stream.ids[:-1]  # (n,) a multiple of the longest length
        return Planned(work=work(ids.numel(), setup.lengths, native, setup.models), state=ids)

    def run(self, setup: Setup, planned: Planned, bar) -> dict:
        return run(setup, planned.state, RATE, bar)


MEASURE = MaskedLM()
