"""Recall (``retrofit eval --recall``) of the study's models: each stand-in's original, its budget-0
conversions (calibrated ones included) and the fine-tuned cells whose weights are on this machine, at
1x, 4x and 16x the native length. Exact continuations per length pooled over the depths, with the 95%
Wilson interval, and the share of continuation tokens predicted right.

    python research/measure_recall.py --out benchmarks/recall_study3.json \\
        --model original=baseline:study2-gpt2 --model alibi-cal-2%=runs/study3-gpt2/alibi-cal-full-0.02/ft/final \\
        --model t5-0=baseline:study2-gpt2+t5 --model t5-cal-0=baseline:study2-gpt2+t5+calibrate
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import retrofit
from harness import command, stamp, write_record
from retrofit.foundation.native import native_length
from retrofit.scoring.intervals import wilson


def build(spec: str):
    """``SOURCE[+SCHEME[:k=v;...]][+calibrate]`` -> (model, tokenizer): a folder or built-in name, converted
    and calibrated (200 steps on shakespeare:train) as the spec says."""
    source, *rest = spec.split("+")
    model, tok = retrofit.load_model(source)
    original = copy.deepcopy(model) if "calibrate" in rest else None
    for part in (p for p in rest if p != "calibrate"):
        scheme, _, opts = part.partition(":")
        options = {}
        for item in (x for x in opts.split(";") if x):
            k, _, v = item.partition("=")
            options[k] = json.loads(v) if v not in ("",) else v
        retrofit.convert(model, scheme, **options)
    if original is not None:
        retrofit.calibrate(model, original, "shakespeare:train", tokenizer=tok, progress=False)
    return model, tok


def pooled(rows: list[dict]) -> dict:
    """{length: {correct, trials, accuracy, ci_low, ci_high, token_accuracy}} over the depths."""
    out = {}
    for r in rows:
        if r.get("accuracy") is None:
            out[str(r["length"])] = {"note": r.get("note")}
            continue
        c = out.setdefault(str(r["length"]), {"correct": 0, "trials": 0, "tokens": 0.0})
        c["correct"] += r["correct"]
        c["trials"] += r["trials"]
        c["tokens"] += r["token_accuracy"] * r["trials"]
    for c in out.values():
        if "trials" in c:
            c["accuracy"] = round(c["correct"] / c["trials"], 4)
            c["ci_low"], c["ci_high"] = (round(x, 4) for x in wilson(c["correct"], c["trials"]))
            c["token_accuracy"] = round(c.pop("tokens") / c["trials"], 4)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", required=True, metavar="LABEL=SPEC")
    ap.add_argument("--multiples", default="1,4,16")
    ap.add_argument("--depths", default="0,0.5,1")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    record = json.loads(out.read_text()) if out.exists() else {"models": {}}
    record.update(
        {
            "command": command(__file__, argv),
            **stamp(),
            "settings": {
                "multiples": a.multiples,
                "depths": a.depths,
                "trials": a.trials,
                "data": "shakespeare:heldout",
            },
        }
    )
    for item in a.model:
        label, _, spec = item.partition("=")
        t0 = time.time()
        model, tok = build(spec)
        info = retrofit.describe(model)
        native = info["native"]["length"] if info["converted"] else native_length(model.config)
        # an unconverted original reads its native length only
        lengths = [native * int(m) for m in a.multiples.split(",")] if info["converted"] else [native]
        rep = retrofit.evaluate(
            model,
            lengths=[native],
            data="shakespeare:heldout",
            tokenizer=tok,
            budget=native,
            sliding=False,
            recall=True,
            recall_lengths=lengths,
            recall_depths=[float(d) for d in a.depths.split(",")],
            recall_trials=a.trials,
            progress=False,
        )
        rows = [r for r in rep.data["recall"] if r["role"] != "baseline"]
        record["models"][label] = {"spec": spec, "by_length": pooled(rows), "seconds": round(time.time() - t0, 1)}
        print(label, json.dumps(record["models"][label]["by_length"]), flush=True)
        write_record(out, record, indent=1)  # after every model: a stopped run keeps the rest


if __name__ == "__main__":
    main()
