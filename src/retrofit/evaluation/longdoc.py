"""Use of the whole document by a classifier or an embedding model (``retrofit eval`` of such a model): on the
offline tasks of ``data.longdoc``, accuracy (classification) or retrieval top-1 (embedding) at each document length
and by the depth of the evidence, for every model reading the whole document and, for the original (a baseline), also
the ways it reads a long document today: **truncated** at its native length, and over **native-size chunks** (each
chunk starts with the document's first token) joined by their mean (``chunk-mean``: a classifier's class probabilities,
an embedding model's chunk embeddings) or by their best chunk (``best-chunk``: the most confident chunk's class; a
document's most similar chunk, as chunked retrieval does). A model uses its reach when, past native, it beats them
all, each comparison a paired 95% interval of the difference on the same documents (Newcombe's, from Wilson
intervals), and a reading whose Wilson 95% interval holds chance (1 / the classes, or 1 / the documents a query is
matched among) is said to be **at chance**. The documents are a task's, built at each length, or records (``evaluation.records``: the held-out part of
what the run fine-tuned on, or ``--data``'s), each read whole and counted in the first length that holds it."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data import longdoc
from ..foundation import run_folder
from ..foundation.atomic import write_text
from ..scoring.intervals import paired_difference, wilson
from . import records
from .lengths import reads_past
from .measure import Measure, Planned, Setup
from .models import EvalModel

log = logging.getLogger(__name__)
DEPTH_BINS = 4  # the evidence's depth in quarters of the document
EXAMPLES = 64  # documents a length, by default; depths spread evenly over [0, 1]
SEED = 1_234
REPORT_KIND = "long-document"


@dataclass(frozen=True)
class Read:
    """One way a model reads a document: ``whole``, ``truncated`` at ``native``, or over native-size chunks joined
    by their mean (``chunk-mean``) or by their best chunk (``best-chunk``)."""

    how: str
    native: int

    def views(self, ids: list[int], first: list[int]) -> list[list[int]]:
        """The inputs this reading gives the model for one document (``first``: its special first token)."""
        if self.how == "whole" or len(ids) <= self.native:
            return [ids]
        if self.how == "truncated":
            return [ids[: self.native]]  # chunked and best-chunk: native-size chunks
        body, step = ids[len(first) :], self.native - len(first)
        return [first + body[i : i + step] for i in range(0, len(body), step)]


class Scorer:
    """A model's outputs for the views of a document, one row a view: class probabilities, or a mean-pooled,
    normalised embedding."""

    def __init__(self, m: EvalModel, kind: str):
        self.m, self.kind = m, kind
        self.device = next(m.model.parameters()).device

    @torch.no_grad()
    def __call__(self, views: list[list[int]]) -> torch.Tensor:
        outs = []
        for v in views:
            ids = torch.tensor([v], device=self.device)  # (1, T)
            if self.kind == "classification":
                outs.append(self.m.model(input_ids=ids).logits.float().softmax(-1)[0])  # (C,)
            else:
                outs.append(F.normalize(self.m.model(input_ids=ids).last_hidden_state.float()[0].mean(0), dim=-1))
        return torch.stack(outs)  # (views, C) or (views, E)


def reads_of(models: list[EvalModel], native: int) -> list[tuple[EvalModel, Read]]:
    """Every model reads whole; a baseline also truncated and over chunks at the evaluated model's native length."""
    out = []
    for m in models:
        out.append((m, Read("whole", native)))
        if m.role == "baseline":
            out += [(m, Read(how, native)) for how in ("truncated", "chunk-mean", "best-chunk")]
    return out


def runs_at(m: EvalModel, read: Read, length: int) -> bool:
    """Whether a reading runs at a length: a whole reading past the model's limit does not (the progress bar and the
    cost line count only the readings that run)."""
    return not (read.how == "whole" and m.max_length is not None and length > m.max_length)


def check_fits(models: list[EvalModel], lengths: list[int], info: longdoc.TaskInfo) -> None:
    for m in models:
        longdoc.check_reader(m.name, task_kind(m), info, getattr(m.model.config, "num_labels", None))
    reads_past(models[0].name, models[0].max_length, lengths)


