"""How far does a short fine-tune make SmolLM2-135M read, and does a *swap* of its mechanism read at all? SmolLM2
(native 8,192) toward 4x native (32,768): one held-out Shakespeare sequence of 32,768 tokens with 8 probes of 32
tokens (cue 8) at each of 9 distances from 0.25x to 3.75x native (seed 2: the first seed whose probes all fit
without overlap at 3.75x); ppl at 1x on that text and on two texts of other domains than the fine-tune's
(English prose from Python's bundled documentation, ``pydoc_data/topics.py``; standard-library code).

Cells: training-free at 4x (the original through its window, SelfExtend and STRING with factor 4, YaRN x4 and
x8, dynamic NTK x4); the 2x round's adapter (``benchmarks/smollm2_use_adapter``, YaRN x4 + PoSE over 16k);
fine-tuned cells, each a ``retrofit finetune`` of a recipe this script writes (``runs/smollm2_far/CELL.yaml``,
the command a user types): LoRA r 16, ``--steps`` (150) steps of one 2,048-token block of Shakespeare's training
plays, positions spread over [0, 32,768): YaRN x8 + PoSE (with and without ``data.copies``), RoPE -> ALiBi +
PoSE, RoPE -> NoPE with temperature 0.1 and QK-norm + PoSE, YaRN x8 with EndPrompt's placement (the block's last
quarter ending near 32k).

Resumable: a stopped fine-tune goes on from its last checkpoint (every 10 steps), and a cell already in
``--out`` is not measured again. One thread a job:

    OMP_NUM_THREADS=1 python research/smollm2_far.py                  # every cell, in order
    OMP_NUM_THREADS=1 python research/smollm2_far.py --cells 'as is,self_extend x4'
    python research/smollm2_far.py --table benchmarks/smollm2_far.json   # docs/results.md's tables
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

NATIVE, TARGET = 8192, 32768
ADAPTER_2X = "benchmarks/smollm2_use_adapter"

# training-free cells: rope options, or {"scheme": ...} for another scheme; None: the original as it is
FREE = {
    "as is": None,
    "self_extend x4": {"extension": "self_extend", "factor": 4.0},
    "string x4": {"extension": "string", "factor": 4.0},
    "yarn x4": {"scaling": "yarn", "factor": 4.0},
    "yarn x8": {"scaling": "yarn", "factor": 8.0},
    "dynamic x4": {"scaling": "dynamic", "factor": 4.0},
}
POSE = {"method": "pose", "target_length": TARGET}
COPIES = {"copies": {"spans": 8, "span_length": 32}}
# fine-tuned cells: (convert, extra data keys, positions)
CELLS = {
    "yarn x8 + pose": ({"scheme": "rope", "options": {"scaling": "yarn", "factor": 8.0}}, {}, POSE),
    "alibi + pose": ({"scheme": "alibi", "options": {}}, {}, POSE),
    "nope + temperature + qk_norm + pose": (
        {"scheme": "nope", "options": {"temperature": 0.1, "qk_norm": True}},
        {},
        POSE,
    ),
    "yarn x8 + pose + copies": ({"scheme": "rope", "options": {"scaling": "yarn", "factor": 8.0}}, COPIES, POSE),
    # dynamic NTK sizes its rotation on the largest position + 1: exact up to native, and under PoSE's placed
    # positions the fine-tune trains the rotation the far reading uses
    "dynamic x4 + pose + copies": ({"scheme": "rope", "options": {"scaling": "dynamic", "factor": 4.0}}, COPIES, POSE),
    "yarn x8 + endprompt": (
        {"scheme": "rope", "options": {"scaling": "yarn", "factor": 8.0}},
        {},
        {"method": "endprompt", "target_length": TARGET},
    ),
}
ORDER = ["as is", "yarn x4 + pose (2x round)", "self_extend x4", "yarn x8 + pose", "string x4", "yarn x8"]
ORDER += ["yarn x4", "dynamic x4", "alibi + pose", "nope + temperature + qk_norm + pose", "yarn x8 + endprompt"]
ORDER += ["yarn x8 + pose + copies", "dynamic x4 + pose + copies"]


def recipe(cell: str, args) -> dict:
    """A fine-tuned cell's recipe: SmolLM2 fp32, Shakespeare's training plays in blocks of 2,048, LoRA r 16."""
    convert, data, positions = CELLS[cell]
    return {
        "model": {"name_or_path": "smollm2", "dtype": "float32"},
        "convert": convert,
        "data": {"dataset": "shakespeare:train", "block_length": args.train_block, "max_validation_blocks": 4, **data},
        "train": {
            "method": "lora",
            "lora": {"r": 16, "alpha": 32, "dropout": 0.0},
            "steps": args.steps,
            "batch_size": 1,
            "learning_rate": args.lr,
            "warmup_steps": 5,
            "positions": positions,
        },
        "checkpoint": {"every": 10, "keep_last": 1},
        "output_dir": str(Path(args.runs) / slug(cell)),
    }


def slug(cell: str) -> str:
    return cell.replace(" + ", "-").replace(" ", "").replace("(", "").replace(")", "")


def finetune(cell: str, args) -> tuple[Path, float]:
    """(final/, seconds of this process's part): ``retrofit finetune`` on the cell's recipe (resumes)."""
    r = recipe(cell, args)
    out = Path(r["output_dir"])
    spent = out / "seconds.json"  # the fine-tune's wall seconds over every resume
    if not (out / "final" / "config.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        path = out.parent / f"{out.name}.yaml"
        path.write_text(yaml.safe_dump(r, sort_keys=False))
        before = json.loads(spent.read_text())["seconds"] if spent.exists() else 0.0
        t0, proc = time.time(), subprocess.Popen(["retrofit", "finetune", str(path)])
        while proc.poll() is None:  # written as it runs: a job killed outright loses at most 30 s of the count
            spent.write_text(json.dumps({"seconds": round(before + time.time() - t0, 1)}))
            time.sleep(min(30.0, 1.0 + time.time() - t0))
        spent.write_text(json.dumps({"seconds": round(before + time.time() - t0, 1)}))
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, proc.args)
    return out / "final", json.loads(spent.read_text())["seconds"] if spent.exists() else 0.0


def other_domains(tok) -> dict:
    """{name: ids (1, NATIVE)}: the first native-length stretch of two texts the fine-tune never saw."""
    from pydoc_data.topics import topics

    import torch

    from retrofit.data.specs import stdlib_documents

    prose = "\n\n".join(topics[k] for k in sorted(topics))
    code = ""
    for d in sorted(stdlib_documents(), key=lambda d: d.name):
        code += d.text + "\n"
        if len(code) > 8 * NATIVE:
            break
    out = {}
    for name, text in (("pydoc prose", prose), ("stdlib code", code)):
        ids = tok(text, add_special_tokens=False)["input_ids"][:NATIVE]
        out[name] = torch.tensor(ids)[None]
    return out


def ppl_out_of_domain(model, texts: dict) -> dict:
    return {name: round(float(np.exp(reach.score(model, ids)[0].mean())), 3) for name, ids in texts.items()}


def load(cell: str, args):
    """(model, fine-tune facts or None) for a cell."""
    import retrofit
    from retrofit.models.io import load_model

    if cell in CELLS:
        path, seconds = finetune(cell, args)
        model, _ = load_model(str(path), dtype="float32", tokenizer=False)
        log = [json.loads(x) for x in (path.parent / "log.jsonl").read_text().splitlines() if x.strip()]
        facts = {
            "recipe": recipe(cell, args),
            "fine_tune_seconds": seconds,
            "fine_tune_tokens": args.steps * args.train_block,
            "val_loss": [x["val_loss"] for x in log if "val_loss" in x],
        }
        return model, facts
    if cell == "yarn x4 + pose (2x round)":
        return retrofit.load(ADAPTER_2X), {"adapter": ADAPTER_2X, "fine_tune_tokens": 80 * 2048}
    model, _ = load_model("smollm2", dtype="float32", tokenizer=False)
    if FREE[cell] is not None:
        given = dict(FREE[cell])
        retrofit.convert(model, given.pop("scheme", "rope"), **given)
    return model, None


def run_cell(cell: str, args, setup: dict, texts: dict) -> dict:
    model, facts = load(cell, args)
    model.eval()
    cached = reach.original_window_cache(args)
    original_window = np.load(cached) if cached.exists() else None
    t0 = time.time()
    row, window = reach.measure(model, setup, args, original_window)
    if cell == "as is":
        cached.parent.mkdir(parents=True, exist_ok=True)
        np.save(cached, window)
    row["ppl_1x_other_domains"] = ppl_out_of_domain(model, texts)
    row["measure_seconds"] = round(time.time() - t0, 1)
    return {"method": cell, "fine_tune": facts, **row}


def save_row(args, setup: dict, row: dict) -> None:
    """Add ``row`` to ``args.out``, reading the record again first (another process may have added a row)."""
    import fcntl

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(f"{args.out}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = json.loads(Path(args.out).read_text())["rows"] if Path(args.out).exists() else []
        rows = [r for r in rows if r["method"] != row["method"]] + [row]
        rows.sort(key=lambda r: ORDER.index(r["method"]) if r["method"] in ORDER else 99)
        head = reach.header(args, setup, f"fine-tuned cells: {args.steps} steps x {args.train_block} tokens (LoRA)")
        head["benchmark"] = "smollm2_far"
        threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
        write_record(args.out, {**head, "threads": threads, **stamp(), "rows": rows})


def table(data: dict) -> str:
    """docs/results.md's tables: reach and copy gain by distance (reach.table), then ppl at 1x in and out of
    domain against the original's, and what each fine-tune cost."""
    rows = data["rows"]
    base = next((r for r in rows if r["method"] == "as is"), None)
    domains = list(rows[0].get("ppl_1x_other_domains", {}))
    out = [reach.table(data).replace("full 16k", "full 32k").replace("16k forward", "32k forward"), ""]
    first = "ppl at 1x, Shakespeare"  # the first native stretch of the 32k reading
    first = first if "Shakespeare" in data.get("data", "Shakespeare") else "first 8k of the 32k prose reading"
    out.append(f"| method | fine-tune | {first} | " + " | ".join(domains) + " |")
    out.append("|---|---|---:|" + "---:|" * len(domains))
    for r in rows:
        ft = r.get("fine_tune") or {}
        cost = "none"
        if ft.get("fine_tune_tokens"):
            cost = f"{ft['fine_tune_tokens']:,} tokens"
            cost += f", {ft['fine_tune_seconds'] / 3600:.1f} h" if ft.get("fine_tune_seconds") else ""

        def ratio(value, ref):
            return f"{value:.2f} ({value / ref:.3f}x)" if ref else f"{value:.2f}"

        first = ratio(r["ppl_first_half"], base and base["ppl_first_half"])
        other = [ratio(r["ppl_1x_other_domains"][d], base and base["ppl_1x_other_domains"][d]) for d in domains]
        out.append(f"| {r['method']} | {cost} | {first} | " + " | ".join(other) + " |")
    return "\n".join(out + ["", targets(data)])


def selfextend(rows: list) -> dict | None:
    """The training-free reference every fine-tuned cell is held against (SelfExtend x4), if measured."""
    return next((r for r in rows if r["method"] == "self_extend x4"), None)


def against(row: dict, ref: dict) -> str:
    """How ``row``'s copy gain compares with ``ref``'s at every distance past native both measured: "at least as
    strong at every one" or the distance where it falls furthest short, and by how many nats a token."""
    ref_gain = {c["distance"]: c["copy_gain"] for c in ref["copy"]}
    native = row["effective_reach"]["native"]
    short = [
        (ref_gain[c["distance"]] - c["copy_gain"], c["distance"]) for c in row["copy"] if c["distance"] in ref_gain
    ]
    short = [(gap, d) for gap, d in short if d > native]
    if not short:
        return "no distance past native in common"
    gap, d = max(short)
    if gap <= 0:
        return "at least as strong at every distance past native"
    return f"short by up to {gap:.2f} nats a token (at {d / native:g}x)"


def targets(data: dict) -> str:
    """The issue's targets for each fine-tuned cell: effective reach >= 3.5x; ppl at 1x <= 1.02x the original's on
    both texts of other domains; past native, a copy gain at least SelfExtend x4's at every distance."""
    rows = data["rows"]
    base = next((r for r in rows if r["method"] == "as is"), None)
    ref = selfextend(rows)
    out = ["| fine-tuned cell | effective reach >= 3.5x | ppl at 1x out of domain <= 1.02x | against SelfExtend x4 |"]
    out.append("|---|---|---|---|")
    for r in [r for r in rows if r.get("fine_tune")]:
        e = r["effective_reach"]
        x = e["reach"] / e["native"]
        met = {True: "met", False: "not met"}
        vs = against(r, ref) if ref else "SelfExtend x4 not measured"
        kept = "the original not in this record"
        if base:
            domains = r["ppl_1x_other_domains"]
            worst = max(domains[d] / base["ppl_1x_other_domains"][d] for d in domains)
            kept = f"{worst:.3f}x: {met[worst <= 1.02]}"
        out.append(f"| {r['method']} | {x:g}x: {met[x >= 3.5]} | {kept} | {vs} |")
    return "\n".join(out)


def readme_cell(data: dict) -> str:
    """The README's words for the 2x round's adapter read at 4x: its reach at 32k and its ppl at 1x out of domain."""
    row = next(r for r in data["rows"] if r["method"] == "yarn x4 + pose (2x round)")
    base = next(r for r in data["rows"] if r["method"] == "as is")
    e, native = row["effective_reach"], row["effective_reach"]["native"]
    other = [row["ppl_1x_other_domains"][d] / base["ppl_1x_other_domains"][d] for d in row["ppl_1x_other_domains"]]
    return (
        f"read at 4x (32k), the same adapter retrieves to {reach._x(e['reach'], native)} "
        f"[{reach._x(e['reach_low'], native)}, {reach._x(e['reach_high'], native)}], and its ppl at 1x on text of "
        f"other domains (prose, code) is {min(other):.3f}-{max(other):.3f}x the original's"
    )


def readme_training_free(data: dict) -> list[str]:
    """The README's words for each training-free extension measured at 4x (SelfExtend, STRING): its reach at 32k and
    its ppl at 1x against the original's, in and out of domain."""
    base = next(r for r in data["rows"] if r["method"] == "as is")
    out = []
    for row in data["rows"]:
        if row.get("fine_tune") or not row["method"].startswith(("self_extend", "string")):
            continue
        e, native = row["effective_reach"], row["effective_reach"]["native"]
        ratios = [row["ppl_first_half"] / base["ppl_first_half"]]
        ratios += [
            row["ppl_1x_other_domains"][d] / base["ppl_1x_other_domains"][d] for d in row["ppl_1x_other_domains"]
        ]
        out.append(
            f"{row['method']} read at 4x (32k), no training: effective reach {reach._x(e['reach'], native)} "
            f"[{reach._x(e['reach_low'], native)}, {reach._x(e['reach_high'], native)}], ppl at 1x "
            f"{min(ratios):.3f}-{max(ratios):.3f}x the original's (Shakespeare, prose, code)"
        )
    return out


def readme_tuned(data: dict) -> list[str]:
    """The README's words for each fine-tuned rescaled-RoPE cell of this grid (the 2x round's adapter has
    ``readme_cell``): its reach at 32k, its ppl at 1x in and out of domain, what it cost."""
    base = next(r for r in data["rows"] if r["method"] == "as is")
    ref = selfextend(data["rows"])
    out = []
    for row in data["rows"]:
        convert = ((row.get("fine_tune") or {}).get("recipe") or {}).get("convert", {})
        if convert.get("scheme") != "rope":
            continue
        e, native, ft = row["effective_reach"], row["effective_reach"]["native"], row["fine_tune"]
        other = [row["ppl_1x_other_domains"][d] / base["ppl_1x_other_domains"][d] for d in row["ppl_1x_other_domains"]]
        far = [c["copy_gain"] for c in row["copy"] if c["distance"] > native]
        line = (
            f"{row['method']} (LoRA, {ft['fine_tune_tokens']:,} tokens, {ft['fine_tune_seconds'] / 3600:.1f} h of one "
            f"thread): effective reach {reach._x(e['reach'], native)} [{reach._x(e['reach_low'], native)}, "
            f"{reach._x(e['reach_high'], native)}] at 4x (32k); ppl at 1x "
            f"{row['ppl_first_half'] / base['ppl_first_half']:.3f}x the original's in domain, "
            f"{min(other):.3f}-{max(other):.3f}x on prose and code"
        )
        if far and ref:
            gain = row["far_context_gain"]["own native window"]["gain"]
            line += (
                f"; past native a repeated span saves {min(far):.2f}-{max(far):.2f} nats a token, against SelfExtend "
                f"x4 {against(row, ref)}; far-context gain on plain text {gain:.2f}"
            )
        out.append(line)
    return out


def readme_prose(data: dict) -> list[str]:
    """The README's words for each fine-tuned cell read on held-out prose (``--text prose``, another domain than
    the fine-tunes'): its copy gains past native, against SelfExtend x4, and its far-context gain beside SelfExtend's."""
    ref, out = selfextend(data["rows"]), []
    for row in [r for r in data["rows"] if r.get("fine_tune") and ref]:
        native = row["effective_reach"]["native"]
        far = [c["copy_gain"] for c in row["copy"] if c["distance"] > native]
        gain = [r["far_context_gain"]["own native window"]["gain"] for r in (row, ref)]
        out.append(
            f"on held-out English prose, {row['method']}: past native a repeated span saves {min(far):.2f}-"
            f"{max(far):.2f} nats a token, against SelfExtend x4 {against(row, ref)}; far-context gain on the prose "
            f"{gain[0]:.2f} (SelfExtend x4 {gain[1]:.2f})"
        )
    return out


def readme_swaps(data: dict) -> list[str]:
    """The README's words for each swapped mechanism measured (RoPE -> ALiBi, RoPE -> NoPE): what it retrieves and
    what it keeps at 1x, whatever they are."""
    base = next(r for r in data["rows"] if r["method"] == "as is")
    out = []
    for row in data["rows"]:
        scheme = (row.get("fine_tune") or {}).get("recipe", {}).get("convert", {}).get("scheme")
        if scheme not in ("alibi", "nope"):
            continue
        gains = [c["copy_gain"] for c in row["copy"]]
        first = row["ppl_first_half"] / base["ppl_first_half"]
        other = [row["ppl_1x_other_domains"][d] / base["ppl_1x_other_domains"][d] for d in row["ppl_1x_other_domains"]]
        ft = row["fine_tune"]
        out.append(
            f"RoPE -> {scheme} ({row['method']}, LoRA, {ft['fine_tune_tokens']:,} tokens): a repeated span saves "
            f"{min(gains):.2f} to {max(gains):.2f} nats a token at 0.25x-3.75x native; ppl at 1x {first:.1f}x the "
            f"original's in domain, {min(other):.0f}-{max(other):.0f}x on prose and code"
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default=",".join(ORDER))
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--train-block", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--runs", default="runs/smollm2_far")
    ap.add_argument("--out", help="the record (default benchmarks/smollm2_far.json; with --text prose, _prose.json)")
    ap.add_argument("--table", metavar="JSON", help="print the markdown tables of a record and exit")
    ap.add_argument("--readme", action="store_true", help="with --table: the README's words for the 2x adapter")
    ap.add_argument("--readme-swaps", action="store_true", help="with --table: the README's words for the swaps")
    ap.add_argument("--readme-free", action="store_true", help="with --table: the README's words, training-free")
    ap.add_argument("--readme-tuned", action="store_true", help="with --table: the README's words, fine-tuned RoPE")
    ap.add_argument("--readme-prose", action="store_true", help="with --table: the README's words, prose probes")
    reach.sequence_options(
        ap,
        length=TARGET,
        distances="2048,4096,8192,12288,16384,20480,24576,28672,30720",
        seed=2,
        native=NATIVE,
        cache="runs/smollm2_far",
    )
    args = ap.parse_args(argv)
    text = "" if args.text == "shakespeare" else f"_{args.text}"  # one record a text: rows of two never mix
    args.out = args.out or f"benchmarks/smollm2_far{text}.json"
    args.command = "OMP_NUM_THREADS=1 python research/smollm2_far.py" + (f" --text {args.text}" if text else "")
    if args.table:
        data = json.loads(Path(args.table).read_text())
        words = {
            "readme_swaps": readme_swaps,
            "readme_free": readme_training_free,
            "readme_tuned": readme_tuned,
            "readme_prose": readme_prose,
        }
        chosen = [fn for flag, fn in words.items() if getattr(args, flag)]
        if chosen:
            print("\n".join(chosen[0](data)))
            return 0
        print(readme_cell(data) if args.readme else table(data))
        return 0
    from retrofit.models.io import load_model

    tok = load_model("smollm2", dtype="float32")[1]
    setup, texts = reach.prepare(args, tok, NATIVE), other_domains(tok)
    for cell in [c for c in args.cells.split(",") if c]:
        rows = json.loads(Path(args.out).read_text())["rows"] if Path(args.out).exists() else []
        if any(r["method"] == cell for r in rows):
            print(f"{cell}: in {args.out} already", file=sys.stderr)
            continue
        print(f"== {cell} ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)
        row = run_cell(cell, args, setup, texts)
        save_row(args, setup, row)
        brief = {k: row[k] for k in ("method", "ppl_first_half", "effective_reach", "ppl_1x_other_domains")}
        print(json.dumps(brief), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
