"""Calibration on the GPT-2 study stand-in (issue 33 item 3): the zero-shot ratio to the original at 1x
(256 tokens) on the held-out plays, before and after ``retrofit.calibrate``, per scheme and learning rate.

    OMP_NUM_THREADS=1 RETROFIT_PROGRESS=0 python research/measure_calibrate.py \\
        --cells t5:1e-2 alibi:1e-2 --out benchmarks/calibrate.json

A cell is SCHEME[+learn_slopes]:LR[:STEPS]; alibi is converted with learn_slopes=true. Calibration data:
shakespeare:train; held-out: shakespeare:heldout (the first --budget tokens). One thread.
"""

from __future__ import annotations

import argparse
import copy
import time

from harness import ROOT, STANDINS, command, stamp, write_record

STANDIN = STANDINS / "study2-gpt2-acb8e7edbe56"


def main() -> int:
    import torch

    import retrofit
    from retrofit.data.specs import load_documents

    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", nargs="+", default=["t5:1e-2", "alibi:1e-2"])
    ap.add_argument("--budget", type=int, default=16384)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    original, tok = retrofit.load_model(str(STANDIN))
    train, held = load_documents("shakespeare:train"), load_documents("shakespeare:heldout")
    rows = []
    for cell in args.cells:
        parts = cell.split(":")
        scheme, lr = parts[0], float(parts[1])
        steps = int(parts[2]) if len(parts) > 2 else 200
        options = {"learn_slopes": True} if scheme == "alibi" else {}
        model = copy.deepcopy(original)
        retrofit.convert(model, scheme, **options)
        t0 = time.perf_counter()
        rec = retrofit.calibrate(
            model,
            original,
            train,
            tokenizer=tok,
            heldout=held,
            steps=steps,
            learning_rate=lr,
            budget=args.budget,
            progress=False,
        )
        rec.update(scheme=scheme, options=options, total_seconds=round(time.perf_counter() - t0, 1))
        rec["data"], rec["heldout"] = "shakespeare:train", "shakespeare:heldout"
        rows.append(rec)
        print(
            f"{scheme} {options} lr={lr} steps={steps}: ratio {rec['ratio_before']:.4f} -> {rec['ratio_after']:.4f} "
            f"(KL {rec['kl_first10']:.4f} -> {rec['kl_last10']:.4f}; train {rec['train_seconds']} s, "
            f"total {rec['total_seconds']} s)",
            flush=True,
        )
    if args.out:
        out = {
            "model": str(STANDIN.relative_to(ROOT)),
            "command": command(__file__),
            "threads": 1,
            **stamp(),
            "rows": rows,
        }
        write_record(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
