"""Documents -> fixed-length token blocks, and a resumable, seeded data order."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset, Sampler

from ..data import specs as rdata
from ..foundation.errors import DataError, LengthError

log = logging.getLogger(__name__)


def load_recipe_documents(cfg) -> list[rdata.Document]:
    """The documents a recipe's ``data`` section names (DataError when missing)."""
    if cfg.files is not None:
        docs = rdata.load_documents(cfg.files)
    elif rdata.source_kind(cfg.dataset) in ("stdlib", "shakespeare"):  # else a `datasets` name or folder
        docs = rdata.load_documents(cfg.dataset)
    else:
        name = cfg.dataset if cfg.config is None else f"{cfg.dataset}:{cfg.config}"
        docs = rdata.hub_documents(name, field=cfg.text_field, split=cfg.split)
    if cfg.max_documents is not None:
        docs = docs[: cfg.max_documents]
    if not docs:
        raise DataError("the recipe's data section names no documents")
    return docs


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
