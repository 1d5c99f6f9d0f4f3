"""What a fine-tune is told before any weights load: its data files are there, its model's config (``config.json``
alone: its task, whether it is an encoder, a trained classifier's classes) fits the recipe's ``task``, and the first
records of a classifier's or an embedding model's data hold the fields and labels the recipe reads.
``retrofit finetune --check`` runs it, and so does every fine-tune before it loads the model (``check``); the
classes a classifier trains are decided here (``classes``), so the model's head and the records' labels agree.

Torch-free: ``--check`` answers in about a second."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ..data import longdoc
from ..foundation.errors import DataError, RecipeError
from ..foundation.task import RECIPE_TASKS, is_encoder, of_class
from ..models import builtin

log = logging.getLogger(__name__)
FIRST_RECORDS = 64  # records read by the check (a stream's first ones; the run reads the rest)
_UNNAMED = re.compile(r"LABEL_\d+")  # transformers' names for classes nobody named


@dataclass(frozen=True)
class ModelFacts:
    """What a model's config says, read without its weights."""

    name: str
    task: str  # foundation.task's name: causal-lm, masked-lm, sequence-classification, embeddings, ...
    encoder: bool  # a bidirectional encoder (BERT, RoBERTa, ...): what a classifier or an embedding model is
    what: str  # its class or model type, for messages
    classes: tuple[str, ...] = ()  # a trained classifier's classes in head order
    converted: bool = False  # a retrofit checkpoint (it keeps its class)

    @property
    def named_classes(self) -> bool:
        return bool(self.classes) and not all(_UNNAMED.fullmatch(c) for c in self.classes)


def check(r) -> list[str]:
    """Everything that can be said against the recipe ``r`` before loading: raises a RecipeError or DataError on
    the first thing that cannot work; returns what could not be read here (a Hub model or dataset offline)."""
    notes = []
    _check_files(r.data)
    check_reach(r.model, r.convert, r.data.block_length)
    if r.task is None:  # a language model's fine-tune: its model is read when it loads
        return notes
    facts = model_facts(r.model.name_or_path, r.model.gguf_file)
    if facts is None:
        notes.append(f"model {r.model.name_or_path!r}: its config is not in the local cache; not read")
    if facts is not None:
        check_task_model(r, facts)
    if longdoc.is_spec(r.data.dataset):
        if facts is not None and r.task == "classification":
            classes(r, longdoc.task_of(r.data.dataset).labels, facts)
        return notes
    first = _first_records(r.data, notes)
    if first:
        _check_fields(r, first)
        if r.task == "classification":
            seen = _labels(first, r.data.label_field)
            _check_known_labels(r.data, seen, "its first records")
            whole = len(first) < FIRST_RECORDS or len(first) == r.data.max_documents  # every record was read
            if facts is not None and (r.data.labels or facts.named_classes or whole):
                classes(r, tuple(str(x) for x in (r.data.labels or seen)), facts, partial=not (r.data.labels or whole))
    return notes


# ---- the model ------------------------------------------------------------------------------------
def model_facts(name: str, gguf_file: str | None = None) -> ModelFacts | None:
    """The facts of a model argument read from its config alone: a built-in name, a GGUF file (a causal LM), a
    local folder (a retrofit checkpoint's original config restored), a Hub id from the local cache; None for a Hub
    id whose config is not cached here."""
    if name.startswith(builtin.PREFIXES):
        return _builtin_facts(name)
    if gguf_file or name.endswith(".gguf"):
        return ModelFacts(name, "causal-lm", False, "a GGUF checkpoint")
    path = Path(name).expanduser()
    config = path / "config.json" if path.is_dir() else _cached_hub_config(name)
    if config is None or not Path(config).is_file():
        return None  # loading says what is wrong with it (sources.precheck, sources.check)
    try:
        d = json.loads(Path(config).read_text())
    except (OSError, ValueError):
        return None  # loading says what is wrong with it
    converted = isinstance(d.get("retrofit"), dict)
    if converted:
        d = {**d, **(d["retrofit"].get("base_config") or {})}
    arch = (d.get("architectures") or [None])[0]
    cfg = SimpleNamespace(**{k: d.get(k) for k in ("model_type", "is_decoder", "is_encoder_decoder")})
    task = of_class(arch).name
    # transformers leaves its default out of config.json: 2 classes named LABEL_0, LABEL_1 (nobody named them)
    id2label = d.get("id2label") or {str(i): f"LABEL_{i}" for i in range(d.get("num_labels") or 2)}
    names = tuple(str(id2label[k]) for k in sorted(id2label, key=int)) if task == "sequence-classification" else ()
    return ModelFacts(name, task, is_encoder(cfg), arch or str(d.get("model_type")), names, converted)


