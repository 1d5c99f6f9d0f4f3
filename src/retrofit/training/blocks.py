"""Documents -> fixed-length token blocks, and a resumable, seeded data order."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset, Sampler

from ..data import specs
from ..foundation.errors import DataError, LengthError

log = logging.getLogger(__name__)


def load_recipe_documents(cfg) -> list[specs.Document]:
    """The documents a recipe's ``data`` section names (DataError when missing)."""
    if cfg.files is not None:
        docs = specs.load_documents(cfg.files)
    elif specs.source_kind(cfg.dataset) in ("stdlib", "shakespeare"):  # else a `datasets` name or folder
        docs = specs.load_documents(cfg.dataset)
    else:
        name = cfg.dataset if cfg.config is None else f"{cfg.dataset}:{cfg.config}"
        docs = specs.hub_documents(name, field=cfg.text_field, split=cfg.split)
    if cfg.max_documents is not None:
        docs = docs[: cfg.max_documents]
    if not docs:
        raise DataError("the recipe's data section names no documents")
    return docs


def documents(d, seed: int):
    """The ``data`` section's documents, split into (training, validation) whole documents (seeded)."""
    docs = load_recipe_documents(d)
    return specs.split_documents(docs, d.validation_fraction, seed=seed)


def datasets(d, tok, docs: tuple, need: int):
    """(training, validation) blocks of the ``data`` section from its (training, validation) documents; ``need``:
    the blocks one step takes (train.batch_size x processes), fewer training blocks are a LengthError."""
    train_docs, val_docs = docs
    train_ids = specs.tokenize_documents(tok, train_docs)
    train = make_blocks(train_ids, d.block_length, d.packing)
    check_blocks(train, train_ids, d.block_length, d.packing, "training")
    val = torch.empty(0, d.block_length, dtype=torch.long)
    if val_docs:
        val_ids = specs.tokenize_documents(tok, val_docs)
        val = make_blocks(val_ids, d.block_length, d.packing)[: d.max_validation_blocks]
    if not len(val):
        _say_no_validation(d, val_docs)
    if len(train) < need:
        raise LengthError(
            f"only {len(train)} training blocks of 'data.block_length' = {d.block_length}; "
            f"train.batch_size x processes needs {need}"
        )
    log.info("data: %d training blocks, %d validation blocks of %d tokens", len(train), len(val), d.block_length)
    return train, val


def stream_validation(d, tok, source):
    """A stream's validation blocks (said when there are none though documents were asked for)."""
    val = source.validation(tok, d.block_length, d.packing, d.max_validation_blocks)
    if not len(val) and d.validation_documents != 0:
        log.warning("no validation loss: the validation documents give no block of %d tokens", d.block_length)
    return val


def _say_no_validation(d, val_docs) -> None:
    """Why this fine-tune has no validation loss: chosen (a warning when it was not)."""
    if d.validation_fraction == 0:
        log.info("no validation loss: data.validation_fraction is 0")
    elif not val_docs:
        log.warning(
            "no validation loss: too few documents to hold one out for validation (data.validation_fraction "
            "= %g); add documents",
            d.validation_fraction,
        )
    else:
        log.warning(
            "no validation loss: the validation documents give no block of %d tokens; raise "
            "data.validation_fraction or lower data.block_length",
            d.block_length,
        )


def make_blocks(token_docs: list[list[int]], block_length: int, packing: bool) -> torch.Tensor:
    """[n_blocks, block_length] int64. Packing concatenates documents; otherwise each is cut alone."""
    docs = [torch.tensor(doc, dtype=torch.long) for doc in token_docs if doc]
    if packing:
        flat = torch.cat(docs) if docs else torch.empty(0, dtype=torch.long)
        n = len(flat) // block_length
        return flat[: n * block_length].view(n, block_length).clone()
    rows = [d[: len(d) // block_length * block_length].view(-1, block_length) for d in docs]
    return torch.cat(rows) if rows else torch.empty(0, block_length, dtype=torch.long)


def check_blocks(
    blocks: torch.Tensor, token_docs: list[list[int]], block_length: int, packing: bool, what: str
) -> None:
    if len(blocks):
        return
    total = sum(map(len, token_docs))
    longest = max(map(len, token_docs), default=0)
    if packing:
        raise LengthError(
            f"'data.block_length' = {block_length} is larger than all the {what} text together "
            f"({total} tokens in {len(token_docs)} documents); lower it or add data"
        )
    raise LengthError(
        f"'data.block_length' = {block_length} is larger than every {what} document "
        f"(longest: {longest} tokens); lower it, add data or set data.packing: true"
    )


class Blocks(Dataset):
    """The rows of a (n, L) tensor of blocks, or of any list (a task's examples)."""

    def __init__(self, blocks):
        self.blocks = blocks

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return self.blocks[i]


class EpochShuffle(Sampler):
    """A permutation of ``range(n)`` that depends only on (seed, epoch).

    The loop sets ``epoch`` itself (the attribute is deliberately not called ``set_epoch``, so
    that Accelerate's loader wrappers leave it alone). Every process draws the same order;
    Accelerate shards the batches. Resuming = same epoch + skip the batches already seen.
    """

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def __len__(self):
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())


@dataclass
class Position:
    """Where micro-batch number ``micro`` falls: (epoch, batches to skip in that epoch)."""

    epoch: int
    skip: int

    @classmethod
    def of(cls, micro: int, batches_per_epoch: int) -> "Position":
        return cls(micro // batches_per_epoch, micro % batches_per_epoch)
