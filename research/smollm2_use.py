"""Does a *short fine-tune* make a real RoPE model read past its native length? SmolLM2-135M (native 8,192)
fine-tuned toward 2x (16,384) with blocks of 2,048 tokens (a quarter of native: what one GPU, or this CPU,
affords), LoRA, positions stretched over the target by PoSE, then measured exactly as the training-free
methods of ``research/smollm2_reach.py`` (retrieval at distance, effective reach, far-context gain, ppl at 1x)
on the very same held-out sequence, beside those methods run again on it.

Every cell is a ``retrofit finetune`` run of a recipe this script writes (``runs/smollm2_use/CELL/recipe.yaml``,
the command a user types), then one evaluation. Both resume: a stopped fine-tune goes on from its last
checkpoint (every 10 steps), and a cell already in ``--out`` is not measured again (``--redo`` to force).

    OMP_NUM_THREADS=1 python research/smollm2_use.py --cells 'yarn x2 + pose'          # one cell, one thread
    OMP_NUM_THREADS=1 python research/smollm2_use.py --cells 'as is,self_extend,string,yarn x2'  # training-free
    python research/smollm2_use.py --table benchmarks/smollm2_use.json                 # docs/results.md's tables
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

import reach
from harness import stamp, write_record

TARGET = 16384  # 2x SmolLM2's native 8,192

# cell -> (convert, extra recipe keys); the fine-tuned cells share BASE below
CELLS = {
    "yarn x2 + pose": ({"scheme": "rope", "options": {"scaling": "yarn", "factor": 2.0}}, {}),
    "yarn x2 + pose + copies": (
        {"scheme": "rope", "options": {"scaling": "yarn", "factor": 2.0}},
        {"data": {"copies": {"spans": 8, "span_length": 32}}},
    ),
    "yarn x4 + pose": ({"scheme": "rope", "options": {"scaling": "yarn", "factor": 4.0}}, {}),
    "ntk x2 + pose": ({"scheme": "rope", "options": {"scaling": "ntk", "factor": 2.0}}, {}),
    "pi x2 + pose": ({"scheme": "rope", "options": {"scaling": "linear", "factor": 2.0}}, {}),
    "alibi + pose": ({"scheme": "alibi", "options": {}}, {}),
    "alibi + pose + copies": (
        {"scheme": "alibi", "options": {}},
        {"data": {"copies": {"spans": 8, "span_length": 32}}},
    ),
}
FREE = {k: reach.METHODS[k] for k in ("as is", "self_extend", "string", "yarn x2")}  # no fine-tune
FREE["yarn x4"] = {"scaling": "yarn", "factor": 4.0}  # headroom past the target


def recipe(cell: str, args) -> dict:
    """The recipe of a fine-tuned cell: SmolLM2 fp32, Shakespeare's training plays in blocks of 2,048, LoRA r 16
    on q/k/v/o, ``args.steps`` steps of one block, positions by PoSE over [0, 16,384)."""
    convert, extra = CELLS[cell]
    r = {
        "model": {"name_or_path": "smollm2", "dtype": "float32"},
        "convert": convert,
        "data": {"dataset": "shakespeare:train", "block_length": args.train_block, "max_validation_blocks": 4},
        "train": {
            "method": "lora",
            "lora": {"r": 16, "alpha": 32, "dropout": 0.0},
            "steps": args.steps,
            "batch_size": 1,
            "learning_rate": args.lr,
            "warmup_steps": 5,
            "positions": {"method": "pose", "target_length": TARGET},
        },
        "checkpoint": {"every": 10, "keep_last": 1},
        "output_dir": str(Path(args.runs) / slug(cell)),
    }
    for section, keys in extra.items():
        r[section] = {**r[section], **keys}
    return r


def slug(cell: str) -> str:
    return cell.replace(" + ", "-").replace(" ", "")


def finetune(cell: str, args) -> tuple[Path, float]:
    """(final/, seconds): ``retrofit finetune`` on the cell's recipe (resumes a stopped run; skipped when done)."""
    r = recipe(cell, args)
    out = Path(r["output_dir"])
    if (out / "final" / "config.json").exists():
        return out / "final", json.loads((out / "summary.json").read_text()).get("seconds", 0.0)
    out.mkdir(parents=True, exist_ok=True)
    (out.parent / f"{out.name}.yaml").write_text(yaml.safe_dump(r, sort_keys=False))
    t0 = time.time()
    subprocess.run(["retrofit", "finetune", str(out.parent / f"{out.name}.yaml")], check=True)
    seconds = time.time() - t0
    summary = json.loads((out / "summary.json").read_text())
    summary.setdefault("seconds", round(seconds, 1))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out / "final", seconds


