"""``retrofit run RECIPE``: convert -> fine-tune -> eval against the original -> export -> card -> push.

A pipeline recipe is a fine-tune recipe (``retrofit.training.recipe``) plus four optional top-level
sections, validated as strictly (an unknown key or a wrong type names the key):

    eval:   {lengths: [1x, 2x, 4x, 8x, 16x], data: shakespeare:heldout, budget: 16384, baselines: [original], passkey: true}
    export: {native: true}
    card:   {license: null, datasets: null, tags: [], limits: []}
    push:   {repo: null, private: false, revision: main}

Everything lands in the run folder (the recipe's ``output_dir``), with ``manifest.json`` saying per
stage what was done, when, with which versions and from which inputs (a hash of the recipe
sections the stage depends on). A re-run skips every stage whose manifest entry is done, whose
outputs exist and whose inputs are unchanged; a fine-tune killed midway resumes from its latest
checkpoint (``checkpoint.resume: auto``).

    run_dir = retrofit.run("recipes/quickstart.yaml", overrides=["train.steps=50"])
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from . import run_folder as rf
from . import schema
from .atomic import write_text
from .errors import OptionError, RecipeError, RetrofitError
from .evaluation.lengths import parse_item
from .evaluation.lengths import resolve as resolve_lengths
from .schema import field_help as _f
from .training.recipe import Recipe
from .versions import library_versions

log = logging.getLogger(__name__)

STAGES = ("finetune", "eval", "export", "card", "push")
DONE = ("done", "not available", "skipped")  # statuses a re-run does not repeat


# ---- the extra recipe sections ----------------------------------------------------------------
@dataclass
class EvalSection:
    lengths: list = _f("Evaluation lengths: multiples of the native length ('4x') or token counts (512).",
                       factory=lambda: ["1x", "2x", "4x", "8x", "16x"])
    data: str = _f("Data spec (retrofit.data): 'shakespeare:heldout', 'stdlib', files, or a datasets name.",
                   "shakespeare:heldout")
    doc_separator: Optional[str] = _f("Join documents with this text instead of EOS.", None)
    budget: int = _f("Tokens scored at every length.", 16384)
    stride: Optional[int] = _f("Sliding-window stride (null = half of each sliding window).", None)
    sliding: bool = _f("Also sliding rows for models that run a length plainly (baselines past "
                       "their limit always get theirs).", False)
    batch_size: int = _f("Windows per forward pass.", 1)
    baselines: list = _f("Baselines scored on the same tokens: 'original' (the unconverted model), "
                         "'converted' (converted, not fine-tuned), or a model name/path.", factory=lambda: ["original"])
    passkey: bool = _f("Also run passkey retrieval.", False)
    passkey_lengths: Optional[list] = _f("Passkey lengths, same units as lengths (null = lengths).", None)
    passkey_depths: list = _f("Passkey depths in [0, 1].", factory=lambda: [0.0, 0.5, 1.0])
    passkey_trials: int = _f("Passkey trials per (length, depth).", 3)
    seed: int = _f("Passkey seed.", 0)


@dataclass
class ExportSection:
    native: bool = _f("Export to the closest native transformers architecture where a mapping exists.", True)


@dataclass
class CardSection:
    license: Optional[str] = _f("Licence of the result (null = the base model's, when known).", None)
    datasets: Optional[list] = _f("Hub dataset ids for the metadata (null = the hub datasets the run used).", None)
    tags: list = _f("Extra Hub tags.", factory=list)
    limits: list = _f("Extra lines for the card's limitations section.", factory=list)
    template: Optional[str] = _f("A Jinja template to use instead of the bundled one.", None)


@dataclass
class PushSection:
    repo: Optional[str] = _f("Hub repo id (user/name); null = no push.", None)
    private: bool = _f("Create the repo private.", False)
    revision: str = _f("Branch to push to.", "main")


SECTIONS = {"eval": EvalSection, "export": ExportSection, "card": CardSection, "push": PushSection}


@dataclass
class RunRecipe:
    """A fine-tune recipe plus the pipeline's sections."""

    finetune: Recipe
    eval: EvalSection
    export: ExportSection
    card: CardSection
    push: PushSection
    source: Optional[str] = None

    @property
    def run_dir(self) -> Path:
        return Path(self.finetune.output_dir)

    def to_dict(self) -> dict:
        d = self.finetune.to_dict()
        d.update({name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS})
        return d

    def stage_hash(self, stage: str) -> str:
        """Hash of the recipe sections a stage depends on (changing them re-runs the stage)."""
        d = self.to_dict()
        parts = {"finetune": {k: v for k, v in self.finetune.to_dict().items() if k != "output_dir"}}  # a moved run stays done
        if stage in ("eval", "card", "push"):
            parts["eval"] = d["eval"]
        if stage in ("export", "card", "push"):
            parts["export"] = d["export"]
        if stage in ("card", "push"):
            parts["card"] = d["card"]
            parts["repo"] = d["push"]["repo"]  # the card names the repo
        if stage == "push":
            parts["push"] = d["push"]
        return _hash(parts)


