"""The fine-tune's two encoder tasks besides the language models' own: ``task: classification`` (the model's own
sequence-classification head and cross-entropy) and ``task: embedding`` (mean pooling and a loss of
sentence-transformers itself, MultipleNegativesRankingLoss, over (query, document) pairs with in-batch negatives).

Each task gives the loop what it reads: its examples as a Dataset, ``collate`` (padding to the batch's longest),
``loss(model, batch)`` and ``per_example(model, batch)`` for the validation loss. Data come from an offline
``longdoc:<task>`` spec (``data.longdoc``: documents of ``data.min_block_length`` .. ``data.block_length`` tokens,
a fresh example for every one trained on) or from records (``data.files`` json/jsonl/csv/parquet, or a Hub
dataset): ``data.text_field`` and ``data.label_field`` for a classifier, ``data.query_field`` and
``data.document_field`` for an embedding model, each text cut at ``data.block_length`` tokens.

An embedding model's ``train.objective: both`` (or ``distill``) adds distillation to the frozen unconverted original
(``model.make_teacher``): the cosine of the student's vectors to the original's, of the queries and of the documents
cut at the original's native length (``Embedding.distilled``). A classifier's is not built (the recipe refuses it)."""

from __future__ import annotations

import logging
import random
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..data import longdoc
from ..data.specs import heldout_split
from ..foundation.errors import DataError, RecipeError
from . import preflight
from .blocks import Blocks  # any indexable of examples

log = logging.getLogger(__name__)
KINDS = ("classification", "embedding")
VALIDATION_SEED = 7_777  # validation examples: another seed and the held-out plays


@dataclass
class Row:
    """One example: the token ids, and its label (classification) or its query's ids (embedding)."""

    ids: list[int]
    label: int = -1
    query: list[int] | None = None


class Generated(Dataset):
    """Examples of a ``longdoc`` task made on demand: example ``i`` is the same on every process and run."""

    def __init__(self, builder: longdoc.Builder, seed: int, n: int, lengths: tuple[int, int]):
        self.builder, self.seed, self.n, self.lengths = builder, seed, n, lengths

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        length = random.Random(self.seed * 7_919 + i).randint(*self.lengths)
        ex = self.builder.example(self.seed, i, length)
        return Row(ex.ids, ex.label, ex.query or None)


def label_names(r, source=None) -> tuple[str, ...]:
    """The recipe's classes in head order (``preflight.classes``: a trained classifier's own when they are the
    data's labels, refused when they differ): of the data, the task's (longdoc), ``data.labels``, a stream's
    class-label column, else the labels its records hold (sorted)."""
    cached = getattr(r, "_classes", None)
    if cached is not None:
        return cached
    if longdoc.is_spec(r.data.dataset):
        names = longdoc.task_of(r.data.dataset).labels
    elif source is not None:
        names = source.class_names(r.data.labels)
    elif r.data.labels:
        preflight.check_all_labels(r, _records(r))  # the records are read whole: all of them, before loading
        names = tuple(str(x) for x in r.data.labels)
    else:
        names = tuple(str(x) for x in _label_names(_records(r), r.data.label_field))
    names = preflight.classes(r, tuple(names), preflight.model_facts(r.model.name_or_path, r.model.gguf_file))
    object.__setattr__(r, "_classes", names)
    return names


def model_task(r, source=None) -> tuple:
    """(the recipe's task, its class names or None) as ``model.load`` takes them."""
    return (r.task, label_names(r, source) if r.task == "classification" else None)


def stream_of(r):
    """The recipe's stream, opened and probed: an LM's documents (``stream.StreamSource``) when its data streams, a
    task's records (``task_stream.TaskStream``) with ``data.streaming: true``; None when the data is read whole."""
    from ..data.specs import streams
    from .stream import StreamSource
    from .task_stream import TaskStream

    if r.task is None:
        return StreamSource.of(r.data) if streams(r.data) else None
    return TaskStream.of_task(r) if r.data.streaming else None


def datasets(r, tok, processes: int, source=None) -> tuple[Dataset, Dataset]:
    """(training examples, validation examples) for ``r.task``; with a ``source`` (a TaskStream), the stream itself
    and its held-out examples."""
    d = r.data
    if source is not None:
        names = list(label_names(r, source)) if r.task == "classification" else []
        source.row = lambda rec: _row(r, tok, rec, names)
        val = source.validation(tok, d.block_length, d.packing, d.max_validation_blocks)
        source.check_room(r.train.batch_size * processes)
        return _with_collate(tok, source, val)
    if longdoc.is_spec(d.dataset):
        lengths = (d.min_block_length or d.block_length, d.block_length)
        n = r.train.steps * r.train.batch_size * r.train.gradient_accumulation_steps * processes
        train = Generated(longdoc.Builder(d.dataset, tok, "train"), r.train.seed, n, lengths)
        val = Generated(longdoc.Builder(d.dataset, tok, "heldout"), VALIDATION_SEED, d.max_validation_blocks, lengths)
        log.info(
            "data: %s, %d training examples of %d-%d tokens (each new), %d held-out", d.dataset, n, *lengths, len(val)
        )
        return _with_collate(tok, train, val)
    names = list(label_names(r)) if r.task == "classification" else []
    train, val = heldout_split(_records(r), r.train.seed, d.validation_fraction, d.max_validation_blocks)
    if len(train) < r.train.batch_size * processes:
        raise DataError(f"{len(train)} training examples; train.batch_size x processes needs more")
    log.info(
        "data: %d training examples, %d validation examples (cut at %d tokens)", len(train), len(val), d.block_length
    )
    rows = lambda recs: Blocks([_row(r, tok, rec, names) for rec in recs])  # noqa: E731
    return _with_collate(tok, rows(train), rows(val))


