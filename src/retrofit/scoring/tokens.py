"""The token stream every model of a run is scored on."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..data.specs import Document, fingerprint, load_documents, separator_id
from ..foundation.errors import LengthError

log = logging.getLogger(__name__)


@dataclass
class TokenStream:
    """``ids`` [n + 1]: one context token, then the ``n`` scored targets (n % max(lengths) == 0)."""

    ids: torch.Tensor
    spec: str
    documents: int
    available: int  # tokens the data could give (at most budget + 1 were tokenized)
    fingerprint: str

    @property
    def targets(self) -> int:
        return self.ids.numel() - 1

    def describe(self) -> dict:
        return {
            "spec": self.spec,
            "documents": self.documents,
            "tokens": self.targets,
            "fingerprint": self.fingerprint,
        }


def first_tokens(tokenizer, docs: list[Document], want: int, separator: str | None = None) -> tuple[list[int], int]:
    """The first ``want`` ids of the documents (tokenized lazily), and how many documents that took.

    Documents are joined with EOS (SEP for a tokenizer without EOS: ``data.separator_id``), or with the text
    ``separator`` when given (e.g. ``"\n\n"`` for datasets whose rows are paragraphs, such as wikitext).
    """
    eos = separator_id(tokenizer)
    ids: list[int] = []
    used = 0
    for d in docs:
        if len(ids) >= want:
            break
        text = d.text if separator is None else d.text + separator
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if separator is None and eos is not None:
            ids.append(eos)
        used += 1
    return ids[:want], used


def build_stream(
    tokenizer, docs: list[Document], spec: str, budget: int, lengths: list[int], separator: str | None = None
) -> TokenStream:
    """First ``budget`` targets (+1 context token), cut to a multiple of the largest length.

    A budget below the largest length is raised to it (one window). Raises LengthError when the
    text is shorter than the largest length.
    """
    longest = max(lengths)
    if budget < longest:
        log.warning(
            "token budget %d is smaller than the largest length %d; scoring one window of %d", budget, longest, longest
        )
        budget = longest
    ids, used = first_tokens(tokenizer, docs, budget + 1, separator)
    available = len(ids) - 1
    if available < longest:
        raise LengthError(
            f"length {longest} is larger than the available text: {spec!r} gives only {max(available, 0)} tokens "
            f"(+1 context token); use shorter lengths or more data"
        )
    n = (min(budget, available) // longest) * longest
    ids = ids[: n + 1]
    if n < budget:
        log.warning("data %r gives %d tokens, fewer than the budget %d; scoring %d", spec, available, budget, n)
    return TokenStream(torch.tensor(ids, dtype=torch.long), spec, used, available, fingerprint(ids))


def resolve_documents(data, max_tokens: int | None = None) -> tuple[list[Document], str]:
    """A data spec (see ``retrofit.data.specs``) or a list of ``Document`` -> documents and a label. ``max_tokens``:
    a Hub dataset is streamed until it holds about that many tokens (``retrofit.data.specs.load_documents``)."""
    if isinstance(data, (list, tuple)) and data and all(isinstance(d, Document) for d in data):
        return list(data), f"{len(data)} documents"
    return load_documents(data, max_tokens=max_tokens), data if isinstance(data, str) else ",".join(map(str, data))
