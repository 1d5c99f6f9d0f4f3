"""A run folder: what ``retrofit convert``, ``retrofit finetune`` and ``retrofit run`` leave behind,
named and read in this one place.

- ``retrofit convert ... --out DIR``: DIR is a retrofit checkpoint (``config.json`` + safetensors), with
  ``calibrate.json`` when ``--calibrate`` trained its position parameters first.
- ``retrofit finetune``: ``final/`` (the merged, patched checkpoint), ``adapter/`` (LoRA),
  ``checkpoints/``, ``log.jsonl``, ``recipe.yaml`` (resolved), ``versions.json``, ``calibrate.json`` (with
  ``convert.calibrate``), ``summary.json``
  (written last: a fine-tune is complete when it exists). A fine-tune may write into the folder its
  model came from, so DIR can hold a checkpoint and ``final/``.
- ``retrofit run``: the above plus ``run.yaml``, ``manifest.json``, ``eval/`` (``report.json``,
  ``report.md``, plots), ``export/`` (a native export, with ``retrofit_export.json``) and ``README.md``. ``retrofit export RUN --native
  --out DIR`` records DIR in ``manifest.json`` (``export``), so push and the card find an export written anywhere.

The commands that consume a result (eval, export, card, push) read the newest model in it:
``final/`` when there is one, else DIR itself.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import yaml

from .atomic import write_text
from .errors import RetrofitError
from .native import native_length as read_native_length

log = logging.getLogger(__name__)

FINAL = "final"
ADAPTER = "adapter"
ADAPTER_BASE = "retrofit_base.json"  # in adapter/: the base model and the conversion the adapter goes on
CHECKPOINTS = "checkpoints"
EVAL = "eval"
SUMS = "SHA256SUMS"  # a shipped folder's checksums of its files (models.standin's stand-ins)
EXPORT = "export"
RECIPE = "recipe.yaml"  # the fine-tune's resolved recipe
RUN_RECIPE = "run.yaml"  # the pipeline's resolved recipe
SUMMARY = "summary.json"
VERSIONS = "versions.json"
MANIFEST = "manifest.json"
LOG = "log.jsonl"
CARD = "README.md"
REPORT = "report.json"
REPORT_MD = "report.md"
EXPORT_RECORD = "retrofit_export.json"
CALIBRATE = "calibrate.json"  # convert --calibrate / a recipe's convert.calibrate: the record of the calibration
RANK_CHECKSUMS = "rank_checksums"  # train.rank_checksums: rank<i>.txt, the trainable weights' hash on each process
PLOT_PPL = "ppl_vs_length.png"  # an eval folder's plots
PLOT_POSITIONS = "loss_by_position.png"
PLOT_PASSKEY = "passkey.png"
PLOT_RECALL = "recall.png"
# a study's folder (retrofit study): one pipeline run per cell under cells/, then its report and plot
STUDY_CELLS, STUDY_CELL, STUDY_ORIGINAL = "cells", "cell.json", "original.json"
STUDY_REPORT, STUDY_REPORT_MD, STUDY_PLOT = "study.json", "study.md", PLOT_PPL
_told: set[str] = set()


def is_model_dir(path: Path) -> bool:
    return (Path(path) / "config.json").is_file() and any(Path(path).glob("*.safetensors"))


def model_dir(path) -> Path:
    """The model a run folder holds: ``final/`` if it has one, else the folder (unchanged when neither)."""
    path = Path(path)
    final = path / FINAL
    if is_model_dir(final):
        if is_model_dir(path) and str(path) not in _told:
            _told.add(str(path))
            log.info("%s holds a checkpoint and a fine-tuned %s/: using %s", path, FINAL, final)
        return final
    return path


def finetune_complete(run_dir: Path) -> bool:
    """A finished fine-tune: final/ with config and weights, and summary.json (written after final/)."""
    return is_model_dir(Path(run_dir) / FINAL) and (Path(run_dir) / SUMMARY).is_file()


def read_json(path: Path):
    return json.loads(Path(path).read_text()) if Path(path).is_file() else None


def summary(run_dir: Path) -> dict | None:
    return read_json(Path(run_dir) / SUMMARY)


def versions(run_dir: Path) -> dict | None:
    return read_json(Path(run_dir) / VERSIONS)


def manifest(run_dir: Path) -> dict | None:
    return read_json(Path(run_dir) / MANIFEST)


def report(run_dir: Path) -> dict | None:
    return read_json(Path(run_dir) / EVAL / REPORT)


def recipe(run_dir: Path) -> dict | None:
    """The run's recipe (run.yaml, else recipe.yaml); None for a folder written by ``retrofit convert``."""
    for name in (RUN_RECIPE, RECIPE):
        p = Path(run_dir) / name
        if p.is_file():
            return yaml.safe_load(p.read_text()) or {}
    return None


def run_of(source) -> Path:
    """The run folder a model folder belongs to: the folder holding ``final/``, else the folder itself."""
    source = Path(source)
    return source.parent if source.name == FINAL else source


def record_export(source, out) -> Path | None:
    """Write where a native export of ``source`` (a run folder, its ``final/``, or a checkpoint) went into the run
    folder's ``manifest.json`` (``export``: the folder, relative to the run when inside it), so ``retrofit push`` and
    the card find an export written anywhere (``export_dir``). A shipped stand-in (its ``SHA256SUMS``) is left
    as it is: nothing is recorded there. Returns the manifest written, or None."""
    run_dir, out = run_of(source).resolve(), Path(out).resolve()
    if not run_dir.is_dir() or (run_dir / "SHA256SUMS").is_file():
        return None
    data = manifest(run_dir) or {"stages": {}}
    data[EXPORT] = str(out.relative_to(run_dir)) if out.is_relative_to(run_dir) else str(out)
    return write_text(run_dir / MANIFEST, json.dumps(data, indent=2) + "\n")


