"""A pipeline recipe (``retrofit run RECIPE``): a fine-tune recipe plus four optional sections,
validated as strictly (``retrofit.foundation.schema``): an unknown key or a wrong type names the key.

    eval:   {lengths: [1x, 2x, 4x, 8x, 16x], data: shakespeare:heldout, budget: 16384, baselines: [original], passkey: true}
            (every option of ``retrofit.evaluation.options.EvalOptions``, its defaults where unset)
    export: {native: true}
    card:   {license: null, datasets: null, tags: [], limits: []}
    push:   {repo: null, private: false, revision: main}
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..evaluation.lengths import parse_item, parse_list
from ..evaluation.options import DEFAULTS, EvalOptions
from ..foundation import schema
from ..foundation.errors import OptionError, RecipeError
from ..foundation.schema import field_help as _f
from ..training.recipe import Recipe


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---- the extra recipe sections ----------------------------------------------------------------
@dataclass
class EvalSection(EvalOptions):
    """Every evaluation option (``EvalOptions``: its defaults, in one place) plus the models scored beside
    the fine-tuned one."""

    baselines: list = _f(
        "Baselines scored on the same tokens: 'original' (the unconverted model), "
        "'converted' (converted, not fine-tuned), or a model name/path.",
        factory=lambda: ["original"],
    )


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
        parts = {"finetune": _finetune_hashed(self.finetune.to_dict())}
        if stage in ("eval", "card", "push"):
            parts["eval"] = _eval_hashed(d["eval"])
        if stage in ("export", "card", "push"):
            parts["export"] = d["export"]
        if stage in ("card", "push"):
            parts["card"] = d["card"]
            parts["repo"] = d["push"]["repo"]  # the card names the repo
        if stage == "push":
            parts["push"] = d["push"]
        return _hash(parts)


def _finetune_hashed(f: dict) -> dict:
    """The fine-tune sections as stage hashes see them: not ``output_dir`` (a moved run stays done); the
    teacher's keys only when a teacher trains (objective distill or both) and ``convert.calibrate`` only when
    it calibrates, so runs made before those keys existed keep their hashes (and are not trained again)."""
    f = {k: v for k, v in f.items() if k != "output_dir"}
    if f["train"].get("objective", "lm") == "lm":
        f["train"] = {k: v for k, v in f["train"].items() if not k.startswith("teacher_")}
    if not (f["convert"].get("calibrate") or {}).get("data"):
        f["convert"] = {k: v for k, v in f["convert"].items() if k != "calibrate"}
    return f


def _eval_hashed(e: dict) -> dict:
    """The eval section as stage hashes see it: the recall keys only when recall runs and
    ``position_buckets`` only when it is not the default, so runs made before those keys existed keep
    their hashes (and are not re-evaluated)."""
    e = e if e.get("recall") else {k: v for k, v in e.items() if not k.startswith("recall")}
    return (
        e
        if e["position_buckets"] != DEFAULTS.position_buckets
        else {k: v for k, v in e.items() if k != "position_buckets"}
    )


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
    _split_length_lists(raw.get("eval"))
    sections = {name: schema.build(cls, raw.pop(name, None) or {}, prefix=f"{name}.") for name, cls in SECTIONS.items()}
    rr = RunRecipe(finetune=Recipe.from_dict(raw), source=source, **sections)
    _validate(rr)
    return rr


def _split_length_lists(section) -> None:
    """``eval.lengths: 1x,4x`` (as ``--set`` and ``retrofit eval --lengths`` write it) is the list [1x, 4x]."""
    if not isinstance(section, dict):
        return
    for key in ("lengths", "passkey_lengths", "recall_lengths"):
        if isinstance(section.get(key), str):
            try:
                section[key] = parse_list(section[key], f"eval.{key}")
            except OptionError as err:
                raise RecipeError(f"'eval.{key}'{str(err)[len(f'eval.{key}') :]}") from None


def _validate(rr: RunRecipe) -> None:
    e = rr.eval
    for key, items in (
        ("eval.lengths", e.lengths),
        ("eval.passkey_lengths", e.passkey_lengths or ["1x"]),
        ("eval.recall_lengths", e.recall_lengths or ["1x"]),
    ):
        if not items:
            raise RecipeError(f"'{key}' must list at least one length")
        for x in items:
            try:
                parse_item(x, key)
            except OptionError as err:
                raise RecipeError(f"'{key}'{str(err)[len(key) :]}") from None
    for key, v in (
        ("eval.budget", e.budget),
        ("eval.batch_size", e.batch_size),
        ("eval.passkey_trials", e.passkey_trials),
        ("eval.position_buckets", e.position_buckets),
        ("eval.recall_trials", e.recall_trials),
        ("eval.recall_span", e.recall_span),
        ("eval.recall_cue", e.recall_cue),
    ):
        if v < 1:
            raise RecipeError(f"'{key}' must be > 0, got {v}")
    if e.recall_cue >= e.recall_span:
        raise RecipeError(
            f"'eval.recall_cue' ({e.recall_cue}) must be smaller than 'eval.recall_span' ({e.recall_span})"
        )
    if e.stride is not None and e.stride < 1:
        raise RecipeError(f"'eval.stride' must be > 0, got {e.stride}")
    for key, depths in (("eval.passkey_depths", e.passkey_depths), ("eval.recall_depths", e.recall_depths)):
        if not all(isinstance(d, (int, float)) and not isinstance(d, bool) and 0 <= d <= 1 for d in depths):
            raise RecipeError(f"'{key}' must be numbers in [0, 1], got {depths!r}")
    if not all(isinstance(b, str) and b for b in e.baselines):
        raise RecipeError(f"'eval.baselines' must be a list of names, got {e.baselines!r}")
    if "converted" in e.baselines and rr.finetune.convert.scheme is None:
        raise RecipeError("'eval.baselines: converted' needs 'convert.scheme'")
    for key, items in (
        ("card.datasets", rr.card.datasets or []),
        ("card.tags", rr.card.tags),
        ("card.limits", rr.card.limits),
    ):
        if not all(isinstance(x, str) and x for x in items):
            raise RecipeError(f"'{key}' must be a list of strings, got {items!r}")
    if rr.card.template and not Path(rr.card.template).is_file():
        raise RecipeError(f"'card.template': {rr.card.template!r} is not a file")
    if rr.push.repo is not None:
        from ..publishing.hub import check_repo_id

        check_repo_id(rr.push.repo, key="push.repo")