def run_cell(cell: str, args, setup_cache: dict) -> dict:
    """One cell's row: fine-tuned (or converted training-free), measured on the shared sequence."""
    import retrofit
    from retrofit.models.io import load_model

    trained = cell in CELLS
    path, ft_seconds = finetune(cell, args) if trained else ("smollm2", 0.0)
    model, tok = load_model(str(path), dtype="float32")
    model.eval()
    if not setup_cache:
        setup_cache.update(reach.prepare(args, tok, args.native or 8192))
    if not trained and FREE[cell] is not None:
        given = dict(FREE[cell])
        retrofit.convert(model, given.pop("scheme", "rope"), **given)
    cached = reach.original_window_cache(args)
    original_window = np.load(cached) if cached.exists() else None
    row, window = reach.measure(model, setup_cache, args, original_window)
    if cell == "as is":
        cached.parent.mkdir(parents=True, exist_ok=True)
        np.save(cached, window)
    row = {"method": cell, "fine_tune": recipe(cell, args) if trained else None, **row}
    if trained:
        log = [json.loads(x) for x in (Path(path).parent / "log.jsonl").read_text().splitlines() if x.strip()]
        row["fine_tune_seconds"] = round(ft_seconds, 1)
        row["fine_tune_tokens"] = args.steps * args.train_block
        row["val_loss"] = [r["val_loss"] for r in log if "val_loss" in r]
    return row


def table(data: dict) -> str:
    """docs/results.md's tables for this record: smollm2_reach's two (far-context gain and reach; copy gain by
    distance), then what each cell cost and kept at 1x, and where it stands against SelfExtend past native."""
    rows = data["rows"]
    base = next((r for r in rows if r["method"] == "as is"), None)
    se = next((r for r in rows if r["method"] == "self_extend"), None)
    native = rows[0]["effective_reach"]["native"]
    out = [
        reach.table(data),
        "",
        "| method | fine-tune | ppl at 1x (first 8k) | vs the original | past native: copy gain minus SelfExtend's |",
        "|---|---|---:|---:|---|",
    ]
    for r in rows:
        ft = "none"
        if r.get("fine_tune_tokens"):
            took = r.get("fine_tune_seconds")
            ft = f"{r['fine_tune_tokens']:,} tokens" + (
                f", {took / 60:.0f} min" if took else ", resumed (see its note)"
            )
        ratio = f"{r['ppl_first_half'] / base['ppl_first_half']:.3f}x" if base else "–"
        vs = "–"
        if se is not None and r is not se:
            diffs = [c["copy_gain"] - s["copy_gain"] for c, s in zip(r["copy"], se["copy"]) if c["distance"] > native]
            vs = " / ".join(f"{x:+.2f}" for x in diffs)
        out.append(f"| {r['method']} | {ft} | {r['ppl_first_half']:.2f} | {ratio} | {vs} |")
    return "\n".join(out)


