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

import dataclasses
import datetime as _dt
import json
import logging
import shutil
import time
from pathlib import Path

import yaml

from ..evaluation.lengths import resolve as resolve_lengths
from ..evaluation.options import EvalOptions
from ..foundation import run_folder
from ..foundation.atomic import check_creatable, write_text
from ..foundation.errors import RetrofitError
from ..foundation.quiet import progress_bars
from ..foundation.versions import library_versions
from ..training.recipe import Recipe
from .recipe import SECTIONS, RunRecipe, _hash, load_recipe  # noqa: F401  (public here too)

log = logging.getLogger(__name__)

STAGES = ("finetune", "eval", "export", "card", "push")
DONE = ("done", "not available", "skipped")  # statuses a re-run does not repeat


# ---- the manifest -------------------------------------------------------------------------------
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class Manifest:
    """``manifest.json``: one entry per stage (status, started, finished, outputs, versions, inputs hash)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / run_folder.MANIFEST
        self.data = json.loads(self.path.read_text()) if self.path.is_file() else {"stages": {}}

    def entry(self, stage: str) -> dict:
        return self.data["stages"].get(stage, {})

    def is_done(self, stage: str, inputs: str, run_dir: Path) -> bool:
        e = self.entry(stage)
        if e.get("status") not in DONE or e.get("inputs") != inputs:
            return False
        return all((run_dir / p).exists() for p in e.get("outputs", []))

    def start(self, stage: str, inputs: str) -> None:
        self.data["stages"][stage] = {
            "status": "running",
            "started": _now(),
            "finished": None,
            "inputs": inputs,
            "outputs": [],
            "versions": library_versions(),
        }
        self.save()

    def finish(self, stage: str, status: str, outputs=(), **detail) -> None:
        e = self.data["stages"][stage]
        e.update(status=status, finished=_now(), outputs=[str(p) for p in outputs], **detail)
        e["seconds"] = round(time.time() - _dt.datetime.fromisoformat(e["started"]).timestamp(), 1)
        self.save()

    def save(self) -> None:
        on_disk = run_folder.manifest(self.path.parent) or {}
        if run_folder.EXPORT in on_disk:  # where an export went (run_folder.record_export), written beside the stages
            self.data[run_folder.EXPORT] = on_disk[run_folder.EXPORT]
        write_text(self.path, json.dumps(self.data, indent=2) + "\n")


# ---- the run ------------------------------------------------------------------------------------
def run(recipe_or_path, overrides=None, *, force: tuple[str, ...] = ()) -> Path:
    """Run (or resume) the pipeline a recipe describes; return the run folder.

    ``overrides``: ``["train.steps=50", "push.repo=user/name"]`` applied on top.
    ``force``: stage names to re-run even if done.
    """
    rr = load_recipe(recipe_or_path, overrides)
    run_dir = rr.run_dir
    check_creatable(run_dir, "output_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(run_dir)
    manifest.data.update(recipe=rr.source, recipe_hash=_hash(rr.to_dict()), updated=_now())
    manifest.data.setdefault("created", _now())
    write_text(run_dir / run_folder.RUN_RECIPE, yaml.safe_dump(rr.to_dict(), sort_keys=False))
    manifest.save()
    upstream_ran = False  # a stage that ran makes every later stage run again (they read its outputs)
    for i, stage in enumerate(STAGES):
        inputs = rr.stage_hash(stage)
        if not upstream_ran and stage not in force and manifest.is_done(stage, inputs, run_dir):
            log.info(
                "[%d/%d] %s: already done (%s), skipped", i + 1, len(STAGES), stage, manifest.entry(stage)["status"]
            )
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
    from ..training import finetune

    run_dir = rr.run_dir
    recipe = rr.finetune
    if previous and previous.get("inputs") not in (None, rr.stage_hash("finetune")):
        log.warning("the fine-tune part of the recipe changed since the last run: starting it afresh")
        recipe = Recipe.from_dict(recipe.to_dict(), {"checkpoint.resume": "never"})
        (run_dir / run_folder.SUMMARY).unlink(missing_ok=True)
    elif run_folder.finetune_complete(run_dir):
        log.info("finetune: %s is complete; not training again", run_dir / run_folder.FINAL)
        return "done", [run_folder.FINAL, run_folder.SUMMARY], {"reused": True}
    finetune(recipe)
    summary = run_folder.summary(run_dir)
    return (
        "done",
        [run_folder.FINAL, run_folder.SUMMARY],
        {"resumed_from_step": summary.get("resumed_from_step"), "steps": summary.get("steps")},
    )


def _named(model, tok, name: str, base: str):
    model.config._name_or_path = base  # the report's base_model: the recipe's name, not a local path
    return (name, model, tok)


def eval_models(rr: RunRecipe):
    """(the fine-tuned model, [baselines]) as ``(name, model, tokenizer)`` triples."""
    from ..models.io import load_model
    from ..patch.conversion import convert, is_converted, set_kernel
    from ..training.standin import ensure

    m = rr.finetune.model
    base = m.name_or_path
    ensure(base)  # the run's stand-in, when it names one (the finetune stage built it; a cleared cache builds it again)
    scheme = rr.finetune.convert.scheme or "unconverted"
    model, tok = load_model(str(rr.run_dir / run_folder.FINAL))
    main = _named(model, tok, f"{base} + {scheme} (fine-tuned)", base)
    baselines = []
    for b in rr.eval.baselines:
        if b == "original":  # the checkpoint's own original positions (kept in its weights)
            baselines += _original(rr)
        elif b == "converted":
            bm, btok = load_model(base, gguf_file=m.gguf_file, dtype=m.dtype)  # built-in names resolve there
            if not is_converted(bm):  # a recipe that starts from a converted checkpoint: it is that one
                convert(bm, rr.finetune.convert.scheme, **rr.finetune.convert.options)
            elif rr.finetune.convert.options.get("kernel"):  # the recipe's kernel, as the fine-tuned model's
                set_kernel(bm, rr.finetune.convert.options["kernel"])
            baselines.append(_named(bm, btok, f"{base} + {scheme} (not fine-tuned)", base))
        else:
            bm, btok = load_model(b)
            baselines.append(_named(bm, btok, b, b))
    return main, baselines


def _original(rr: RunRecipe) -> list:
    """[the original as a baseline]; [] for a classifier fine-tuned from a model that is not one (a masked LM under
    a new head has no original reading to compare with)."""
    from ..foundation.task import of_model
    from ..models.io import load_original

    m, task = rr.finetune.model, rr.finetune.task
    as_task = "embeddings" if task == "embedding" else None  # an encoder read as an embedding model
    name, bm, btok = load_original(m.name_or_path, gguf_file=m.gguf_file, dtype=m.dtype, task=as_task)
    if task == "classification" and of_model(bm).name != "sequence-classification":
        log.warning(
            "eval: the original %s is a %s, not a classifier: no original reading to compare with; name a "
            "classifier fine-tuned at its native length in eval.baselines for one",
            m.name_or_path,
            of_model(bm).name,
        )
        return []
    return [_named(bm, btok, name, m.name_or_path)]


def evaluate_section(main, baselines, e, native: int, source=None):
    """``evaluate()`` as an eval section says (its lengths resolved against ``native``; ``source``: a classifier's or
    an embedding model's documents in place of ``e.data``, its default lengths stopping at the model's limit): the
    Report."""
    from ..evaluation import evaluate

    opts = {f.name: getattr(e, f.name) for f in dataclasses.fields(EvalOptions)}
    opts["lengths"] = resolve_lengths(e.lengths, native)
    if e.passkey_lengths:
        opts["passkey_lengths"] = resolve_lengths(e.passkey_lengths, native, "passkey lengths")
    if e.recall_lengths:
        opts["recall_lengths"] = resolve_lengths(e.recall_lengths, native, "recall lengths")
    if source is not None:
        opts["data"] = source
        opts["lengths"] = None if e.lengths == EvalOptions().lengths else opts["lengths"]
    return evaluate(main, baselines=baselines, **opts, progress=progress_bars())


def stage_eval(rr: RunRecipe, previous: dict):
    from ..evaluation.models import describe_model

    out = rr.run_dir / run_folder.EVAL
    main, baselines = eval_models(rr)
    # the model's own reading (its adapter's: RoBERTa's table holds native + padding offset rows), else its config's
    native = describe_model(main[1])["native"]["length"] or run_folder.native_length(rr.run_dir / run_folder.FINAL)
    lengths = resolve_lengths(rr.eval.lengths, native)
    source = None
    if rr.finetune.task is not None:  # a classifier or an embedding model: the task, or the held-out records
        from ..evaluation import records

        source = records.source_for(rr.eval.data, rr.run_dir, given=rr.eval.data != EvalOptions.data)
    report = evaluate_section(main, baselines, rr.eval, native, source)
    report.save(out)
    outputs = [
        f"{run_folder.EVAL}/{name}" for name in (run_folder.REPORT, run_folder.REPORT_MD, *report.data.get("plots", []))
    ]
    return "done", outputs, {"lengths": lengths, "native_length": native}


def stage_export(rr: RunRecipe, previous: dict):
    if not rr.export.native:
        return "skipped", [], {"reason": "export.native is false"}
    try:
        from ..native_export import export
    except ImportError as e:
        return "not available", [], {"reason": f"retrofit.native_export cannot be imported ({e})"}
    out = rr.run_dir / run_folder.EXPORT
    shutil.rmtree(out, ignore_errors=True)  # a stale export must not outlive a re-run that cannot export
    try:
        result = export(rr.run_dir / run_folder.FINAL, out, native=True)
    except RetrofitError as e:
        log.warning("export: not available: %s", e)
        return "not available", [], {"reason": str(e)}
    except Exception as e:  # an optional stage: a crash is recorded (and retried next run), the run goes on
        log.error("export failed (the run goes on without it): %s: %s", type(e).__name__, e)
        return "failed", [], {"error": f"{type(e).__name__}: {str(e)[:500]}"}
    native = (out / "config.json").is_file() and "retrofit" not in json.loads((out / "config.json").read_text())
    if not native:
        return "not available", [], {"reason": "the export wrote no native checkpoint", "result": _plain(result)}
    return "done", [run_folder.EXPORT], {"result": _plain(result)}


def _plain(x):
    if dataclasses.is_dataclass(x):
        x = dataclasses.asdict(x)
    elif hasattr(x, "to_dict"):
        x = x.to_dict()
    return json.loads(json.dumps(x, default=str))


def stage_card(rr: RunRecipe, previous: dict):
    from ..publishing.cards import write_card

    path = write_card(rr.run_dir, template=rr.card.template)
    return "done", [path.name], {}


def stage_push(rr: RunRecipe, previous: dict):
    if not rr.push.repo:
        return "skipped", [], {"reason": "no push.repo in the recipe"}
    from ..publishing.hub import push

    result = push(rr.run_dir, rr.push.repo, private=rr.push.private, revision=rr.push.revision)
    return (
        "done",
        [],
        {
            "repo": rr.push.repo,
            "revision": rr.push.revision,
            "commit_url": result.get("commit_url"),
            "files": len(result["files"]),
        },
    )


STAGE_FUNCS = {
    "finetune": stage_finetune,
    "eval": stage_eval,
    "export": stage_export,
    "card": stage_card,
    "push": stage_push,
}


def where(run_dir: Path) -> dict:
    """The files a user looks at after a run: {label: path} (those that exist)."""
    run_dir = Path(run_dir)
    ev = run_dir / run_folder.EVAL
    items = {
        "card": run_dir / run_folder.CARD,
        "report": ev / run_folder.REPORT_MD,
        "report (JSON)": ev / run_folder.REPORT,
        "plot": ev / run_folder.PLOT_PPL,
        "passkey grid": ev / run_folder.PLOT_PASSKEY,
        "recall grid": ev / run_folder.PLOT_RECALL,
        "model": run_dir / run_folder.FINAL,
        "native export": run_dir / run_folder.EXPORT,
        "manifest": run_dir / run_folder.MANIFEST,
    }
    return {k: v for k, v in items.items() if v.exists()}
