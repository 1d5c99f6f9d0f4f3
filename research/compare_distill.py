"""Does the distill objective recover native-length quality faster than next-token loss alone?

A small GPT-2 pretrained offline on Shakespeare (``baseline:quickstart``: learned absolute
positions, native length 128) is converted (rope, alibi) and LoRA-fine-tuned with
``objective: lm`` and with ``objective: both`` (lm + KL to the unconverted original on
native-length windows), same data, seed, steps and learning rate. The validation loss at the
native length (held-out documents) is logged every ``--eval-every`` steps.

The stand-in is undertrained, so any further training on Shakespeare lowers its loss; the control
is therefore the *unconverted* model given the same LoRA fine-tune (``none/lm``). "Recovered" means:
the gap to that control, step by step.

    OMP_NUM_THREADS=2 python research/compare_distill.py --steps 60 --eval-every 10
    -> benchmarks/compare_distill.json
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from harness import command, lora_parser, lora_recipe, stamp, write_record
from retrofit.training import finetune


def curve(out: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}


def main(argv=None) -> int:
    ap = lora_parser(__doc__, schemes="rope,alibi", eval_every=10, out="benchmarks/compare_distill.json")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="compare-distill-"))
    control = finetune(lora_recipe(tmp / "none-lm", None, "lm", args))
    runs = {"none/lm": curve(control)}
    native = runs["none/lm"][0]
    for scheme in args.schemes.split(","):
        for objective in ("lm", "both"):
            out = finetune(lora_recipe(tmp / f"{scheme}-{objective}", scheme, objective, args))
            runs[f"{scheme}/{objective}"] = curve(out)
    result = {
        "command": command(__file__, argv),
        "model": args.model,
        "native_length": args.block,
        "original_val_loss": native,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        **stamp(),
        "val_loss": runs,
    }
    write_record(args.out, result)
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