def check_reach(model, convert, block_length: int) -> None:
    """'data.block_length' past the positions the model reads once converted, from its config.json (``model``: the
    recipe's section, a local folder or a run folder) and the recipe's ``convert`` section: a scheme with a limit (``extend``'s ``length``) or, with
    no conversion, a converted checkpoint's own limit. A RecipeError naming the limit and the fix, before torch;
    the blocks' spread positions (``train.positions``) are checked when the model is built."""
    from ..foundation import catalog, run_folder
    from ..foundation.native import converted_limit, native_length, rows_of

    path = Path(model.name_or_path).expanduser()
    found = next((f for f in (path / "config.json", path / run_folder.FINAL / "config.json") if f.is_file()), None)
    try:
        config = json.loads(found.read_text()) if found else None
    except (OSError, ValueError):
        return  # loading says what is wrong with it
    if not isinstance(config, dict):
        return
    scheme, native = convert.scheme, native_length(config)
    if scheme is None:
        limited = converted_limit(config)
        fix = "convert it with a longer table ('convert.scheme: extend', 'convert.options.length')"
    else:
        key = catalog.entry(scheme).limit
        given = convert.options.get(key) if key else None
        limited = (scheme, rows_of(given, native or 0, f"convert.options.{key}")) if given and native else None
        fix = f"a larger 'convert.options.{key}'"
    if limited is not None and block_length > limited[1]:
        raise RecipeError(
            f"'data.block_length' = {block_length} exceeds the {limited[1]} positions {model.name_or_path!r} "
            f"reads with scheme {limited[0]!r}: lower 'data.block_length' to at most {limited[1]}, or {fix}"
        )


def _builtin_facts(name: str) -> ModelFacts | None:
    task = builtin.task_of(name)
    if task is None:
        preset = builtin.standin_preset(name)
        if preset is not None:  # an unknown preset: the error that names the presets, now
            from ..models.standin import get_config

            get_config(preset)
        return None  # not a built-in name after all: loading reads it as a path or a Hub id
    # a built-in is a causal LM or an encoder: a masked LM (a stand-in) or an embedding model (minilm)
    return ModelFacts(name, task, task != "causal-lm", f"the built-in {task} model")


