"""``retrofit finetune RECIPE [--set key=value ...]``: run a fine-tune recipe."""

from __future__ import annotations

import argparse
import os
import textwrap
from pathlib import Path


def _keys_help() -> str:
    from ..training.recipe import iter_keys

    lines = ["recipe keys (YAML; set any of them with --set key=value):", ""]
    for key, tp, default, help_text in iter_keys():
        default = (
            "required"
            if default is None and key in ("model.name_or_path", "output_dir")
            else f"default {_yaml(default)}"
        )
        lines.append(f"  {key}  ({tp}; {default})")
        lines += textwrap.wrap(help_text, width=92, initial_indent="      ", subsequent_indent="      ")
    lines += [
        "",
        "examples:",
        "  retrofit finetune recipes/gpt2-alibi-lora.yaml",
        "  retrofit finetune recipes/gpt2-alibi-lora.yaml --set train.steps=200 --set data.block_length=512",
        "  accelerate launch --num_processes 4 -m retrofit finetune recipes/llama-yarn-lora.yaml",
        "  accelerate launch --config_file recipes/accelerate/fsdp.yaml -m retrofit finetune recipes/llama-yarn-lora.yaml",
        "",
        "output_dir receives final/ (merged, patched; read with retrofit.load), adapter/ (LoRA),",
        "checkpoints/, log.jsonl, recipe.yaml (resolved), versions.json and summary.json.",
    ]
    return "\n".join(lines)


def _yaml(value) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def add_parser(sub) -> None:
    p = sub.add_parser(
        "finetune",
        help="fine-tune a converted model from a recipe (LoRA or full; Accelerate; resumable)",
        description="Convert a model's positional mechanism and fine-tune it as a YAML recipe says. "
        "Runs in one process, or under `accelerate launch` with several (DDP, FSDP, DeepSpeed, CPU/gloo).",
        epilog=_keys_help,  # called when --help is printed
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("recipe", help="recipe YAML file (see recipes/)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe key, value parsed as YAML (repeatable): --set train.steps=200",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the recipe against its data files, its model's config and its first records (no weights "
        "read), print it resolved, and exit",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the budget (tokens, steps), the time and the peak memory per device this recipe needs "
        "under DDP, FSDP and FSDP + CPU offload (formulas from the recipe and the model's config; "
        "nothing is read or trained) and exit",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=None,
        metavar="N",
        help="with --plan: processes to plan for (default: what the same command would start: WORLD_SIZE "
        "under a launcher, else 1)",
    )
    p.add_argument(
        "--tokens-per-s",
        type=float,
        default=None,
        metavar="R",
        help="with --plan: your measured tokens/s (all devices together) for the time estimate (default: "
        "on paper, from the model's FLOPs per token on the device the run would use: its CUDA GPU at 30%% "
        "of its bf16 peak, else this CPU at 50%% of its fp32 matmul rate, measured)",
    )
    p.add_argument(
        "--final-from",
        type=Path,
        default=None,
        metavar="CHECKPOINT",
        help="write final/ (and adapter/) from a checkpoint folder of this recipe's run "
        "(checkpoints/step_N: one process, DDP, FSDP sharded or DeepSpeed ZeRO-3), on one process",
    )
    p.add_argument(
        "--trust-pickle",
        action="store_true",
        help="with --final-from: allow unpickling Python objects in DeepSpeed files (your own run's only)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..training.recipe import Recipe

    recipe = Recipe.from_yaml(args.recipe, args.overrides)
    if args.check:
        from ..training.preflight import check

        notes = check(recipe)  # the data files, the model's config and the first records: no weights read
        print(recipe.to_yaml(), end="")
        for note in notes:
            print(f"# not checked: {note}")
        return 0
    if args.plan:
        from ..training.plan import default_processes, plan_budget, plan_model

        processes, said = (args.processes, f"{args.processes} (--processes)") if args.processes else default_processes()
        print(f"processes: {said}")
        print(plan_budget(recipe, processes), flush=True)  # printed even where the model's config cannot be read
        print("\n".join(plan_model(recipe, processes, args.tokens_per_s)))
        return 0
    if args.final_from is not None:
        from ..training.outputs import final_from

        print(final_from(recipe, args.final_from, trust_pickle=args.trust_pickle))
        return 0
    from ..models.sources import precheck

    precheck(recipe.model.name_or_path, recipe.model.gguf_file)  # a missing model is said before torch is imported
    from ..training.preflight import check

    check(recipe)  # so is what the model's config and the first records rule out (the loop checks again, for the API)
    from ..foundation.run_folder import FINAL
    from ..training import finetune

    out = finetune(recipe)
    if os.environ.get("RANK", "0") == "0":  # under accelerate launch: once, not once per process
        print(out / FINAL)
    return 0
