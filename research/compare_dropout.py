"""What does fine-tuning without attention dropout cost? (the recipe default ``train.attention_dropout: 0``)

The CPU flash kernel the fused bias kernels run on has no dropout, so with GPT-2's ``attn_pdrop = 0.1`` a
T5/Shaw/FIRE fine-tune falls to the chunked kernel. The recipe default turns the attention dropout off for the
fine-tune. This runs the same LoRA fine-tune of the GPT-2 stand-in (``baseline:quickstart``, native 128,
pretrained without dropout) converted to each scheme, once with GPT-2's attention dropout 0.1 and once with
0 (``--dropouts``), same data, seed, steps and learning rate, and records
the held-out validation loss every ``--eval-every`` steps, and the seconds of each run.

    OMP_NUM_THREADS=1 python research/compare_dropout.py --schemes t5 --steps 60 --eval-every 20
    -> benchmarks/compare_dropout.json
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from harness import command, lora_parser, lora_recipe, stamp, write_record
from retrofit.training import finetune


def recipe(out: Path, scheme: str, dropout, args) -> dict:
    """The comparisons' LoRA fine-tune (harness.lora_recipe, next-token loss) with the attention dropout set."""
    r = lora_recipe(out, scheme, "lm", args)
    r["train"]["attention_dropout"] = dropout
    return r


def main(argv=None) -> int:
    ap = lora_parser(__doc__, schemes="t5", eval_every=20, out="benchmarks/compare_dropout.json")
    ap.add_argument("--dropouts", default="0.1,0", help="train.attention_dropout values ('null': the model's own)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="compare-dropout-"))
    runs = {}
    for scheme in args.schemes.split(","):
        for dropout in [None if d == "null" else float(d) for d in args.dropouts.split(",")]:
            name = f"{scheme}/attention_dropout={'model' if dropout is None else dropout}"
            t0 = time.perf_counter()
            out = finetune(recipe(tmp / name.replace("/", "-"), scheme, dropout, args))
            seconds = time.perf_counter() - t0
            log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
            runs[name] = {
                "val_loss": {r["step"]: r["val_loss"] for r in log if "val_loss" in r},
                "seconds": round(seconds, 1),
            }
            print(name, json.dumps(runs[name]), file=sys.stderr, flush=True)
            write_record(
                args.out,
                {
                    "benchmark": "compare_dropout",
                    "command": command(__file__, argv),
                    "settings": {k: v for k, v in vars(args).items() if k != "out"},
                    **stamp(),
                    "runs": runs,
                },
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