def _cached_hub_config(name: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    try:
        hit = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not shaped like a Hub id: loading says so
        return None
    return hit if isinstance(hit, str) else None


def check_task_model(r, facts: ModelFacts) -> None:
    """A classifier or an embedding model is an encoder's (it reads the whole document both ways): a decoder is
    refused, and so is a retrofit checkpoint saved as another task's class (it keeps its class)."""
    if not facts.encoder:
        raise RecipeError(
            f"'task: {r.task}' trains an encoder (a bidirectional model: BERT, RoBERTa, ...); "
            f"{facts.name!r} is a {facts.task} model ({facts.what}), which reads left to right and has no "
            f"{'classification head' if r.task == 'classification' else 'embedding form'} retrofit trains: start "
            "from an encoder's checkpoint, or drop 'task' to fine-tune it as the language model it is"
        )
    if facts.converted and facts.task != RECIPE_TASKS[r.task]:
        raise RecipeError(
            f"'task: {r.task}' needs a {RECIPE_TASKS[r.task]} model; {facts.name!r} is a converted "
            f"{facts.what}, which keeps its class: start from the original checkpoint with "
            "'convert.scheme' in the recipe (it loads as the task's class, then converts)"
        )


def classes(r, names: tuple[str, ...], facts: ModelFacts | None, partial: bool = False) -> tuple[str, ...]:
    """The classes a classifier fine-tune trains, in head order: the checkpoint's own when it is a trained classifier
    whose classes are the records' labels (its head kept, in its order); the records' ``names`` for a new head (a
    masked LM's checkpoint, classes never named, or ``model.new_head: true``). A trained classifier whose classes
    differ is refused, naming both. ``partial``: ``names`` are the labels of the first records only (a subset)."""
    if facts is None or facts.task != "sequence-classification" or r.model.new_head:
        return names
    have = facts.classes
    if facts.named_classes:
        fits = set(names) <= set(have) if partial else set(names) == set(have)
        ordered = not r.data.labels or list(r.data.labels) == list(have)
        if fits and ordered:
            return names if partial else have
    elif len(names) == len(have) and not partial:
        log.info("classes: the checkpoint's %d unnamed classes are named %s, in that order", len(have), names)
        return names
    elif partial:
        return names
    raise RecipeError(
        f"{facts.name!r} is a classifier of {len(have)} classes ({', '.join(have)}); the recipe's labels are "
        f"{', '.join(names)}{' (data.labels, in this order)' if r.data.labels else ''}. Training on them would "
        "replace or rename its trained head: give records of its own classes (data.labels in its order), or set "
        "'model.new_head: true' to start a new classification head of the recipe's labels"
    )


# ---- the data ---------------------------------------------------------------------------------------
def _check_files(d) -> None:
    """Every ``data.files`` entry names a file, a folder or a glob that matches something here."""
    from ..data.specs import expand_paths

    listed = [d.files] if isinstance(d.files, str) else d.files or []
    for spec in listed:
        try:
            expand_paths(spec, lambda f: True, "files")
        except DataError as e:  # no such file, an empty folder, a glob that matches nothing
            raise DataError(f"data.files: {e} (relative paths are read from {Path.cwd()})") from None


def _first_records(d, notes: list[str]) -> list[dict]:
    """The first records of a task's data (``data.files`` or a Hub dataset streamed); a Hub dataset that cannot be
    read here is noted, not an error (the run reads it where the Hub answers)."""
    from ..data.specs import records
    from ..foundation.errors import HubError

    try:
        first = records(d, first=FIRST_RECORDS)
    except HubError as e:
        if d.files is not None:
            raise
        notes.append(f"dataset {d.dataset!r}: not read here ({str(e).splitlines()[0]})")
        return []
    if not first:
        raise DataError(f"{d.files or d.dataset!r} holds no records")
    return first


def _check_fields(r, first: list[dict]) -> None:
    d = r.data
    keys = (
        [("data.text_field", d.text_field), ("data.label_field", d.label_field)]
        if r.task == "classification"
        else [("data.query_field", d.query_field), ("data.document_field", d.document_field)]
    )
    for i, rec in enumerate(first):
        for key, f in keys:
            if f not in rec:
                raise DataError(
                    f"record {i + 1} of {d.files or d.dataset!r} has no field {f!r} ({key}; its fields: "
                    f"{', '.join(rec) or 'none'}): set {key} to the field that holds it"
                )


def _labels(recs: list[dict], field: str) -> tuple[str, ...]:
    return tuple(sorted({str(rec[field]) for rec in recs if field in rec}))


def _check_known_labels(d, seen, where: str) -> None:
    """With ``data.labels`` given (``d``: the data section), each label read must be one of them."""
    if not d.labels:
        return
    known = {str(x) for x in d.labels}
    outside = [x for x in seen if x not in known]
    if outside:
        raise DataError(
            f"{where} hold the label(s) {', '.join(map(repr, outside))}, not among data.labels "
            f"({', '.join(map(str, d.labels))}): add them to data.labels or fix the records"
        )


def check_all_labels(d, recs: list[dict]) -> None:
    """Every record's label among ``data.labels`` (``d``: the data section; the run reads the records whole: all of
    them, before loading)."""
    _check_known_labels(d, _labels(recs, d.label_field), "the records")