def best(data: dict) -> dict:
    """The fine-tuned cell that reads furthest: effective reach, then its interval's low end, then its mean copy
    gain past native."""
    native = data["rows"][0]["effective_reach"]["native"]

    def key(r):
        e = r["effective_reach"]
        past = [c["copy_gain"] for c in r["copy"] if c["distance"] > native]
        return (e["reach"], e["reach_low"], sum(past) / max(1, len(past)))

    return max((r for r in data["rows"] if r.get("fine_tune")), key=key)


def readme_cell(data: dict) -> str:
    """The README's sentence for the best fine-tuned cell, against SelfExtend (no training) on the same probes."""
    r, native = best(data), data["rows"][0]["effective_reach"]["native"]
    se = next((x for x in data["rows"] if x["method"] == "self_extend"), None)
    base = next((x for x in data["rows"] if x["method"] == "as is"), None)
    e = r["effective_reach"]

    def past(row):
        gains = [c["copy_gain"] for c in row["copy"] if c["distance"] > native]
        return f"{min(gains):.2f}-{max(gains):.2f}"

    out = (
        f"**{r['method']}**, LoRA, {r['fine_tune_tokens']:,} tokens (80 steps of one 2,048-token block): effective reach {reach._x(e['reach'], native)} [{reach._x(e['reach_low'], native)}, "
        f"{reach._x(e['reach_high'], native)}], retrieval past native saves {past(r)} nats a token"
    )
    if se is not None:
        out += f" (SelfExtend, no training, {past(se)} on the same probes)"
    if base is not None:
        ratio = r["ppl_first_half"] / base["ppl_first_half"]
        out += f"; ppl at 1x {ratio:.3f}x the original's (held-out text of the fine-tune's own domain)"
    return out


def save_row(args, setup: dict, row: dict) -> None:
    """Add ``row`` to ``args.out`` under a lock, reading the record again first: cells run side by side (one
    thread each) and each writes its own row without dropping the others'."""
    import fcntl

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(f"{args.out}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = json.loads(Path(args.out).read_text())["rows"] if Path(args.out).exists() else []
        rows = [r for r in rows if r["method"] != row["method"]] + [row]
        order = [*FREE, *CELLS]
        rows.sort(key=lambda r: order.index(r["method"]) if r["method"] in order else 99)
        write_record(
            args.out,
            {
                **reach.header(args, setup, f"fine-tuned {args.steps} steps x {args.train_block} tokens (LoRA)"),
                "benchmark": "smollm2_use",
                "command": "OMP_NUM_THREADS=1 python research/smollm2_use.py",
                "threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
                **stamp(),
                "rows": rows,
            },
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default=",".join([*FREE, *CELLS]))
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--train-block", type=int, default=2048, help="fine-tune block length")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--runs", default="runs/smollm2_use")
    ap.add_argument("--out", default="benchmarks/smollm2_use.json")
    ap.add_argument("--redo", action="store_true", help="measure a cell again though --out has it")
    ap.add_argument("--table", metavar="JSON", help="print the markdown tables of a record and exit")
    ap.add_argument("--readme", action="store_true", help="with --table: the README's sentence for the best cell")
    reach.sequence_options(ap, length=TARGET)  # the shared sequence: smollm2_reach's options, 8 probes a distance
    args = ap.parse_args(argv)
    args.command = "OMP_NUM_THREADS=1 python research/smollm2_use.py"
    if args.table:
        data = json.loads(Path(args.table).read_text())
        print(readme_cell(data) if args.readme else table(data))
        return 0
    setup: dict = {}
    for cell in [c for c in args.cells.split(",") if c]:
        rows = json.loads(Path(args.out).read_text())["rows"] if Path(args.out).exists() else []
        if any(r["method"] == cell for r in rows) and not args.redo:
            print(f"{cell}: in {args.out} already", file=sys.stderr)
            continue
        row = run_cell(cell, args, setup)
        save_row(args, setup, row)
        print(json.dumps({k: row[k] for k in ("method", "ppl_first_half", "effective_reach")}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
