"""Issue 60's study: which scheme lets a converted encoder *use* a long document, on the offline tasks of
``retrofit.data.longdoc`` (mention: one piece of evidence anywhere; both: two pieces about 0.8 of the document
apart; needle: retrieval of the document that holds a passage; passkey: retrieval of the document that holds
the key a query asks for).

1. The stand-in classifiers and embedding models (``baseline:small-bert``, native 256): a short task fine-tune at
   native, full, in two stages (documents of 64-128 tokens, then 64-256) through ``retrofit.finetune``. The mention
   classifier and the needle embedding model are shipped (``standins/``, ``--ship``) and used from there.
2. A cell per (task, scheme): the native model converted (``extend`` copy to 8x, symmetric ``alibi``, ``t5``,
   ``rope`` with NTK x4) and fine-tuned on documents of 256-1,024 tokens (1x-4x) for ``BUDGET`` tokens (2% of the
   stand-in's 8,388,608 pretraining tokens), full.
3. ``retrofit.evaluate`` of each cell with ``--baseline`` the native model: accuracy (top-1) at 1x, 2x, 4x, 8x for
   the cell reading whole documents, the original truncated at 256 and over 256-token chunks.

Resumable: a cell already in the record is skipped; runs live under ``runs/encoder-tasks/``.

    OMP_NUM_THREADS=1 python research/encoder_tasks.py                       # every cell
    python research/encoder_tasks.py --table benchmarks/encoder_tasks.json   # the markdown tables
    python research/encoder_tasks.py --table benchmarks/encoder_tasks.json --readme   # the README's row
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import retrofit
from harness import BENCHMARKS, ROOT, command, stamp, write_record
from retrofit.data.longdoc import task_of
from retrofit.models.standin import SUMS_FILE, check_shipped, file_sha256

RUNS = ROOT / "runs" / "encoder-tasks"
OUT = BENCHMARKS / "encoder_tasks.json"
PRETRAIN_TOKENS = 8_388_608  # baseline:small-bert's pretraining (standins/small-bert-*/pretrain_stats.json)
BUDGET = PRETRAIN_TOKENS // 50  # 2%
BATCH, LONGEST = 4, 1024
TASKS = {"mention": "classification", "both": "classification", "needle": "embedding", "passkey": "embedding"}
SCHEMES = {
    "extend": {"length": "8x", "init": "copy"},
    "alibi": {},
    "t5": {},
    "rope-ntk": {"scaling": "ntk", "factor": 4},
}
NATIVE_STAGES = ((64, 128, 300), (64, 256, 300))  # (shortest, longest document, steps) at batch 32


def recipe(task: str, model: str, out: Path, lengths: tuple, steps: int, batch: int, lr: float, scheme=None) -> dict:
    name, options = (scheme.split("-")[0], SCHEMES[scheme]) if scheme else (None, {})
    return {
        "task": TASKS[task],
        "model": {"name_or_path": model},
        "convert": {"scheme": name, "options": options},
        "data": {
            "dataset": f"longdoc:{task}",
            "min_block_length": lengths[0],
            "block_length": lengths[1],
            "max_validation_blocks": 64,
        },
        "train": {
            "method": "full",
            "steps": steps,
            "batch_size": batch,
            "learning_rate": lr,
            "warmup_steps": max(1, steps // 10),
            **({"seed": HP["seed"]} if HP["seed"] else {}),
            "weight_decay": 0.01,
        },
        "checkpoint": {"every": 50},
        "output_dir": str(out),
    }


SHIPPED = {"mention": "small-bert-mention-classifier", "needle": "small-bert-needle-embedding"}  # in standins/


def native(task: str) -> Path:
    """The stand-in model of ``task``: the shipped one (checked against its SHA256SUMS), else final/ of its last
    stage, trained once."""
    shipped = ROOT / "standins" / SHIPPED.get(task, "-")
    if shipped.is_dir():
        check_shipped(shipped)
        return shipped
    model = "baseline:small-bert"
    for i, (lo, hi, steps) in enumerate(NATIVE_STAGES):
        out = RUNS / f"{task}-native-{i}"
        if not (out / "summary.json").is_file():
            retrofit.finetune(recipe(task, model, out, (lo, hi), steps, 32, 1e-3))
        model = str(out / "final")
    return Path(model)


def ship(task: str) -> Path:
    """Copy the task's trained stand-in (final/ of its last stage) into ``standins/`` with its SHA256SUMS and how it
    was built (build.json: the stages, tokens and held-out metric of each)."""
    import shutil

    dest = ROOT / "standins" / SHIPPED[task]
    if dest.exists():
        raise SystemExit(f"{dest} exists: a shipped stand-in is never replaced (reports name its weights)")
    last = RUNS / f"{task}-native-{len(NATIVE_STAGES) - 1}"
    shutil.copytree(last / "final", dest)
    cfg = json.loads((dest / "config.json").read_text())
    if TASKS[task] == "classification":  # class names, in the label order it was trained with
        labels = task_of(f"longdoc:{task}").labels
        cfg.update(id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    cfg["_name_or_path"] = SHIPPED[task]
    write_record(dest / "config.json", cfg)
    stages = [json.loads((RUNS / f"{task}-native-{i}" / "summary.json").read_text()) for i in range(len(NATIVE_STAGES))]
    build = {
        "from": "baseline:small-bert",
        "task": f"longdoc:{task}",
        "stages": [
            {"documents": [lo, hi], "steps": steps, "batch_size": 32, "tokens": s["tokens"], "heldout": s["heldout"]}
            for (lo, hi, steps), s in zip(NATIVE_STAGES, stages)
        ],
        "command": command(__file__, ["--tasks", task, "--ship"]),
        **stamp(),
    }
    write_record(dest / "build.json", build)
    files = sorted(p for p in dest.rglob("*") if p.is_file())
    sums = "".join(f"{file_sha256(p)}  {p.relative_to(dest).as_posix()}\n" for p in files)
    (dest / SUMS_FILE).write_text(sums)
    check_shipped(dest)
    return dest


LR = 3e-4
HP = {"batch": BATCH, "lr": LR, "seed": 0}  # the cells' fine-tune; --batch/--lr/--seed: a variant (own runs, name)


def variant(scheme: str) -> str:
    """A cell's name: the scheme, and the fine-tune's batch and learning rate when they are not the study's."""
    if (HP["batch"], HP["lr"], HP["seed"]) == (BATCH, LR, 0):
        return scheme
    return f"{scheme} (batch {HP['batch']}, lr {HP['lr']:g}" + (f", seed {HP['seed']})" if HP["seed"] else ")")