def run(models: list[EvalModel], spec: str, lengths: list[int], native: int, n: int, bar=None) -> dict:
    """The task's scores: a row per (model, reading, length) with its accuracy (or top-1), overall and by depth."""
    info = longdoc.task_of(spec)
    check_fits(models, lengths, info)
    builder = longdoc.Builder(spec, models[0].tokenizer, "heldout")
    rows = []
    for L in lengths:
        docs = [builder.example(SEED, i, L, (i + 0.5) / n) for i in range(n)]  # depths spread evenly
        for m, read in reads_of(models, native):
            if not runs_at(m, read, L):
                continue  # the original past its table: only its truncated and chunked readings
            hits = _hits(m, read, docs, builder.first, info.kind)
            rows.append(_row(m, read, L, docs, hits, _chance(info.kind, info.labels, n)))
            if bar is not None:
                bar.update(n)
    return _data(spec, info.kind, native, n, lengths, rows)


def run_records(models: list[EvalModel], src: "records.Records", lengths: list[int], native: int, bar=None) -> dict:
    """The scores on records: each read once by every reading, then a row per (model, reading, length bin), the
    bin of a record being the first length that holds it (records past the longest are cut there). A baseline's
    whole reading is left out: on what its table holds it is its truncated one."""
    kind = "classification" if task_kind(models[0]) == "sequence-classification" else "embedding"
    names = class_names(models[0]) if kind == "classification" else ()
    check_fits(models, lengths, longdoc.TaskInfo("records", kind, names, "the records"))
    tok = models[0].tokenizer
    docs = records.examples(src, tok, names, max(lengths), native)
    bins = [next(b for b, L in enumerate(lengths) if len(d.ids) <= L) for d in docs]
    rows = []
    for m, read in reads_of(models, native):
        if read.how == "whole" and m.role == "baseline":
            continue
        hits = _hits(m, read, docs, longdoc.first_token(tok), kind)
        for b, L in enumerate(lengths):
            held = [i for i, x in enumerate(bins) if x == b]
            if held:
                chance = _chance(kind, names, len(docs))  # a query is matched among every record
                rows.append(_row(m, read, L, [docs[i] for i in held], [hits[i] for i in held], chance))
        if bar is not None:
            bar.update(len(docs))
    data = _data(src.label, kind, native, len(docs), lengths, rows)
    data["bins"] = [bins.count(b) for b in range(len(lengths))]  # records a length bin
    return data


def _data(task: str, kind: str, native: int, n: int, lengths: list[int], rows: list[dict]) -> dict:
    return {
        "kind": REPORT_KIND,  # what a card or the CLI reads the report as
        "task": task,
        "task_kind": kind,
        "native": native,
        "examples": n,
        "lengths": lengths,
        "rows": rows,
    }


def task_kind(m: EvalModel) -> str:
    from ..foundation.task import of_model

    return of_model(m.model).name


def class_names(m: EvalModel) -> tuple[str, ...]:
    """A classifier's class names in index order (``config.id2label``)."""
    return records.class_names(m.model.config.id2label, m.model.config.num_labels)


def _hits(m: EvalModel, read: Read, docs: list, first: list[int], kind: str) -> list[bool]:
    """Whether each document was answered: its label predicted, or (embedding) its query's nearest document. Chunks
    join by their mean (``chunk-mean``: probabilities, or embeddings renormalised) or by their best one (``best-chunk``:
    the most confident chunk's class, or a document's most similar chunk)."""
    score = Scorer(m, kind)
    outs = [score(read.views(d.ids, first)) for d in docs]  # n x (views, C or E)
    if kind == "classification":
        pick = [o[o.max(-1).values.argmax()] if read.how == "best-chunk" else o.mean(0) for o in outs]
        return (torch.stack(pick).argmax(-1) == torch.tensor([d.label for d in docs])).tolist()
    queries = torch.cat([score([d.query]) for d in docs])  # (n, E): a query is short, read whole
    if read.how == "best-chunk":
        sims = torch.stack([(queries @ o.T).max(-1).values for o in outs], dim=1)  # (n queries, n docs)
    else:
        sims = queries @ torch.stack([F.normalize(o.mean(0), dim=-1) for o in outs]).T
    # a hit: the document found is the query's own (by content: records may share a document among queries)
    return [docs[j].ids == docs[i].ids for i, j in enumerate(sims.argmax(-1).tolist())]


def _chance(kind: str, labels: tuple, candidates: int) -> float:
    """A reading's score by chance: 1 / the classes, or (retrieval) 1 / the documents a query is matched among."""
    return 1 / len(labels) if kind == "classification" else 1 / candidates


