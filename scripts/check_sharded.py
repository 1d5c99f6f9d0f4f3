"""Figures for sharded fine-tunes: each case of tests/training/test_sharded.py (the same tiny models, recipes and
`accelerate launch --config_file recipes/accelerate/X.yaml -m retrofit finetune` commands) against one
process over the same global batch, with the differences the tests bound written out as numbers.

    python scripts/check_sharded.py --out benchmarks/sharded.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import test_sharded as T  # noqa: E402  (one definition of the cases, recipes and launch command)

sys.path.insert(0, str(REPO))
from retrofit.versions import cpu_info  # noqa: E402  (the CPU every figure was measured on)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/sharded.json")
    args = ap.parse_args()
    from retrofit.training import finetune

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        models = T.build_models(tmp)
        for case, (model, scheme, options, method, config) in T.CASES.items():
            where = tmp / case
            where.mkdir()
            t0 = time.perf_counter()
            res = T.launch(
                config, T.recipe(models / model, scheme, options, method, where / "sharded", batch_size=1), where
            )
            if res.returncode:
                raise SystemExit(f"{case} failed:\n{res.stderr[-3000:]}")
            seconds = time.perf_counter() - t0
            single = finetune(T.recipe(models / model, scheme, options, method, where / "single", batch_size=2))
            s = json.loads((where / "sharded" / "summary.json").read_text())
            one = json.loads((single / "summary.json").read_text())
            a, b = torch.tensor(T._losses(where / "sharded")), torch.tensor(T._losses(single))
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
                        (T._logits(where / "sharded" / "final") - T._logits(single / "final")).abs().max()
                    ),
                    "peak_rss_minus_baseline_mib_per_rank": [
                        round(x - y, 1) for x, y in zip(peak["rss"], peak["rss_before_model"])
                    ],
                    "sharded_seconds": round(seconds, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "command": f"python scripts/check_sharded.py --out {args.out}",
                "torch": torch.__version__,
                "hardware": cpu_info(),
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
