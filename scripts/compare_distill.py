"""Does the distill objective recover native-length quality faster than next-token loss alone?

A small GPT-2 pretrained offline on Shakespeare (``baseline:quickstart``: learned absolute
positions, native length 128) is converted (rope, alibi) and LoRA-fine-tuned with
``objective: lm`` and with ``objective: both`` (lm + KL to the unconverted original on
native-length windows), same data, seed, steps and learning rate. The validation loss at the
native length (held-out documents) is logged every ``--eval-every`` steps.

The stand-in is undertrained, so any further training on Shakespeare lowers its loss; the control
is therefore the *unconverted* model given the same LoRA fine-tune (``none/lm``). "Recovered" means:
the gap to that control, step by step.

    OMP_NUM_THREADS=2 python scripts/compare_distill.py --steps 60 --eval-every 10
    -> benchmarks/compare_distill.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from retrofit.training import finetune
from retrofit.versions import cpu_info


def recipe(out: Path, scheme, objective: str, args) -> dict:
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


def curve(out: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}


def parser(doc: str, *, schemes: str, eval_every: int, out: str) -> argparse.ArgumentParser:
    """The LoRA fine-tune comparison's options (shared with compare_dropout.py)."""
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


def main(argv=None) -> int:
    ap = parser(__doc__, schemes="rope,alibi", eval_every=10, out="benchmarks/compare_distill.json")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="compare-distill-"))
    control = finetune(recipe(tmp / "none-lm", None, "lm", args))
    runs = {"none/lm": curve(control)}
    native = runs["none/lm"][0]
    for scheme in args.schemes.split(","):
        for objective in ("lm", "both"):
            out = finetune(recipe(tmp / f"{scheme}-{objective}", scheme, objective, args))
            runs[f"{scheme}/{objective}"] = curve(out)
    result = {
        "model": args.model,
        "native_length": args.block,
        "original_val_loss": native,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "hardware": cpu_info(),
        "val_loss": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    steps = sorted(next(iter(runs.values())))
    print(f"\nvalidation loss at the native length ({args.block}); unconverted original: {native:.4f}\n")
    print("| run | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("|---|" + "---:|" * len(steps))
    for name, c in runs.items():
        print(f"| {name} | " + " | ".join(f"{c[s]:.4f}" for s in steps) + " |")
    print("\ngap to the unconverted model fine-tuned the same way (none/lm):\n")
    print("| run | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("|---|" + "---:|" * len(steps))
    for name, c in runs.items():
        if name != "none/lm":
            print(f"| {name} | " + " | ".join(f"{c[s] - runs['none/lm'][s]:+.4f}" for s in steps) + " |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