def export_dir(run_dir: Path) -> Path:
    """Where the run's native export is: the folder its manifest records (``record_export``) when it still holds
    an export, else ``export/``."""
    run_dir = Path(run_dir)
    recorded = (manifest(run_dir) or {}).get(EXPORT)
    if isinstance(recorded, str) and (run_dir / recorded / "config.json").is_file():
        return run_dir / recorded  # an absolute path stays itself
    return run_dir / EXPORT


def export_record(run_dir: Path) -> dict | None:
    """The native export's own record, or None when the folder has no (complete) export."""
    export = export_dir(run_dir)
    if not (export / "config.json").is_file():
        return None
    return read_json(export / EXPORT_RECORD)


ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")  # an embedding model's


def st_files(folder: Path) -> list[Path]:
    """An embedding model's sentence-transformers files in ``folder``, relative to it: its own configs and its
    modules' folders (``modules.json``: e.g. ``1_Pooling/config.json``), what ``SentenceTransformer(folder)`` reads
    besides the weights and the tokenizer. [] for any other model."""
    folder = Path(folder)
    if not (folder / "modules.json").is_file():
        return []
    mods = [m.get("path") for m in json.loads((folder / "modules.json").read_text())]
    own = [Path(n) for n in ST_FILES if (folder / n).is_file()]
    return own + [
        f.relative_to(folder) for m in mods if m and (folder / m).is_dir() for f in sorted((folder / m).glob("*.json"))
    ]


def published_layout(run_dir) -> dict[str, Path]:
    """{path prefix in the repo: local weights folder}. An exact native export goes to the repo root
    (plain transformers loads it) and replaces the retrofit checkpoint; an inexact one goes to
    ``native/`` beside the retrofit checkpoint at the root; without an export the root is the
    retrofit checkpoint (``final/``)."""
    run_dir = Path(run_dir)
    record = export_record(run_dir)
    if record and record.get("exact"):
        return {"": export_dir(run_dir)}
    folder = model_dir(run_dir)
    if not is_model_dir(folder):
        raise RetrofitError(
            f"{run_dir} holds no model (config.json and *.safetensors, in it or in its final/): "
            "push a folder written by `retrofit convert`, `retrofit finetune` or `retrofit run`"
        )
    return {"": folder, **({"native/": export_dir(run_dir)} if record else {})}


def published_weights(run_dir) -> str:
    """'native' when the repo root holds a native transformers checkpoint, else 'retrofit'."""
    return "native" if published_layout(run_dir)[""] == export_dir(run_dir) else "retrofit"


def retrofit_block(model_folder: Path) -> dict:
    """The ``retrofit`` block of a checkpoint's config.json ({} for a plain model)."""
    return (read_json(Path(model_folder) / "config.json") or {}).get("retrofit") or {}


def original_source(path) -> dict | None:
    """What "the original" of the model in ``path`` (a run folder, its ``final/``, or a ``retrofit convert``
    checkpoint) is, from what the run saved: ``{"name_or_path", "gguf_file", "dtype"}`` for ``load_model``, then
    reverted if it is itself a retrofit checkpoint (as a recipe's ``baselines: [original]``); None when
    nothing says (a plain model is its own original). The recipe's model when it is here to load (a local
    folder, e.g. the converted checkpoint a fine-tune went on from), else the base model the conversion
    recorded (``retrofit.base_model``), else the recipe's name as written (a Hub id)."""
    path = Path(path)
    runs = [path, path.parent] if path.name == FINAL else [path]
    model = next(((recipe(d) or {}).get("model") or {} for d in runs if recipe(d)), {})
    from_recipe = {
        "name_or_path": model.get("name_or_path"),
        "gguf_file": model.get("gguf_file"),
        "dtype": model.get("dtype"),
    }
    base = retrofit_block(model_dir(path)).get("base_model")
    if from_recipe["name_or_path"] and Path(from_recipe["name_or_path"]).expanduser().exists():
        return from_recipe
    if base:
        return {"name_or_path": str(base), "gguf_file": None, "dtype": from_recipe["dtype"]}
    return from_recipe if from_recipe["name_or_path"] else None


def native_length(model_folder: Path) -> int:
    """The native length of a checkpoint (``retrofit.foundation.native.native_length`` of its config.json)."""
    n = read_native_length(read_json(Path(model_folder) / "config.json") or {})
    if not n:
        raise RetrofitError(f"{model_folder}: cannot tell the native length from config.json")
    return int(n)


def eval_dir(model: str) -> Path:
    """Where ``retrofit eval MODEL`` writes by default: MODEL/eval for a folder of the user's, else eval-NAME in the
    working directory (a Hub id, a .gguf file, a folder that stays as it is: ``kept_as_is``)."""
    p = Path(model)
    if p.is_dir() and not kept_as_is(p):
        return p / EVAL
    return Path("eval-" + (p.resolve().name if p.is_dir() else p.name).replace(".gguf", "").replace("/", "-"))


def kept_as_is(folder: Path) -> str | None:
    """Why a model folder is not written into (None: it may be): its files are checksummed (a ``SHA256SUMS``: a
    shipped stand-in, whose check fails on any file added), or it is read-only."""
    if (Path(folder) / SUMS).is_file():
        return f"its files are checksummed ({SUMS}: a shipped folder)"
    if not os.access(folder, os.W_OK):
        return "it is read-only"
    return None
