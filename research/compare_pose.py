"""PoSE and randomized positions against plain fine-tuning, at equal tokens, on the GPT-2 stand-in.

``baseline:quickstart`` (a small GPT-2 pretrained offline on Shakespeare; learned absolute positions,
native length 128) is converted to each scheme and LoRA-fine-tuned with blocks of ``--block`` tokens,
the same steps, data, seed and learning rate, three ways: plain (positions 0..L-1), PoSE and
randomized positions over ``--target`` positions. Each result is evaluated on held-out Shakespeare at
1x..``--target`` tokens (non-overlapping windows, the same tokens for every run).

    OMP_NUM_THREADS=2 python research/compare_pose.py --schemes rope --steps 60 --block 128 --target 1024
    -> benchmarks/compare_pose.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from harness import command, stamp, write_record


def recipe(out: Path, scheme: str, method: str, args) -> dict:
    positions = {} if method == "plain" else {"method": method, "target_length": args.target}
    return {
        "model": {"name_or_path": args.model},
        "convert": {"scheme": scheme, "options": {}},
        "data": {
            "dataset": "shakespeare:train",
            "block_length": args.block,
            "validation_fraction": 0.05,
            "max_validation_blocks": 8,
        },
        "train": {
            "method": "lora",
            "lora": {"r": 8, "alpha": 16, "dropout": 0.0},
            "train_norms": True,
            "steps": args.steps,
            "batch_size": args.batch,
            "learning_rate": args.lr,
            "warmup_steps": 5,
            "seed": 0,
            "positions": positions,
        },
        "checkpoint": {"every": 0},
        "output_dir": str(out),
    }


def main(argv=None) -> int:
    from retrofit.evaluation import evaluate
    from retrofit.training import finetune

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="baseline:quickstart")
    ap.add_argument("--schemes", default="rope")
    ap.add_argument("--methods", default="plain,pose,randomized")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--target", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--budget", type=int, default=8192, help="evaluation tokens per length")
    ap.add_argument("--out", default="benchmarks/compare_pose.json")
    args = ap.parse_args(argv)
    lengths = [args.block * m for m in (1, 2, 4, 8, 16) if args.block * m <= args.target]
    tmp = Path(tempfile.mkdtemp(prefix="compare-pose-"))
    rows = []
    for scheme in args.schemes.split(","):
        for method in args.methods.split(","):
            t0 = time.perf_counter()
            out = finetune(recipe(tmp / f"{scheme}-{method}", scheme, method, args))
            train_s = time.perf_counter() - t0
            report = evaluate(
                str(out / "final"),
                lengths=lengths,
                data="shakespeare:heldout",
                budget=args.budget,
                sliding=False,
                progress=False,
            )
            ppl = {n: round(report.ppl(length=n), 3) for n in lengths}
            rows.append(
                {
                    "scheme": scheme,
                    "method": method,
                    "ppl": ppl,
                    "train_seconds": round(train_s, 1),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            result = {
                "benchmark": "compare_pose",
                "command": command(__file__, argv),
                "settings": {k: v for k, v in vars(args).items() if k != "out"},
                "tokens_per_run": args.steps * args.batch * args.block,
                **stamp(),
                "rows": rows,
            }
            write_record(args.out, result)
    print("| scheme | method | " + " | ".join(f"ppl@{n}" for n in lengths) + " |")
    print("|---|---|" + "---:|" * len(lengths))
    for r in rows:
        print(
            f"| {r['scheme']} | {r['method']} | "
            + " | ".join(f"{r['ppl'].get(n, float('nan')):.2f}" for n in lengths)
            + " |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
