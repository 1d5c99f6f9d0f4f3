"""What the research scripts share: where things are, the stamp every record carries, how a record is written,
and the command line that reruns a script.

A script here runs as ``python research/NAME.py``: Python puts this folder first on ``sys.path``, so
``from harness import ...`` needs no path set up, and retrofit is the installed package (``pip install -e .``).
Nothing under ``src/`` or ``tests/`` imports from here (``tests/test_research.py``).

    from harness import command, stamp, write_record

    write_record(args.out, {"benchmark": "NAME", "command": command(__file__, argv), **stamp(), "rows": rows})
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
from pathlib import Path

from retrofit.foundation.atomic import write_text
from retrofit.foundation.versions import cpu_info, library_versions

ROOT = Path(__file__).resolve().parents[1]  # the repository
RESEARCH = ROOT / "research"
BENCHMARKS = ROOT / "benchmarks"  # the committed records
DOCS = ROOT / "docs"
RECIPES = ROOT / "recipes"
STANDINS = ROOT / "standins"  # the shipped stand-ins (research/pretrain_standin.py --ship)


def stamp() -> dict:
    """{"hardware", "versions"}: the machine a figure was measured on (platform, CPU count, and
    ``retrofit.foundation.versions.cpu_info``: CPU model, kernel-deciding flags, torch threads, denormal flushing) and the
    library versions (``retrofit.foundation.versions.library_versions``). Every record's header; a script adds what only
    it knows (e.g. the GPU) to ``["hardware"]``."""
    return {
        "hardware": {"platform": platform.platform(), "cpu_count": os.cpu_count(), **cpu_info()},
        "versions": library_versions(),
    }


def command(script: str | os.PathLike, argv: list[str] | None = None) -> str:
    """The command that reruns ``script`` (a file of this folder, e.g. ``__file__``) with ``argv`` (default:
    this process's arguments), from the repository root: ``python research/NAME.py ARGS``."""
    args = sys.argv[1:] if argv is None else list(argv)
    return "python " + shlex.join([f"research/{Path(script).name}", *args])


def write_record(path: str | os.PathLike, payload, *, indent: int = 2) -> Path:
    """Write ``payload`` as JSON (keys in the order given, ``indent`` spaces, a final newline) to ``path``,
    atomically (``retrofit.foundation.atomic``: a stopped run leaves the previous record, never half of the new one),
    creating its folder. Returns the path."""
    return write_text(Path(path), json.dumps(payload, indent=indent) + "\n")


# ----------------------------------------------------------------------------------------------
# the LoRA fine-tune comparisons on the quickstart stand-in (compare_distill.py, compare_dropout.py)
# ----------------------------------------------------------------------------------------------
def bracketed(steps: dict, repeats: int, timer) -> tuple[dict, dict]:
    """Paired timing in one process: each variant of ``steps`` (name -> a callable; "stock" the reference) timed
    between two stock steps (stock, v1, stock, v2, ..., stock; the variants' order reversed every other repeat),
    its ratio to the mean of the two around it, so a drift of the machine's speed over a repeat hits a variant
    and its own stock alike. ``timer(step)`` -> seconds. Returns (times, ratios) by variant."""
    variants = [v for v in steps if v != "stock"]
    times = {v: [] for v in steps}
    ratios = {v: [] for v in variants}
    for r in range(repeats):
        before = timer(steps["stock"])
        times["stock"].append(before)
        for v in variants if r % 2 == 0 else variants[::-1]:
            t = timer(steps[v])
            after = timer(steps["stock"])
            times[v].append(t)
            times["stock"].append(after)
            ratios[v].append(2 * t / (before + after))
            before = after
    return times, ratios


def lora_recipe(out: Path, scheme, objective: str, args) -> dict:
    """The fine-tune both comparisons run: ``args.model`` converted to ``scheme`` (None: unconverted), LoRA r 8
    with the norms trained, ``objective`` (lm, both, distill), validation every ``args.eval_every`` steps."""
    return {
        "model": {"name_or_path": args.model},
        "convert": {"scheme": scheme, "options": {}},
        "data": {
            "dataset": "shakespeare:train",
            "block_length": args.block,
            "validation_fraction": 0.1,
            "max_validation_blocks": args.val_blocks,
        },
        "train": {
            "method": "lora",
            "objective": objective,
            "distill_weight": args.distill_weight,
            "lora": {"r": 8, "alpha": 16, "dropout": 0.0},
            "train_norms": True,
            "steps": args.steps,
            "batch_size": args.batch,
            "learning_rate": args.lr,
            "warmup_steps": 5,
            "eval_every": args.eval_every,
            "seed": 0,
        },
        "checkpoint": {"every": 0},
        "output_dir": str(out),
    }


def lora_parser(doc: str, *, schemes: str, eval_every: int, out: str) -> argparse.ArgumentParser:
    """The options of the LoRA fine-tune comparisons (``lora_recipe``'s ``args``), with each script's defaults."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="baseline:quickstart")
    ap.add_argument("--schemes", default=schemes)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=eval_every)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--distill-weight", type=float, default=1.0)
    ap.add_argument("--val-blocks", type=int, default=64)
    ap.add_argument("--out", default=out)
    return ap
