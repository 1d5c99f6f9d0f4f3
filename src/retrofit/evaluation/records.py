"""A classifier's or an embedding model's own records as the documents of the long-document measure
(``evaluation.longdoc``): the held-out part of the records its run fine-tuned on (the split the fine-tune made,
``data.specs.heldout_split``), or every record of ``--data`` (json/jsonl/csv/parquet files or a Hub dataset).

Records are not built at a length: each is read whole (cut at the longest evaluated length) and falls in the bin of
the first length that holds it, so the report's columns are "documents up to 512 tokens", "up to 1,024", ..."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ..data import longdoc
from ..data.longdoc import Example
from ..data.specs import expand_paths, heldout_split, is_record_file, records, source_kind
from ..foundation import run_folder
from ..foundation.errors import DataError, OptionError

# the fields a record is read by when no run's recipe names them (the recipe's own defaults)
FIELDS = {"text_field": "text", "label_field": "label", "query_field": "query", "document_field": "document"}


@dataclass(frozen=True)
class Records:
    """Records to evaluate on: ``data`` holds a recipe data section's fields (files or dataset, config, split,
    max_documents and the *_field names); ``heldout`` (seed, fraction, most) keeps only its fine-tune's held-out
    split, None keeps every record."""

    data: SimpleNamespace
    label: str
    heldout: tuple[int, float, int] | None = None


def is_source(data) -> bool:
    """Whether an eval's ``data`` names what a classifier or an embedding model is evaluated on."""
    return longdoc.is_spec(data) or isinstance(data, Records)


def may_hold_records(spec) -> bool:
    """Whether ``--data`` may name records (a Hub dataset, record files): read only once the model says it is a
    classifier or an embedding model. Text files and the built-in corpora are never records."""
    if not isinstance(spec, str):
        return False
    kind = source_kind(spec)
    if kind != "files":
        return kind == "hub"
    try:
        return any(is_record_file(f) for f in expand_paths(spec, lambda f: True, "files"))
    except DataError:
        return False  # a missing path: reading it says so


def source_for(data, model_path, given: bool):
    """What a classifier or an embedding model is evaluated on: ``data`` when it is a ``longdoc:`` spec, Records, or
    (``given``) the user's own records; else what its run fine-tuned on (its recipe's ``data``). An OptionError
    naming the choices otherwise."""
    if is_source(data):
        if isinstance(data, str):
            longdoc.task_of(data)  # an unknown task fails here
        return data
    run = _run_data(model_path)
    if given:
        return _own(data, run)
    if run is not None and longdoc.is_spec(run[0].get("dataset")) and run[0].get("files") is None:
        return run[0]["dataset"]
    if run is not None:
        d, train = run
        what = f"the held-out records of {d['files'] or d['dataset']}"
        if d.get("streaming"):  # a streamed fine-tune held out the first records (of validation_split, if named)
            split = d["validation_split"] or d["split"]
            return Records(SimpleNamespace(**{**d, "split": split, "max_documents": d["max_validation_blocks"]}), what)
        return Records(
            SimpleNamespace(**d), what, (train["seed"], d["validation_fraction"], d["max_validation_blocks"])
        )
    raise OptionError(
        "a classifier or an embedding model is evaluated on a long-document task or on records: pass --data with one "
        "of " + ", ".join(longdoc.PREFIX + n for n in longdoc.TASKS) + ", json/jsonl/csv/parquet files or a dataset"
    )


def _run_data(model_path) -> tuple[dict, dict] | None:
    """(the data section, the train section) of the recipe of the run ``model_path`` is (or is final/ of)."""
    if not isinstance(model_path, (str, Path)):
        return None
    p = Path(model_path)
    for d in (p, p.parent):
        r = run_folder.recipe(d)
        if r and r.get("data"):
            return r["data"], r.get("train") or {}
    return None


def _own(spec: str, run) -> Records:
    """``--data``'s records, read by the run's field names (else the defaults)."""
    fields = {k: (run[0].get(k) or v) if run else v for k, v in FIELDS.items()}
    if source_kind(spec) == "files":
        d = SimpleNamespace(files=spec, dataset=None, config=None, split="train", max_documents=None, **fields)
    elif source_kind(spec) == "hub":
        name, config, split = (spec.split(":") + [None, None])[:3]
        d = SimpleNamespace(
            files=None, dataset=name, config=config, split=split or "test", max_documents=None, **fields
        )
    else:
        raise OptionError(f"--data {spec!r} holds no records; a classifier or embedding model reads records or a task")
    return Records(d, spec)


def examples(src: Records, tokenizer, names: tuple[str, ...], longest: int, native: int) -> list[Example]:
    """The records as documents of the measure: ids cut at ``longest``; the label's index in ``names`` (a
    classifier's classes) or the query's ids cut at ``native`` (an embedding model's pair)."""
    recs = records(src.data)
    if src.heldout is not None:
        recs = heldout_split(recs, *src.heldout)[1]
    if not recs:
        raise DataError(f"{src.label}: no records to evaluate")
    d, out = src.data, []
    for rec in recs:
        check_record(rec, d, names)
        ids = tokenizer(str(rec[d.text_field if names else d.document_field]), truncation=True, max_length=longest)
        ids = ids.input_ids
        if names:
            out.append(Example(ids, label=_class_index(rec[d.label_field], names)))
        else:
            out.append(
                Example(ids, query=tokenizer(str(rec[d.query_field]), truncation=True, max_length=native).input_ids)
            )
    return out


def check_record(rec: dict, d, names: tuple[str, ...]) -> None:
    """The one rule of a record (``names``: a classifier's classes, () for an embedding model's pairs): its fields
    there (text and label, or document and query), its label one of the classes. The measure holds every record to
    it; ``preflight`` the first records of local files, before the model loads."""
    keys = ("text_field", "label_field") if names else ("document_field", "query_field")
    fields = tuple(getattr(d, k) for k in keys)
    missing = [(f, k) for f, k in zip(fields, keys) if f not in rec]
    if missing:
        raise DataError(
            f"a record has no field {missing[0][0]!r} (fields: {', '.join(rec)}); set data.{missing[0][1]} "
            "to the field that holds it"
        )
    if names:
        _class_index(rec[d.label_field], names)


def class_names(id2label: dict | None, num_labels: int) -> tuple[str, ...]:
    """A classifier's class names in index order, from its config's ``id2label`` (int or str keys)."""
    id2label = id2label or {}
    return tuple(str(id2label.get(i, id2label.get(str(i), i))) for i in range(num_labels))


def _class_index(label, names: tuple[str, ...]) -> int:
    """A record's class: by name, else (an integer label, and classes named only by index: LABEL_0 ...) by index."""
    if str(label) in names:
        return names.index(str(label))
    if isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(names):
        return label
    raise DataError(f"a record's label {label!r} is not one of the model's classes ({', '.join(names)})")