def load_recipe(recipe, overrides=None) -> RunRecipe:
    """A YAML path, a dict or a RunRecipe (+ ``key=value`` overrides) -> a validated RunRecipe."""
    if isinstance(recipe, RunRecipe):
        recipe, source = recipe.to_dict(), recipe.source
    elif isinstance(recipe, (str, Path)):
        source = str(recipe)
        recipe = schema.read_yaml(recipe)
    elif isinstance(recipe, dict):
        source = None
    else:
        raise RecipeError(f"expected a recipe, a dict or a YAML path, got {type(recipe).__name__}")
    raw = json.loads(json.dumps(recipe))  # a deep copy of plain data
    if not isinstance(raw, dict):
        raise RecipeError(f"a recipe must be a mapping of keys, got {type(raw).__name__}")
    schema.apply_overrides(raw, overrides)
    sections = {name: schema.build(cls, raw.pop(name, None) or {}, prefix=f"{name}.") for name, cls in SECTIONS.items()}
    rr = RunRecipe(finetune=Recipe.from_dict(raw), source=source, **sections)
    _validate(rr)
    return rr


def _validate(rr: RunRecipe) -> None:
    e = rr.eval
    for key, items in (("eval.lengths", e.lengths), ("eval.passkey_lengths", e.passkey_lengths or ["1x"])):
        if not items:
            raise RecipeError(f"'{key}' must list at least one length")
        for x in items:
            try:
                parse_item(x, key)
            except OptionError as err:
                raise RecipeError(f"'{key}'{str(err)[len(key):]}") from None
    for key, v in (("eval.budget", e.budget), ("eval.batch_size", e.batch_size), ("eval.passkey_trials", e.passkey_trials)):
        if v < 1:
            raise RecipeError(f"'{key}' must be > 0, got {v}")
    if e.stride is not None and e.stride < 1:
        raise RecipeError(f"'eval.stride' must be > 0, got {e.stride}")
    if not all(isinstance(d, (int, float)) and not isinstance(d, bool) and 0 <= d <= 1 for d in e.passkey_depths):
        raise RecipeError(f"'eval.passkey_depths' must be numbers in [0, 1], got {e.passkey_depths!r}")
    if not all(isinstance(b, str) and b for b in e.baselines):
        raise RecipeError(f"'eval.baselines' must be a list of names, got {e.baselines!r}")
    if "converted" in e.baselines and rr.finetune.convert.scheme is None:
        raise RecipeError("'eval.baselines: converted' needs 'convert.scheme'")
    for key, items in (("card.datasets", rr.card.datasets or []), ("card.tags", rr.card.tags), ("card.limits", rr.card.limits)):
        if not all(isinstance(x, str) and x for x in items):
            raise RecipeError(f"'{key}' must be a list of strings, got {items!r}")
    if rr.card.template and not Path(rr.card.template).is_file():
        raise RecipeError(f"'card.template': {rr.card.template!r} is not a file")
    if rr.push.repo is not None:
        from .hub import check_repo_id

        check_repo_id(rr.push.repo, key="push.repo")


