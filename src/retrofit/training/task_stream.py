"""A classifier's or an embedding model's records streamed (``task:`` with ``data.streaming: true``): read through
``datasets`` streaming as the LM stream reads documents (``stream.StreamSource``: local json/jsonl/parquet files or a
Hub dataset, each process its own part by ``split_dataset_by_node``, a seeded shuffle buffer), turned into examples
on the fly and batched; nothing holds more than a batch and the held-out records.

The held-out records are the first ``data.max_validation_blocks`` of the stream (or of ``data.validation_split``),
remembered by content so training skips them. A checkpoint saves every process's ``stream.Position`` (epoch,
records done); a resumed run re-reads its part past them and trains on exactly the batches an uninterrupted run would
have. A classifier's classes are ``data.labels``, else the names of the dataset's class-label column."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from typing import Iterator

import torch

from ..foundation.errors import DataError, RecipeError
from .blocks import Blocks
from .stream import Part, Position, StreamSource

log = logging.getLogger(__name__)


def _digest(rec: dict, fields: tuple[str, str]) -> bytes:
    text = json.dumps([str(rec.get(f)) for f in fields])
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def field_keys(task: str) -> tuple[str, str]:
    """The recipe keys naming a task's two record fields: a classifier's text and label, an embedding's pair."""
    return ("text_field", "label_field") if task == "classification" else ("query_field", "document_field")


class TaskStream(StreamSource):
    """The task's records as a stream: ``validation`` (the held-out rows) and ``batches`` (collated training
    batches, each with the Position after it), as the loop reads a stream."""

    @classmethod
    def of_task(cls, r) -> "TaskStream":
        """Open the recipe's records and read the first: a missing dataset, file or field fails here."""
        import datasets

        d = r.data
        if d.files is not None and any(str(f).endswith((".txt", ".txt.gz")) for f in _listed(d.files)):
            raise DataError("a task streams records (json, jsonl, parquet); text files hold no labels or pairs")
        src = cls.of(d)
        keys = field_keys(r.task)
        src.fields = tuple(getattr(d, k) for k in keys)
        first = next(iter(src._records(src.open())), {})
        missing = [(k, f) for k, f in zip(keys, src.fields) if f not in first]
        if missing:
            key, name = missing[0]
            raise DataError(f"dataset {src.what!r} has no field {name!r}; fields: {', '.join(first)} (set data.{key})")
        feature = (src.open().features or {}).get(src.fields[1])
        src.column_names = tuple(feature.names) if isinstance(feature, datasets.ClassLabel) else None
        src.row = src.collate = None  # set by tasks.datasets once the tokenizer is known
        return src

    def probe(self) -> None:
        """The first record exists (its fields are the task's: ``of_task`` checks them)."""
        if next(iter(self._records(self.open())), None) is None:
            raise DataError(f"dataset {self.what!r} streamed no records")

    def class_names(self, given: list | None) -> tuple[str, ...]:
        """The classes: ``data.labels``, else the label column's class names (``datasets.ClassLabel``)."""
        if given:
            return tuple(str(x) for x in given)
        if self.column_names is not None:
            return self.column_names
        raise RecipeError(
            f"a streamed classifier needs its classes before reading the stream: set data.labels (the "
            f"{self.fields[1]!r} values, in the order of the model's classes); {self.what} has no class-label column"
        )

    def records(self, ds) -> Iterator[dict]:
        """The records of a dataset, class labels by name."""
        for rec in self._records(ds):
            label = rec.get(self.fields[1])
            if self.column_names is not None and isinstance(label, int):
                rec = {**rec, self.fields[1]: self.column_names[label]}
            yield rec

    def validation(self, tokenizer, block_length: int, packing: bool, max_blocks: int) -> Blocks:
        """The held-out examples: the first ``max_blocks`` records of validation_split, or of the stream
        (remembered, so training skips them). Every process reads the same ones."""
        d = self.d
        from_split = d.validation_split is not None
        recs = list(itertools.islice(self.records(self.open(d.validation_split if from_split else None)), max_blocks))
        if not from_split:
            self.held = {self.key(rec) for rec in recs}
        self.validation_documents = len(recs)
        where = f"split {d.validation_split!r}" if from_split else "the stream (held out of training)"
        log.info("validation: the first %d record(s) of %s of %s", len(recs), where, self.what)
        return Blocks([self.row(rec) for rec in recs])

    def check_room(self, needed: int) -> None:
        """A DataError when the stream, less its held-out records, cannot fill one step's batches."""
        have = sum(1 for _ in itertools.islice(self.documents(0, 1, 0, 0), needed))
        if have < needed:
            raise DataError(
                f"{self.what}: {have} record(s) left for training after the {self.validation_documents} held out; "
                f"one step needs {needed} (train.batch_size x processes): add records or lower "
                "data.max_validation_blocks"
            )

    def items(self, ds) -> Iterator[dict]:
        return self.records(ds)

    def key(self, rec: dict) -> bytes:
        return _digest(rec, self.fields)

    def batches(self, tokenizer, batch_size: int, block_length: int, packing: bool, part: Part = Part(), start=None):
        """(a collated batch of ``batch_size`` examples, the Position after it) of this process's ``part``, from
        ``start`` on; epochs follow one another when data.on_short is repeat, else the iterator ends with the
        stream."""
        pos = start or Position()
        while True:
            recs = itertools.islice(self.documents(part.rank, part.world, part.seed, pos.epoch), pos.document, None)
            done, fresh = pos.document, True
            for chunk in iter(lambda: list(itertools.islice(recs, batch_size)), []):
                if len(chunk) < batch_size:
                    break  # a last, short batch is dropped, as the whole-read loader drops it
                done, fresh = done + len(chunk), False
                yield self.collate([self.row(rec) for rec in chunk]), Position(pos.epoch, done, 0)
            if self.d.on_short != "repeat" or (fresh and pos.document == 0):
                return
            pos = Position(pos.epoch + 1, 0, 0)
            log.info("data: the stream ended; epoch %d reads it again (data.on_short: repeat)", pos.epoch)


def _listed(files) -> list:
    return [files] if isinstance(files, str) else list(files)


def to_device(batch, device):
    """A batch (a tensor, or a task's dict of them, nested) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    return {k: to_device(v, device) for k, v in batch.items()}


def batch_rows(batch) -> torch.Tensor:
    """The token ids a batch's checksum reads: an LM block batch itself, a task's texts or documents."""
    if isinstance(batch, torch.Tensor):
        return batch
    return batch["document"]["input_ids"] if "document" in batch else batch["input_ids"]
