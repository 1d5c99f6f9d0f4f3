"""``retrofit run RECIPE``: convert -> fine-tune -> eval -> export -> card -> push, resumable."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from ..pipeline.stages import STAGES

    p = sub.add_parser(
        "run",
        help="the whole pipeline from one recipe: fine-tune, eval against the original, export, card, push",
        description="Convert and fine-tune as the recipe says, evaluate against the original model past its native "
        "length, export to a native architecture where possible, write the model card, and push if the recipe "
        "names push.repo. Re-running skips the stages already done (manifest.json in the run folder); a "
        "fine-tune that was killed resumes from its last checkpoint.",
        epilog="A pipeline recipe is a fine-tune recipe (see `retrofit finetune --help`) plus the sections eval:, "
        "export:, card: and push: (see docs/pipeline.md).\n\nexamples:\n"
        "  retrofit run recipes/quickstart.yaml\n"
        "  retrofit run recipes/quickstart.yaml --set train.steps=50 --set output_dir=runs/qs50\n"
        "  retrofit run recipes/quickstart.yaml --set push.repo=me/quickstart-alibi",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("recipe", help="pipeline recipe YAML (see recipes/quickstart.yaml)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe key, value parsed as YAML (repeatable): --set eval.budget=4096",
    )
    p.add_argument(
        "--force",
        action="append",
        default=[],
        choices=STAGES,
        metavar="STAGE",
        help=f"re-run a stage even if it is done (repeatable; one of {', '.join(STAGES)})",
    )
    p.add_argument("--check", action="store_true", help="validate the recipe, print it resolved, and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    import time

    import yaml

    from ..pipeline.stages import load_recipe, where
    from ..pipeline.stages import run as run_pipeline

    recipe = load_recipe(args.recipe, args.overrides)
    if args.check:
        print(yaml.safe_dump(recipe.to_dict(), sort_keys=False), end="")
        return 0
    t0 = time.perf_counter()
    run_dir = run_pipeline(recipe, force=tuple(args.force))
    print(f"\nretrofit run: done in {time.perf_counter() - t0:.0f} s; results in {run_dir}/")
    for label, path in where(run_dir).items():
        print(f"  {label:<14} {path}")
    return 0