def cell(task: str, scheme: str, base: Path) -> dict:
    name = variant(scheme)
    out = RUNS / f"{task}-{name.replace(' ', '').replace('(', '-').replace(')', '').replace(',', '-')}"
    steps = BUDGET // (HP["batch"] * LONGEST)
    t0 = time.time()
    if not (out / "summary.json").is_file():
        retrofit.finetune(recipe(task, str(base), out, (256, LONGEST), steps, HP["batch"], HP["lr"], scheme))
    summary = json.loads((out / "summary.json").read_text())
    report = retrofit.evaluate(str(out), data=f"longdoc:{task}", baselines=[str(base)], progress=False)
    return {
        "task": task,
        "scheme": name,
        "options": SCHEMES[scheme],
        "steps": steps,
        "tokens": summary["tokens"],
        "budget_share": summary["tokens"] / PRETRAIN_TOKENS,
        "heldout": summary.get("heldout"),
        "seconds": round(time.time() - t0, 1),
        "eval": report.data,
    }


def untrained(task: str, scheme: str, base: Path) -> dict:
    """The native model converted, no fine-tune: what the conversion alone reads."""
    from transformers import AutoTokenizer

    model = retrofit.load_model(str(base))[0]
    retrofit.convert(model, scheme.split("-")[0], **SCHEMES[scheme])
    pair = (model, AutoTokenizer.from_pretrained(base))
    report = retrofit.evaluate(pair, data=f"longdoc:{task}", baselines=[str(base)], progress=False)
    return {
        "task": task,
        "scheme": f"{scheme} (no fine-tune)",
        "options": SCHEMES[scheme],
        "steps": 0,
        "eval": report.data,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.add_argument("--untrained", action="store_true", help="also each scheme with no fine-tune (the conversion alone)")
    p.add_argument("--table", help="print the markdown tables of this record and exit")
    p.add_argument("--readme", action="store_true", help="with --table: print the README's row instead")
    p.add_argument("--ship", action="store_true", help="copy each task's trained stand-in into standins/ and exit")
    p.add_argument("--batch", type=int, default=BATCH, help="a variant's batch size (the budget stays: fewer steps)")
    p.add_argument("--lr", type=float, default=LR, help="a variant's learning rate")
    p.add_argument("--seed", type=int, default=0, help="a variant's train.seed (its examples and its head)")
    args = p.parse_args(argv)
    HP.update(batch=args.batch, lr=args.lr, seed=args.seed)
    if args.ship:
        for task in (t for t in args.tasks.split(",") if t in SHIPPED):
            print(ship(task))
        return
    if args.table:
        record = json.loads(Path(args.table).read_text())
        print(readme_row(record) if args.readme else tables(record))
        return
    record = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {"rows": []}
    for task in args.tasks.split(","):
        base = native(task)
        for scheme in args.schemes.split(","):
            for name, measure in ((variant(scheme), cell), (f"{scheme} (no fine-tune)", untrained)):
                if name.endswith("(no fine-tune)") and not args.untrained:
                    continue
                if any(r["task"] == task and r["scheme"] == name for r in record["rows"]):
                    continue
                record["rows"].append(measure(task, scheme, base))
            record.update(benchmark="encoder_tasks", command=command(__file__, argv), **stamp())
            write_record(args.out, record)
            print(f"{task} {scheme}: {record['rows'][-1]['eval']['verdict']}", flush=True)


def tables(record: dict) -> str:
    """A table per task: a row per reading (the original truncated and chunked once, each scheme whole)."""
    out = []
    for task in TASKS:
        rows = [r for r in record["rows"] if r["task"] == task]
        if not rows:
            continue
        lengths = rows[0]["eval"]["lengths"]
        metric = "accuracy" if TASKS[task] == "classification" else "top-1"
        out += [f"**longdoc:{task}** ({metric}, %, 64 documents a length)", ""]
        out += [f"| reading | {' | '.join(f'{L:,}' for L in lengths)} |", "|---|" + "---:|" * len(lengths)]
        first = rows[0]["eval"]["rows"]
        for how in ("truncated", "chunk-mean", "best-chunk"):
            out.append(_line(f"original, {how}", first, lambda r, h=how: r["role"] == "baseline" and r["read"] == h))
        out.append(_line("original, whole", first, lambda r: r["role"] == "baseline" and r["read"] == "whole", lengths))
        for r in rows:
            name = f"{r['scheme']}, whole" if r["steps"] == 0 else f"{r['scheme']} (fine-tuned), whole"
            out.append(_line(name, r["eval"]["rows"], lambda x: x["role"] != "baseline", lengths))
        out.append("")
    return "\n".join(out)


def score(record: dict, task: str, scheme: str | None, read: str, multiple: int) -> float | None:
    """A cell's score at ``multiple`` x native: the scheme's reading whole, or (scheme None) the original's."""
    for r in record["rows"]:
        if r["task"] != task or (scheme is not None and r["scheme"] != scheme):
            continue
        ev = r["eval"]
        L = ev["native"] * multiple
        role = "baseline" if scheme is None else "converted"
        got = [
            x["score"]
            for x in ev["rows"]
            if x["length"] == L and x["read"] == read and (x["role"] == "baseline") == (role == "baseline")
        ]
        if got:
            return got[0]
    return None


def best(record: dict, task: str, multiple: int = 4) -> str:
    """The scheme with the highest score at ``multiple`` x native on ``task``."""
    schemes = [r["scheme"] for r in record["rows"] if r["task"] == task and r["steps"]]
    return max(schemes, key=lambda s: score(record, task, s, "whole", multiple) or 0.0)


def readme_row(record: dict) -> str:
    """The README's encoder-task row: the best scheme on each task at 4x against the original's readings."""
    pct = lambda v: "–" if v is None else f"{100 * v:.0f}%"  # noqa: E731
    parts = []
    for task in TASKS:
        if not any(r["task"] == task for r in record["rows"]):
            continue
        s = best(record, task)
        orig = {how: score(record, task, None, how, 4) for how in ("truncated", "chunk-mean", "best-chunk")}
        parts.append(
            f"`longdoc:{task}` {s} {pct(score(record, task, s, 'whole', 4))} (original truncated "
            f"{pct(orig['truncated'])}, chunks mean {pct(orig['chunk-mean'])} / best {pct(orig['best-chunk'])})"
        )
    return "at 4x native after 2% of pretraining tokens (full): " + "; ".join(parts)


def _line(name: str, rows: list, keep, lengths=None) -> str:
    got = {r["length"]: r["score"] for r in rows if keep(r)}
    lengths = lengths or sorted(got)
    return f"| {name} | " + " | ".join(f"{100 * got[L]:.1f}" if L in got else "—" for L in lengths) + " |"


if __name__ == "__main__":
    main()