def _row(m: EvalModel, read: Read, L: int, docs: list, hits: list[bool], chance: float) -> dict:
    """A row's score with its Wilson 95% interval and whether that holds chance, each document's outcome (for the
    paired comparisons), and (documents built with their evidence placed) its score by depth and past native."""
    placed = all(d.evidence for d in docs)
    bins = [[h for d, h in zip(docs, hits) if min(int(d.depth * DEPTH_BINS), DEPTH_BINS - 1) == b] for b in range(4)]
    past = [h for d, h in zip(docs, hits) if placed and d.evidence[-1] >= read.native]
    low, high = wilson(sum(hits), len(hits))
    return {
        "model": m.name,
        "role": m.role,
        "read": read.how,
        "length": L,
        "documents": len(docs),
        "score": sum(hits) / len(hits),
        "ci_low": round(low, 4),
        "ci_high": round(high, 4),
        "chance": chance,
        "at_chance": low <= chance <= high,
        "correct": [int(h) for h in hits],
        "by_depth": [sum(b) / len(b) if b else None for b in bins] if placed else None,
        "past_native": sum(past) / len(past) if past else None,
    }


def comparisons(data: dict) -> list[dict]:
    """Past native, the evaluated model's whole reading against each of a baseline's readings on the same documents:
    the difference of their scores with its paired 95% interval; ``beats`` when the interval lies above 0."""
    native, rows = data["native"], data["rows"]
    model = rows[0]["model"] if rows else None
    out = []
    for own in (r for r in rows if r["model"] == model and r["read"] == "whole" and r["length"] > native):
        for base in (
            r for r in rows if r["role"] == "baseline" and r["length"] == own["length"] and r["read"] != "whole"
        ):
            d, low, high = paired_difference(own["correct"], base["correct"])
            out.append({"length": own["length"], "against": f"{base['model']} {base['read']}", "difference": round(d, 4),
                        "ci_low": round(low, 4), "ci_high": round(high, 4), "beats": low > 0})  # fmt: skip
    return out


def verdict(data: dict) -> str:
    """Whether the evaluated model beats each of the original's readings (truncated, chunked, best chunk) past native,
    in words: a win is a paired 95% interval of the difference above 0, and a reading whose interval holds chance is
    said to be at chance."""
    native, rows = data["native"], data["rows"]
    if any("correct" not in r for r in rows):
        return "no verdict: this report predates the per-document outcomes its intervals need (evaluate it again)"
    model = rows[0]["model"] if rows else None
    own = {r["length"]: r for r in rows if r["model"] == model and r["read"] == "whole"}
    past = [L for L in data["lengths"] if L > native and L in own]  # records: a length bin may hold none
    chance = [L for L in past if own[L]["at_chance"]]
    said = _at_chance(own, chance)
    if not past or not any(r["role"] == "baseline" for r in rows):
        said = said or _at_chance(own, [L for L in own if own[L]["at_chance"]]).replace(" past native", "")
        return said or (
            "no verdict: it needs a length past native and a baseline to compare with (--baseline, or eval.baselines)"
        )
    cmp = comparisons(data)
    wins = [all(c["beats"] for c in cmp if c["length"] == L) for L in past]
    if len(chance) == len(past):
        return said + "; it beats no reading of the original"
    if all(wins):
        return (
            "uses its reach: past native it beats the original truncated and over chunks (mean, best) at every length "
            "(each paired 95% interval of the difference lies above 0)" + (f"; {said}" if said else "")
        )
    return (
        f"does not use its reach everywhere: past native it beats every reading of the original (a paired 95% "
        f"interval of the difference above 0) at {sum(wins)} of {len(wins)} lengths" + (f"; {said}" if said else "")
    )


def _at_chance(own: dict, lengths: list[int]) -> str:
    """The lengths past native where the model's reading is at chance, in words ('' when none)."""
    if not lengths:
        return ""
    r = own[lengths[0]]
    where = ", ".join(f"{L:,}" for L in lengths)
    return (
        f"at chance past native at {where} tokens: its Wilson 95% interval holds chance ({100 * r['chance']:.1f}%, "
        f"1 in {round(1 / r['chance'])})"
    )


