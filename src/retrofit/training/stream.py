"""Streaming fine-tune data: documents read through ``datasets`` streaming, each process its own part,
tokenized on the fly in batches, packed into blocks; nothing holds more than a buffer.

    source = StreamSource.of(recipe.data)            # opens and probes the stream: bad input fails here
    val = source.validation(tokenizer, block_length) # the held-out documents as blocks (a small tensor)
    for batch, where in source.batches(tokenizer, batch_size, block_length, packing, Part(rank, world, seed), start):
        ...                                          # where: the Position just after this batch

A :class:`Position` (epoch, document, token offset) is where a process stands in its own part of the
stream; a checkpoint saves every process's, and a resumed run re-reads its part past ``document``
documents (read, not tokenized), drops ``offset`` tokens of the next, and goes on with exactly the
blocks an uninterrupted run would have seen.

Per-rank parts come from ``datasets.distributed.split_dataset_by_node``: whole files (shards) per
process when their number divides by the world size, else every world-th document. Validation is a
separate split when the recipe names one, else the first documents of the stream; training skips
those (by content: a held-out document never reaches training, wherever it falls after the split).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from dataclasses import dataclass
from typing import Iterator

import torch

from ..data import specs
from ..data.specs import file_format, stream_files
from ..foundation.errors import DataError, HubError
from ..models import sources

log = logging.getLogger(__name__)

# file suffix -> the `datasets` builder that streams it (compressed variants: datasets decompresses by suffix)
TOKENIZE_BATCH = 64  # documents per call of the (fast) tokenizer


@dataclass
class Position:
    """Where one process stands in its part of the stream: epoch, documents done, tokens of the next one done."""

    epoch: int = 0
    document: int = 0
    offset: int = 0

    def as_list(self) -> list[int]:
        return [self.epoch, self.document, self.offset]


@dataclass(frozen=True)
class Part:
    """Which part of the stream a process reads: its ``rank`` of ``world`` processes, and the ``seed`` that shuffles
    each epoch."""

    rank: int = 0
    world: int = 1
    seed: int = 0


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class StreamSource:
    """One streamed corpus: how to open it (Hub name or local files), its text field and its held-out documents."""

    def __init__(self, d, *, what: str, open_args: tuple, open_kwargs: dict):
        self.d, self.what = d, what
        self._args, self._kwargs = open_args, open_kwargs
        self.held: set[bytes] = set()
        self.validation_documents = 0

    @classmethod
    def of(cls, d) -> "StreamSource":
        """Open the recipe's stream and read its first document: a missing dataset, file or field fails here."""
        if d.files is None and specs.source_kind(d.dataset) in ("stdlib", "shakespeare"):
            raise DataError(
                f"data.dataset {d.dataset!r} is a built-in source, read whole; data.streaming: true "
                "streams Hub datasets and local json/jsonl/parquet/txt files"
            )
        if d.files is not None:
            files = stream_files(d.files)
            formats = sorted({file_format(f) for f in files})
            if len(formats) > 1:
                raise DataError(f"data.files mixes formats ({', '.join(formats)}); stream one format per recipe")
            kw = {"data_files": files, "streaming": True}
            if formats[0] == "text":
                kw["sample_by"] = "document"  # one document per file, not per line
            src = cls(
                d,
                what=f"{len(files)} {formats[0]} file(s) ({files[0]}{', ...' if len(files) > 1 else ''})",
                open_args=(formats[0],),
                open_kwargs=kw,
            )
            src.field = "text" if formats[0] == "text" else d.text_field
        else:
            name = d.dataset
            src = cls(
                d,
                what=name + (f":{d.config}" if d.config else ""),
                open_args=(name, d.config),
                open_kwargs={"streaming": True},
            )
            src.field = d.text_field
        src.probe()
        return src

    def open(self, split: str | None = None):
        """The ``datasets.IterableDataset`` of one split (files: their one split, 'train')."""
        import datasets

        split = "train" if self.d.files is not None else (split or self.d.split)
        try:
            with sources.cache_only(self.d.files is None):  # offline (set, or found once): the cache only, at once
                return datasets.load_dataset(*self._args, split=split, **self._kwargs)
        except (ConnectionError, TimeoutError) as e:  # datasets' offline and unreachable-Hub errors
            why = sources.hub_unusable() or "the Hub cannot be reached"
            raise HubError(
                f"dataset {self.what!r} (split {split!r}) is not in the Hugging Face cache, and {why} "
                f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); go online once "
                "to cache it, or point data.files at local json/jsonl/parquet/txt files"
            ) from None
        except Exception as e:  # DatasetNotFoundError, a bad config or split, unreadable files: all bad input
            raise DataError(
                f"cannot stream dataset {self.what!r} (split {split!r}): "
                f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            ) from None

    def probe(self) -> None:
        """Read the first record of the training split: the field exists and holds text."""
        first = next(iter(self._records(self.open())), None)
        if first is None:
            raise DataError(f"dataset {self.what!r} streamed no records")
        if self.field not in first:
            raise DataError(
                f"dataset {self.what!r} has no field {self.field!r}; fields: {', '.join(first)} (set data.text_field)"
            )

    def _records(self, ds) -> Iterator[dict]:
        try:
            yield from ds
        except (ConnectionError, TimeoutError) as e:
            raise HubError(f"the stream of {self.what!r} broke off: {type(e).__name__}: {e}") from None
        except DataError:
            raise
        except Exception as e:  # a malformed file mid-stream
            raise DataError(f"cannot read {self.what!r}: {type(e).__name__}: {str(e).splitlines()[0][:300]}") from None

    def texts(self, ds) -> Iterator[str]:
        """The non-empty texts of a dataset, in its order (records without text are not documents)."""
        for rec in self._records(ds):
            t = rec.get(self.field)
            if isinstance(t, str) and t.strip():
                yield t

    # ---- validation ---------------------------------------------------------------------------
    def validation(self, tokenizer, block_length: int, packing: bool, max_blocks: int) -> torch.Tensor:
        """[n, block_length] held-out blocks: the first documents of validation_split, or of the stream
        (remembered, so training skips them). Every process reads the same ones."""
        d = self.d
        if d.validation_documents == 0:
            log.info("no validation loss: data.validation_documents is 0")
            return torch.empty(0, block_length, dtype=torch.long)
        from_split = d.validation_split is not None
        docs, ids, blocks = [], [], 0
        for text in self.texts(self.open(d.validation_split if from_split else None)):
            if d.validation_documents is None and blocks >= max_blocks:
                break
            docs.append(text)
            ids.append(specs.tokenize_documents(tokenizer, [specs.Document("", text)])[0])
            blocks = _count_blocks(ids, block_length, packing)
            if d.validation_documents is not None and len(docs) >= d.validation_documents:
                break
        if not from_split:
            self.held = {_digest(t) for t in docs}
        self.validation_documents = len(docs)
        where = f"split {d.validation_split!r}" if from_split else "the stream (held out of training)"
        log.info("validation: the first %d document(s) of %s of %s", len(docs), where, self.what)
        from .blocks import make_blocks

        return make_blocks(ids, block_length, packing)[:max_blocks]

    # ---- training -------------------------------------------------------------------------------
    def documents(self, rank: int, world: int, seed: int, epoch: int) -> Iterator[str]:
        """This process's documents for an epoch: shuffled (seeded, the same on every process), split by node,
        the held-out ones skipped."""
        from datasets.distributed import split_dataset_by_node

        ds = self.open()
        if self.d.shuffle_buffer:
            ds = ds.shuffle(seed=seed, buffer_size=self.d.shuffle_buffer)
            ds.set_epoch(epoch)
        if world > 1:
            ds = split_dataset_by_node(ds, rank=rank, world_size=world)
        for item in self.items(ds):
            if not self.held or self.key(item) not in self.held:
                yield item

    def items(self, ds) -> Iterator:
        """What a stream trains on, in the dataset's order: its texts (a task's stream: its records)."""
        return self.texts(ds)

    def key(self, item) -> bytes:
        """An item's digest: what the held-out set remembers it by."""
        return _digest(item)

    def batches(
        self,
        tokenizer,
        batch_size: int,
        block_length: int,
        packing: bool,
        part: Part = Part(),
        start: Position | None = None,
    ) -> Iterator[tuple[torch.Tensor, Position]]:
        """([batch_size, block_length] ids, the Position after them) of this process's ``part``, from ``start`` on;
        epochs follow one another when data.on_short is repeat, else the iterator ends with the stream."""
        pos = start or Position()
        rows: list[torch.Tensor] = []
        while True:
            docs = itertools.islice(self.documents(part.rank, part.world, part.seed, pos.epoch), pos.document, None)
            fresh = True
            for block, where in pack(docs, tokenizer, block_length, packing, pos):
                fresh = False
                rows.append(block)
                if len(rows) == batch_size:
                    yield torch.stack(rows), where
                    rows = []
            if self.d.on_short != "repeat" or (fresh and pos.document == 0):
                return  # stop; or repeat of a stream that gave nothing (would loop forever)
            pos = Position(pos.epoch + 1, 0, 0)
            log.info("data: the stream ended; epoch %d reads it again (data.on_short: repeat)", pos.epoch)
            rows = []