# ---- the manifest -------------------------------------------------------------------------------
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Manifest:
    """``manifest.json``: one entry per stage (status, started, finished, outputs, versions, inputs hash)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / rf.MANIFEST
        self.data = json.loads(self.path.read_text()) if self.path.is_file() else {"stages": {}}

    def entry(self, stage: str) -> dict:
        return self.data["stages"].get(stage, {})

    def is_done(self, stage: str, inputs: str, run_dir: Path) -> bool:
        e = self.entry(stage)
        if e.get("status") not in DONE or e.get("inputs") != inputs:
            return False
        return all((run_dir / p).exists() for p in e.get("outputs", []))

    def start(self, stage: str, inputs: str) -> None:
        self.data["stages"][stage] = {"status": "running", "started": _now(), "finished": None, "inputs": inputs,
                                      "outputs": [], "versions": library_versions()}
        self.save()

    def finish(self, stage: str, status: str, outputs=(), **detail) -> None:
        e = self.data["stages"][stage]
        e.update(status=status, finished=_now(), outputs=[str(p) for p in outputs], **detail)
        e["seconds"] = round(time.time() - _dt.datetime.fromisoformat(e["started"]).timestamp(), 1)
        self.save()

    def save(self) -> None:
        write_text(self.path, json.dumps(self.data, indent=2) + "\n")


# ---- the run ------------------------------------------------------------------------------------
def run(recipe_or_path, overrides=None, *, force: tuple[str, ...] = ()) -> Path:
    """Run (or resume) the pipeline a recipe describes; return the run folder.

    ``overrides``: ``["train.steps=50", "push.repo=user/name"]`` applied on top.
    ``force``: stage names to re-run even if done.
    """
    rr = load_recipe(recipe_or_path, overrides)
    run_dir = rr.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(run_dir)
    manifest.data.update(recipe=rr.source, recipe_hash=_hash(rr.to_dict()), updated=_now())
    manifest.data.setdefault("created", _now())
    write_text(run_dir / rf.RUN_RECIPE, yaml.safe_dump(rr.to_dict(), sort_keys=False))
    manifest.save()
    upstream_ran = False  # a stage that ran makes every later stage run again (they read its outputs)
    for i, stage in enumerate(STAGES):
        inputs = rr.stage_hash(stage)
        if not upstream_ran and stage not in force and manifest.is_done(stage, inputs, run_dir):
            log.info("[%d/%d] %s: already done (%s), skipped", i + 1, len(STAGES), stage, manifest.entry(stage)["status"])
            continue
        log.info("[%d/%d] %s", i + 1, len(STAGES), stage)
        _run_stage(stage, rr, manifest, inputs)
        upstream_ran = True
    return run_dir


def _run_stage(stage: str, rr: RunRecipe, manifest: Manifest, inputs: str) -> None:
    previous = manifest.entry(stage)
    manifest.start(stage, inputs)
    try:
        status, outputs, detail = STAGE_FUNCS[stage](rr, previous)
    except BaseException as e:
        manifest.finish(stage, "failed", error=f"{type(e).__name__}: {e}")
        raise
    manifest.finish(stage, status, outputs, **detail)
    log.info("%s: %s", stage, status)


# ---- stages (each returns (status, outputs relative to the run folder, detail)) -------------------
def stage_finetune(rr: RunRecipe, previous: dict):
    from .training import finetune

    run_dir = rr.run_dir
    recipe = rr.finetune
    if previous and previous.get("inputs") not in (None, rr.stage_hash("finetune")):
        log.warning("the fine-tune part of the recipe changed since the last run: starting it afresh")
        recipe = Recipe.from_dict(recipe.to_dict(), {"checkpoint.resume": "never"})
        (run_dir / rf.SUMMARY).unlink(missing_ok=True)
    elif rf.finetune_complete(run_dir):
        log.info("finetune: %s is complete; not training again", run_dir / rf.FINAL)
        return "done", [rf.FINAL, rf.SUMMARY], {"reused": True}
    finetune(recipe)
    summary = rf.summary(run_dir)
    return "done", [rf.FINAL, rf.SUMMARY], {"resumed_from_step": summary.get("resumed_from_step"),
                                               "steps": summary.get("steps")}


def _named(model, tok, name: str, base: str):
    model.config._name_or_path = base  # the report's base_model: the recipe's name, not a local path
    return (name, model, tok)


def eval_models(rr: RunRecipe):
    """(the fine-tuned model, [baselines]) as ``(name, model, tokenizer)`` triples."""
    from .core import convert, is_converted, revert
    from .io import load_model

    m = rr.finetune.model
    base = m.name_or_path
    scheme = rr.finetune.convert.scheme or "unconverted"
    model, tok = load_model(str(rr.run_dir / rf.FINAL))
    main = _named(model, tok, f"{base} + {scheme} (fine-tuned)", base)
    baselines = []
    for b in rr.eval.baselines:
        if b in ("original", "converted"):
            bm, btok = load_model(base, gguf_file=m.gguf_file, dtype=m.dtype)  # built-in names resolve there
            if b == "converted":
                if not is_converted(bm):  # a recipe that starts from a converted checkpoint: it is that one
                    convert(bm, rr.finetune.convert.scheme, **rr.finetune.convert.options)
                baselines.append(_named(bm, btok, f"{base} + {scheme} (not fine-tuned)", base))
            else:
                if is_converted(bm):  # the checkpoint's own original positions (kept in its weights)
                    revert(bm)
                baselines.append(_named(bm, btok, f"{base} (original)", base))
        else:
            bm, btok = load_model(b)
            baselines.append(_named(bm, btok, b, b))
    return main, baselines


def stage_eval(rr: RunRecipe, previous: dict):
    from .evaluation import evaluate

    e = rr.eval
    native = rf.native_length(rr.run_dir / rf.FINAL)
    lengths = resolve_lengths(e.lengths, native)
    pk_lengths = resolve_lengths(e.passkey_lengths, native, "passkey lengths") if e.passkey_lengths else None
    out = rr.run_dir / rf.EVAL
    with _kernel(rr.finetune.convert.options.get("kernel")):
        main, baselines = eval_models(rr)
        report = evaluate(
            main, lengths, data=e.data, baselines=baselines, doc_separator=e.doc_separator, budget=e.budget,
            stride=e.stride, sliding=e.sliding, batch_size=e.batch_size, passkey=e.passkey,
            passkey_lengths=pk_lengths, passkey_depths=e.passkey_depths, passkey_trials=e.passkey_trials,
            seed=e.seed, progress=_progress(),
        )
    report.save(out)
    outputs = [f"{rf.EVAL}/{name}" for name in (rf.REPORT, rf.REPORT_MD, *report.data.get("plots", []))]
    return "done", outputs, {"lengths": lengths, "native_length": native}


@contextlib.contextmanager
def _kernel(kernel: str | None):
    """The recipe's ``convert.options.kernel`` for the eval too: a saved checkpoint reloads with
    ``kernel=auto``, which reads ``RETROFIT_ATTENTION_PATH`` (an explicit setting of it wins)."""
    if not kernel or kernel == "auto" or "RETROFIT_ATTENTION_PATH" in os.environ:
        yield
        return
    os.environ["RETROFIT_ATTENTION_PATH"] = kernel
    try:
        yield
    finally:
        os.environ.pop("RETROFIT_ATTENTION_PATH", None)


def stage_export(rr: RunRecipe, previous: dict):
    if not rr.export.native:
        return "skipped", [], {"reason": "export.native is false"}
    try:
        from .native_export import export
    except ImportError as e:
        return "not available", [], {"reason": f"retrofit.native_export cannot be imported ({e})"}
    out = rr.run_dir / rf.EXPORT
    shutil.rmtree(out, ignore_errors=True)  # a stale export must not outlive a re-run that cannot export
    try:
        with _kernel(rr.finetune.convert.options.get("kernel")):
            result = export(rr.run_dir / rf.FINAL, out, native=True)
    except RetrofitError as e:
        log.warning("export: not available: %s", e)
        return "not available", [], {"reason": str(e)}
    except Exception as e:  # an optional stage: a crash is recorded (and retried next run), the run goes on
        log.error("export failed (the run goes on without it): %s: %s", type(e).__name__, e)
        return "failed", [], {"error": f"{type(e).__name__}: {str(e)[:500]}"}
    native = (out / "config.json").is_file() and "retrofit" not in json.loads((out / "config.json").read_text())
    if not native:
        return "not available", [], {"reason": "the export wrote no native checkpoint", "result": _plain(result)}
    return "done", [rf.EXPORT], {"result": _plain(result)}


def _plain(x):
    if dataclasses.is_dataclass(x):
        x = dataclasses.asdict(x)
    elif hasattr(x, "to_dict"):
        x = x.to_dict()
    return json.loads(json.dumps(x, default=str))


def stage_card(rr: RunRecipe, previous: dict):
    from .cards import write_card

    path = write_card(rr.run_dir, template=rr.card.template)
    return "done", [path.name], {}


def stage_push(rr: RunRecipe, previous: dict):
    if not rr.push.repo:
        return "skipped", [], {"reason": "no push.repo in the recipe"}
    from .hub import push

    result = push(rr.run_dir, rr.push.repo, private=rr.push.private, revision=rr.push.revision)
    return "done", [], {"repo": rr.push.repo, "revision": rr.push.revision, "commit_url": result.get("commit_url"),
                        "files": len(result["files"])}


STAGE_FUNCS = {"finetune": stage_finetune, "eval": stage_eval, "export": stage_export, "card": stage_card,
               "push": stage_push}


def _progress() -> bool:
    return os.environ.get("RETROFIT_PROGRESS", "1") != "0"


def where(run_dir: Path) -> dict:
    """The files a user looks at after a run: {label: path} (those that exist)."""
    run_dir = Path(run_dir)
    ev = run_dir / rf.EVAL
    items = {"card": run_dir / rf.CARD, "report": ev / rf.REPORT_MD, "report (JSON)": ev / rf.REPORT,
             "plot": ev / "ppl_vs_length.png", "passkey grid": ev / "passkey.png", "model": run_dir / rf.FINAL,
             "native export": run_dir / rf.EXPORT, "manifest": run_dir / rf.MANIFEST}
    return {k: v for k, v in items.items() if v.exists()}
