"""What an evaluation is told before any weights load, from a local model's ``config.json`` alone (a folder, or a
run folder's final model): the task it is evaluated on (a classifier's or an embedding model's data is decided
here: its ``longdoc:`` task or records), and lengths given past a converted checkpoint's limit (``extend``'s
table). ``retrofit eval`` runs it before importing torch, ``evaluate`` before loading; the measures check the same
again on the loaded models. Torch-free: these errors answer within a second."""

from __future__ import annotations

import json
from pathlib import Path

from ..data import longdoc
from ..data.specs import records as read_records
from ..foundation import run_folder, task
from ..foundation.native import converted_limit, native_length
from . import records
from .lengths import past_limit, reads_past, resolve
from .options import EvalOptions

FIRST_RECORDS = 64  # records of --data read before loading (the measure reads them all)

READS_DOCUMENTS = ("sequence-classification", "embeddings")  # models evaluated on documents (evaluation.longdoc)


def config_of(model) -> dict | None:
    """The ``config.json`` of a local model folder or run folder (its final model), None for anything else (a Hub id,
    a built-in name, a model in memory) or a config that cannot be read (loading says what is wrong)."""
    folder = Path(str(model)).expanduser() if isinstance(model, (str, Path)) else None
    if folder is None:
        return None
    found = next((f for f in (folder / "config.json", folder / run_folder.FINAL / "config.json") if f.is_file()), None)
    try:
        return json.loads(found.read_text()) if found else None
    except (OSError, ValueError):
        return None


def task_of_config(config: dict) -> str | None:
    """The task a config's class names (``architectures``), None when it names none."""
    arch = (config.get("architectures") or [None])[0]
    return task.of_class(arch).name if arch else None


def check(model, o: EvalOptions, default_lengths: bool) -> None:
    """Raise what ``model``'s config rules out: a classifier or an embedding model without data to read (or with a
    ``--data`` it cannot read), lengths given past a converted checkpoint's limit (``default_lengths``: the lengths
    were not given, and stop at the limit by themselves)."""
    config = config_of(model)
    kind = task_of_config(config) if config else None
    if kind is None:
        return
    if kind in READS_DOCUMENTS:
        source = records.source_for(o.data, model, given=o.data != EvalOptions.data)
        classes = len(config.get("id2label") or {}) or config.get("num_labels")
        if longdoc.is_spec(source):  # a task of the other kind, or of other classes: said before loading
            longdoc.check_reader(str(model), kind, longdoc.task_of(source), classes)
        elif isinstance(source, records.Records) and source.data.files is not None:  # local files: their first ones
            names = records.class_names(config.get("id2label"), classes or 2) if kind != "embeddings" else ()
            for rec in read_records(source.data, first=FIRST_RECORDS):
                records.check_record(rec, source.data, names)
    limited = converted_limit(config)
    if limited is None:
        return
    scheme, limit = limited
    native, name = native_length(config), str(model)
    lengths = None if default_lengths else resolve(o.lengths, native)
    if kind in READS_DOCUMENTS:
        if lengths:
            reads_past(name, limit, lengths)
        return
    if kind != "causal-lm":
        return  # a masked LM's measure leaves out the lengths past its limit
    if lengths:
        past_limit(name, scheme, limit, lengths, "lengths")  # perplexity: every causal LM's
    for on, items, what in ((o.passkey, o.passkey_lengths, "passkey"), (o.recall, o.recall_lengths, "recall")):
        own = resolve(items, native, f"{what} lengths") if items else lengths
        if on and own:
            past_limit(name, scheme, limit, own, f"{what} lengths")