def _with_collate(tok, *sets: Dataset) -> tuple:
    """The datasets, each carrying the ``collate`` its loader batches with (padding with the tokenizer's pad)."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    for ds in sets:
        ds.collate = collate(pad)
    return sets


def _records(r) -> list[dict]:
    """The records of ``data.files`` or a Hub dataset, read through ``datasets`` (cached after the first call)."""
    cached = getattr(r, "_task_records", None)
    if cached is not None:
        return cached
    from ..data.specs import records as read_records

    records = read_records(r.data)
    if not records:
        raise DataError("the recipe's data section names no records")
    object.__setattr__(r, "_task_records", records)
    return records


def _label_names(records: list[dict], field: str = "label") -> list:
    found = {rec[field] for rec in records if field in rec}
    return sorted(found) if len({type(x) for x in found}) == 1 else sorted(found, key=str)


def _row(r, tok, rec: dict, names: list[str]) -> Row:
    from .task_stream import field_keys

    d = r.data
    missing = [(k, getattr(d, k)) for k in field_keys(r.task) if getattr(d, k) not in rec]
    if missing:
        key, name = missing[0]
        raise DataError(f"a record has no field {name!r} (fields: {', '.join(rec)}); set data.{key}")
    cut = lambda text: tok(str(text), truncation=True, max_length=d.block_length).input_ids  # noqa: E731
    if r.task == "classification":
        label = str(rec[d.label_field])
        if label not in names:
            raise DataError(f"a record's label {label!r} is not one of the classes ({', '.join(names)}; data.labels)")
        return Row(cut(rec[d.text_field]), names.index(label))
    return Row(cut(rec[d.document_field]), query=cut(rec[d.query_field]))


def collate(pad_id: int):
    """Rows -> {input_ids, attention_mask (B, T), labels (B,)} or, for pairs, {query: ..., document: ...}."""

    def pad(seqs: list[list[int]]) -> dict:
        T = max(map(len, seqs))
        ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), T), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def fn(rows: list[Row]) -> dict:
        if rows[0].query is not None:
            return {"query": pad([r.query for r in rows]), "document": pad([r.ids for r in rows])}
        return {**pad([r.ids for r in rows]), "labels": torch.tensor([r.label for r in rows])}

    return fn


class Objective:
    """What the loop reads of a classifier's task: its loss, its per-example validation loss and its held-out
    metrics (accuracy and macro-F1)."""

    kind = "classification"

    def loss(self, model, batch: dict) -> torch.Tensor:
        return model(**batch).loss  # the model's own cross-entropy over its labels

    def per_example(self, model, batch: dict) -> torch.Tensor:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        return F.cross_entropy(logits, batch["labels"], reduction="none")  # (B,)

    @torch.no_grad()
    def metrics(self, model, loader, gather=lambda t: t) -> dict:
        """Accuracy and macro-F1 over the validation examples (every process's, through ``gather``)."""
        model.eval()
        got, want = [], []
        for batch in loader:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            got.append(gather(logits.argmax(-1)).cpu())
            want.append(gather(batch["labels"]).cpu())
        if not got:
            return {}
        pred, gold = torch.cat(got), torch.cat(want)
        return {
            "examples": len(gold),
            "accuracy": (pred == gold).float().mean().item(),
            "macro_f1": macro_f1(pred, gold),
        }


def macro_f1(pred: torch.Tensor, gold: torch.Tensor) -> float:
    """The mean over the gold classes of each class's F1 (scikit-learn's ``f1_score(average="macro")`` over the
    classes present in ``gold``)."""
    scores = []
    for c in gold.unique().tolist():
        tp = ((pred == c) & (gold == c)).sum().item()
        fp = ((pred == c) & (gold != c)).sum().item()
        fn = ((pred != c) & (gold == c)).sum().item()
        scores.append(2 * tp / max(2 * tp + fp + fn, 1))
    return sum(scores) / len(scores)


class Embedding(Objective):
    """sentence-transformers' mean pooling and MultipleNegativesRankingLoss over the encoder's hidden states."""

    kind = "embedding"

    def __init__(self, hidden_size: int, end: int | None = None):
        try:
            from sentence_transformers import SentenceTransformer
            from sentence_transformers.losses import MultipleNegativesRankingLoss
            from sentence_transformers.models import Pooling
        except ImportError as e:
            raise RecipeError(
                "'task: embedding' trains with sentence-transformers' own loss: pip install sentence-transformers"
            ) from e
        self.pooling = Pooling(hidden_size, "mean")
        self.loss_fn = MultipleNegativesRankingLoss(SentenceTransformer(modules=[self.pooling], device="cpu"))
        self.end = end  # the token the tokenizer ends every text with (BERT's [SEP]): kept where a text is cut

    def embed(self, model, features: dict) -> torch.Tensor:
        hidden = model(**features).last_hidden_state  # (B, T, E)
        out = self.pooling({"token_embeddings": hidden, "attention_mask": features["attention_mask"]})
        return out["sentence_embedding"]  # (B, E)

    def loss(self, model, batch: dict) -> torch.Tensor:
        q, d = self.embed(model, batch["query"]), self.embed(model, batch["document"])
        return self.loss_fn.compute_loss_from_embeddings([q, d], None)

    def distilled(self, model, batch: dict, teacher, weight: float | None) -> tuple[torch.Tensor, dict]:
        """(loss, its parts) with distillation to the frozen original (``teacher``: a ``teacher.Teacher``, whose view's
        window is the original's native length W): the term is the mean of 1 - cosine between the student's and the
        original's vectors of each query and each document, both read cut at W (``cut_texts``: what the original
        can read). ``weight`` None: objective distill, the term alone; else objective both, the contrastive loss over
        the whole texts + ``weight`` x the term (a text no longer than W reuses its contrastive vector)."""
        texts = (batch["query"], batch["document"])
        cuts = [cut_texts(f, teacher.view.window, self.end) for f in texts]
        whole = [self.embed(model, f) for f in texts] if weight is not None else [None, None]
        got = torch.cat(
            [w if c is f and w is not None else self.embed(model, c) for w, c, f in zip(whole, cuts, texts)]
        )
        with teacher.clock or nullcontext(), torch.no_grad(), teacher.autocast():
            want = torch.cat([self.embed(teacher.model, c) for c in cuts])
        kd = (1 - F.cosine_similarity(got.float(), want.float(), dim=-1)).mean()
        if weight is None:
            return kd, {"distill_loss": kd}
        contrastive = self.loss_fn.compute_loss_from_embeddings(whole, None)
        return contrastive + weight * kd, {"contrastive_loss": contrastive, "distill_loss": kd}

    def teacher_reads(self, window: int) -> str:
        """What the distillation teacher reads, for the log."""
        end = f" (the first {window - 1} and the end token)" if self.end is not None else ""
        return f"embedding vectors of the queries and of the documents cut at {window} tokens{end}"

    def per_example(self, model, batch: dict) -> torch.Tensor:
        loss = self.loss(model, batch)  # in-batch negatives: one loss for the batch
        return loss.expand(len(batch["query"]["input_ids"]))

    @torch.no_grad()
    def metrics(self, model, loader, gather=lambda t: t) -> dict:
        """Retrieval top-1 over the validation pairs: each query against every validation document."""
        model.eval()
        qs, ds = [], []
        for batch in loader:
            qs.append(gather(self.embed(model, batch["query"])).cpu())
            ds.append(gather(self.embed(model, batch["document"])).cpu())
        if not qs:
            return {}
        q, d = F.normalize(torch.cat(qs), dim=-1), F.normalize(torch.cat(ds), dim=-1)
        top = (q @ d.T).argmax(-1)  # (N,)
        return {"examples": len(q), "top1": (top == torch.arange(len(q))).float().mean().item()}


def cut_texts(features: dict, window: int, end: int | None) -> dict:
    """A batch of texts (padded ``input_ids``, ``attention_mask``) as the tokenizer cuts each at ``window`` tokens: a
    text longer than ``window`` keeps its first ``window - 1`` tokens and its end token ``end`` (its first ``window``
    tokens when ``end`` is None); ``features`` itself when no text is longer."""
    lengths = features["attention_mask"].sum(1)
    if int(lengths.max()) <= window:
        return features
    cut = {k: v[:, :window] for k, v in features.items()}
    if end is not None:
        cut["input_ids"] = cut["input_ids"].clone()
        cut["input_ids"][lengths > window, window - 1] = end
    return cut


def end_token(tok) -> int | None:
    """The special token the tokenizer ends every text with (BERT's [SEP], RoBERTa's </s>), None when it ends none."""
    ids = tok("a").input_ids
    return ids[-1] if ids and ids[-1] in tok.all_special_ids else None


def objective(r, model, tok) -> Objective | None:
    """The recipe's task objective (None: a language model's own); ``tok``: the model's tokenizer."""
    if r.task is None:
        return None
    return Embedding(model.config.hidden_size, end_token(tok)) if r.task == "embedding" else Objective()