def _count_blocks(ids: list[list[int]], block_length: int, packing: bool) -> int:
    if packing:
        return sum(map(len, ids)) // block_length
    return sum(len(x) // block_length for x in ids)


def pack(
    docs: Iterator[str], tokenizer, block_length: int, packing: bool, start: Position
) -> Iterator[tuple[torch.Tensor, Position]]:
    """Blocks of ``block_length`` tokens from documents (EOS after each, as ``data.tokenize_documents``),
    tokenized ``TOKENIZE_BATCH`` at a time; each with the Position just after it. ``docs`` starts at
    ``start.document``; its first ``start.offset`` tokens were consumed before."""
    eos = specs.separator_id(tokenizer)
    buf: list[int] = []
    head = 0  # buf[head:] is not yet emitted
    lengths: list[int] = []  # token counts of the documents in buf, oldest first
    doc, off = start.document, start.offset  # the document at buf[head] and how far into it
    first = True
    while True:
        chunk = list(itertools.islice(docs, TOKENIZE_BATCH))
        if not chunk:
            return
        for ids in tokenizer(chunk, add_special_tokens=False)["input_ids"]:
            if eos is not None:
                ids = ids + [eos]
            if first and start.offset:
                ids = ids[start.offset :]
                lengths.append(len(ids) + start.offset)
            else:
                lengths.append(len(ids))
            first = False
            if packing:
                buf += ids
                while len(buf) - head >= block_length:
                    block = buf[head : head + block_length]
                    head += block_length
                    doc, off = _advance(lengths, doc, off, block_length)
                    yield torch.tensor(block, dtype=torch.long), Position(start.epoch, doc, off)
                if head > 1 << 16:
                    buf, head = buf[head:], 0
            else:
                done = lengths.pop(0) - len(ids)  # tokens of this document consumed before (a resume)
                n = len(ids) // block_length
                for i in range(n):
                    done += block_length
                    last = i == n - 1
                    where = Position(start.epoch, doc + 1, 0) if last else Position(start.epoch, doc, done)
                    yield torch.tensor(ids[i * block_length : (i + 1) * block_length], dtype=torch.long), where
                doc, off = doc + 1, 0


def _advance(lengths: list[int], doc: int, off: int, n: int) -> tuple[int, int]:
    """Move (document, offset) forward by n tokens over documents of the given lengths (consumed ones popped)."""
    while lengths and off + n >= lengths[0]:
        n -= lengths[0] - off
        lengths.pop(0)
        doc, off = doc + 1, 0
        if n == 0:
            return doc, off
    return doc, off + n
