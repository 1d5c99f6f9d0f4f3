"""Figures for sharded fine-tunes: the cases of research/test_sharded.py (the same tiny models, recipes and
`accelerate launch --config_file recipes/accelerate/X.yaml -m retrofit finetune` commands) against one
process over the same global batch, with the differences the tests bound written out as numbers.

    python research/check_sharded.py --out benchmarks/sharded.json

The cases, models, recipe, launch and readings are ``research/sharded.py``'s, the ones the test
(``research/test_sharded.py``) takes its cases from.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from harness import RECIPES, command, stamp, write_record
from sharded import CASES, build_models, launch, logits, losses, recipe

CONFIGS = RECIPES / "accelerate"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/sharded.json")
    args = ap.parse_args()
    from retrofit.training import finetune

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        models = build_models(tmp)
        for case, (model, scheme, options, method, config) in CASES.items():
            where = tmp / case
            where.mkdir()
            t0 = time.perf_counter()
            res = launch(
                CONFIGS / config,
                recipe(models / model, scheme, options, method, where / "sharded", batch_size=1),
                where,
            )
            if res.returncode:
                raise SystemExit(f"{case} failed:\n{res.stderr[-3000:]}")
            seconds = time.perf_counter() - t0
            single = finetune(recipe(models / model, scheme, options, method, where / "single", batch_size=2))
            s = json.loads((where / "sharded" / "summary.json").read_text())
            one = json.loads((single / "summary.json").read_text())
            a, b = torch.tensor(losses(where / "sharded")), torch.tensor(losses(single))
            peak = s["peak_memory_mib"]
            rows.append(
                {
                    "case": case,
                    "accelerate_config": f"recipes/accelerate/{config}",
                    "route": s["route"],
                    "steps": len(a),
                    "max_step_loss_diff": float((a - b).abs().max()),
                    "val_loss_after": [s["val_loss_after"], one["val_loss_after"]],
                    "final_logits_max_diff": float(
                        (logits(where / "sharded" / "final") - logits(single / "final")).abs().max()
                    ),
                    "peak_rss_minus_baseline_mib_per_rank": [
                        round(x - y, 1) for x, y in zip(peak["rss"], peak["rss_before_model"])
                    ],
                    "sharded_seconds": round(seconds, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    write_record(
        args.out,
        {"command": command(__file__, ["--out", args.out]), "torch": torch.__version__, **stamp(), "rows": rows},
    )


if __name__ == "__main__":
    main()