def table(data: dict) -> str:
    """The markdown table: a row per model and reading, a column per length (score; ``*``: at chance), then the scores
    by depth and past native where the documents place their evidence, and the verdict."""
    lengths, metric = data["lengths"], "accuracy" if data["task_kind"] == "classification" else "top-1"
    head = f"| model | reading | {' | '.join(f'{L:,}' for L in lengths)} |\n|---|---|{'---|' * len(lengths)}\n"
    keys = list(dict.fromkeys((r["model"], r["read"]) for r in data["rows"]))
    lines = []
    for name, how in keys:
        cells = []
        for L in lengths:
            r = next((r for r in data["rows"] if (r["model"], r["read"], r["length"]) == (name, how, L)), None)
            cells.append("—" if r is None else f"{100 * r['score']:.1f}" + ("*" if r.get("at_chance") else ""))
        lines.append(f"| {name} | {how} | {' | '.join(cells)} |")
    if "bins" in data:  # records: a column per length bin
        counts = " / ".join(f"{c:,}" for c in data["bins"])
        title = f"{data['task']}: {metric} (%) of the documents up to each length in tokens (native {data['native']:,}); documents a column: {counts}"
    else:
        title = f"{data['task']}: {metric} (%) by document length in tokens (native {data['native']:,}), {data['examples']} documents a length"
    chance = next((r["chance"] for r in data["rows"] if r.get("at_chance")), None)
    note = (
        f"\n\n\\* at chance: the score's Wilson 95% interval holds chance ({100 * chance:.1f}%)."
        if chance is not None
        else ""
    )
    return f"{title}\n\n{head}" + "\n".join(lines) + note + _depth_table(data) + f"\n\nVerdict: {verdict(data)}.\n"


def _depth_table(data: dict) -> str:
    """By depth quarter of the evidence and on the documents whose evidence lies past native: a row per model,
    reading and length ('' for records, which place no evidence)."""
    rows = [r for r in data["rows"] if r.get("by_depth") is not None]
    if not rows:
        return ""

    def pct(x):
        return "—" if x is None else f"{100 * x:.1f}"

    head = "| model | reading | length | depth 0-¼ | ¼-½ | ½-¾ | ¾-1 | evidence past native |\n|---|---|---|---|---|---|---|---|\n"
    body = "\n".join(
        f"| {r['model']} | {r['read']} | {r['length']:,} | {' | '.join(pct(x) for x in r['by_depth'])} | "
        f"{pct(r.get('past_native'))} |"
        for r in rows
    )
    return f"\n\nBy the depth of the evidence (quarters of the document) and past native (%):\n\n{head}{body}"


@dataclass
class LongDocReport:
    """What ``retrofit eval`` writes for a classifier or an embedding model: report.json and report.md."""

    data: dict
    kind = REPORT_KIND

    def save(self, out, plots: bool = True) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / run_folder.REPORT, json.dumps(self.data, indent=2, default=str) + "\n")
        write_text(
            out / run_folder.REPORT_MD, f"# Long-document evaluation: {self.data['rows'][0]['model']}\n\n{self.table()}"
        )
        return out

    def table(self) -> str:
        return table(self.data)


class LongDocuments(Measure):
    """A classifier's or an embedding model's reading of long documents: accuracy (top-1) at each length against
    the original truncated at native and over native-size chunks, on a task's documents (a ``longdoc:`` spec,
    ``EXAMPLES`` a length) or on records (``records.Records``, each read once, binned by length)."""

    name = "long-document"
    unit = "doc"
    tasks = ("sequence-classification", "embeddings")
    report = LongDocReport

    def asked(self, o) -> bool:
        return True

    def plan(self, setup: Setup, asked) -> Planned:
        pairs = reads_of(setup.models, setup.native)
        readings = len(pairs)
        on_records = isinstance(setup.source, records.Records)
        what = "its records" if on_records else f"{EXAMPLES} documents"
        log.info("%s: %s at the lengths %s, %d readings (models x ways of reading)", setup.label, what,
                 setup.lengths, readings)  # fmt: skip
        if on_records:  # how many is known once they are read
            return Planned(state="records")
        work = [(L, EXAMPLES * sum(runs_at(m, read, L) for m, read in pairs)) for L in setup.lengths]
        return Planned(work=work, state="documents")

    def run(self, setup: Setup, planned: Planned, bar) -> dict:
        models, lengths, native = setup.models, setup.lengths, setup.native
        if planned.state == "records":
            data = run_records(models, setup.source, lengths, native, bar)
        else:
            data = run(models, setup.source, lengths, native, EXAMPLES, bar)
        return {**data, "verdict": verdict(data)}


MEASURE = LongDocuments()
