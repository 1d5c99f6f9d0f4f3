"""The study grid (``retrofit study GRID.yaml``): a typed, validated schema read from YAML.

Every key is a dataclass field with help text (``retrofit study --help`` prints them). A grid names a
pipeline recipe (``retrofit run``) that every cell starts from, and the axes of the grid; a cell is that
recipe with a few keys set (``schema.apply_overrides``, the same ``KEY=VALUE`` as ``retrofit run --set``):

    scheme entry  -> convert.scheme (the label, unless the entry sets it) and its own overrides
    method        -> train.method
    budget        -> train.steps (budget 0: the model converted, and calibrated if the recipe says so,
                     evaluated without any fine-tune)
    seed          -> train.seed

Beside the converted cells, the continued-training control: the *unconverted* model fine-tuned with the
same method, steps, seed and data (``convert.scheme: null``), one per method x budget x seed. Every cell is
named by its key: ``LABEL-METHOD-STEPS`` (``LABEL-none-0`` at budget 0, ``control-METHOD-STEPS``), with
``-seedN`` for every seed after the first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from ..foundation import schema
from ..foundation.errors import RecipeError
from ..foundation.schema import field_help as _f
from .tables import Target

# what a budget-0 cell evaluates as is: the fine-tune's keys mean nothing there
NO_FINETUNE = "none"


@dataclass
class Grid:
    recipe: Union[str, dict] = _f(
        "The pipeline recipe every cell starts from (`retrofit run`'s: model, data, train, eval, checkpoint): a "
        "path (relative to the grid file) or the recipe inline. Its output_dir, export, card and push are the "
        "study's own; its eval section says what every cell is measured on (lengths, data, budget, passkey, "
        "recall), eval.baselines aside: the original is evaluated once, for all cells. Required.",
        None,
    )
    schemes: dict = _f(
        "Cells to convert: LABEL -> a list of recipe overrides (KEY=VALUE, as `retrofit run --set`), e.g. "
        "`yarn: [convert.scheme=rope, convert.options.scaling=yarn, convert.options.factor=8]`. convert.scheme "
        "defaults to the label (`alibi: []`). Required.",
        factory=dict,
    )
    methods: list = _f("Fine-tune methods (train.method): full, lora.", factory=lambda: ["full"])
    budgets: list = _f(
        "Fine-tune budgets in optimizer steps (train.steps); 0 = converted, not fine-tuned.", factory=lambda: [0, 100]
    )
    seeds: list = _f(
        "Fine-tune seeds (train.seed); the first is the base seed, the others give the seeds table.",
        factory=lambda: [0],
    )
    control: bool = _f(
        "Also run the continued-training control (the unconverted model, the same method, steps, "
        "seed and data) for every budget above 0.",
        True,
    )
    target: Target = _f("What counts as recovered, for the cheapest-budget and seeds tables.", factory=Target)
    output_dir: Optional[str] = _f(
        "Where the study writes (cells/, study.json, study.md, the plot); "
        "null = runs/<grid file name>. `--out` overrides it.",
        None,
    )

    @classmethod
    def from_yaml(cls, path: str | Path, overrides=None) -> "Grid":
        raw = schema.read_yaml(path, "grid")
        schema.apply_overrides(raw, overrides)
        grid = schema.build(cls, raw, error=RecipeError)
        if isinstance(grid.recipe, str):
            grid.recipe = str((Path(path).parent / grid.recipe)) if not Path(grid.recipe).is_absolute() else grid.recipe
        if grid.output_dir is None:
            grid.output_dir = str(Path("runs") / Path(path).stem)
        grid.validate()
        return grid

    def validate(self) -> None:
        if self.recipe is None:
            raise RecipeError("'recipe' is required: the pipeline recipe every cell starts from")
        if not self.schemes:
            raise RecipeError("'schemes' is required: LABEL -> [KEY=VALUE, ...] (e.g. `alibi: []`)")
        for label, overrides in self.schemes.items():
            if not isinstance(overrides, list) or any(not isinstance(x, str) for x in overrides):
                raise RecipeError(f"'schemes.{label}' must be a list of KEY=VALUE strings, got {overrides!r}")
            if not str(label) or any(c in str(label) for c in "/ ") or str(label) == "control":
                raise RecipeError(f"'schemes.{label}': a label is a name without '/' or spaces, not 'control'")
            schema.parse_overrides(overrides)  # KEY=VALUE, or the error names the entry
        for key, values, kind in (
            ("budgets", self.budgets, int),
            ("seeds", self.seeds, int),
            ("methods", self.methods, str),
        ):
            if not values or any(isinstance(v, bool) or not isinstance(v, kind) for v in values):
                raise RecipeError(f"'{key}' must be a non-empty list of {kind.__name__}s, got {values!r}")
            if len(set(values)) != len(values):
                raise RecipeError(f"'{key}' lists a value twice: {values!r}")
        if any(b < 0 for b in self.budgets):
            raise RecipeError(f"'budgets' are optimizer steps (0 = no fine-tune), got {self.budgets!r}")


def cells(grid: Grid) -> list[dict]:
    """The grid's cells, in the order they run: per budget, method and seed, the control first.
    Each: {"name", "label", "scheme", "method", "budget", "seed" (absent: the base seed), "role",
    "overrides" (KEY=VALUE on the recipe)}."""
    out = []
    base_seed = grid.seeds[0]
    for budget in sorted(grid.budgets):
        for method in grid.methods if budget else [NO_FINETUNE]:
            for seed in grid.seeds if budget else [base_seed]:
                tail = f"-seed{seed}" if seed != base_seed else ""
                common = {"method": method, "budget": budget, **({"seed": seed} if tail else {})}
                train = [f"train.method={method}", f"train.steps={budget}", f"train.seed={seed}"] if budget else []
                if budget and grid.control:
                    out.append(
                        {
                            "name": f"control-{method}-{budget}{tail}",
                            "label": "control",
                            "scheme": None,
                            **common,
                            "role": "control",
                            "overrides": ["convert.scheme=null", *train],
                        }
                    )
                for label, overrides in grid.schemes.items():
                    scheme = schema.parse_overrides(overrides).get("convert.scheme", label)
                    out.append(
                        {
                            "name": f"{label}-{method}-{budget}{tail}",
                            "label": label,
                            "scheme": scheme,
                            **common,
                            "role": "converted",
                            "overrides": [f"convert.scheme={label}", *overrides, *train],
                        }
                    )
    return out


def help_text() -> str:
    """Every grid key with its type, default and help (``retrofit study --help``)."""
    lines = []
    for key, tp, default, text in schema.iter_keys(Grid):
        lines.append(f"  {key} ({tp}, default {default!r})\n      {text}")
    return "\n".join(lines)


def to_dict(grid: Grid) -> dict:
    return dataclasses.asdict(grid)
