"""Same outputs before and after a refactor: a fixed small set of runs under two source trees, compared file by file.

    nice -n 10 python research/same_outputs.py --old OLD_CHECKOUT --new NEW_CHECKOUT [--work DIR] [--only NAME]

Each case runs ``python -m retrofit ...`` with ``PYTHONPATH=TREE/src`` (one thread, offline, a shared retrofit cache
and the new tree's ``standins/``), first under ``--old`` then under ``--new``, in the same folder (``WORK/run``, moved
to ``WORK/old/NAME`` and ``WORK/new/NAME`` afterwards) so that paths written into the outputs are equal. Then every
file of the two folders is compared:

- ``*.safetensors`` and other binary files by sha256; a ``torch.save`` file (optimizer, scheduler, RNG state) that
  differs in bytes is loaded and compared tensor by tensor (``torch.equal``);
- ``*.json``/``*.jsonl`` by content with timing fields dropped (keys naming seconds, times, rates, dates, hosts,
  memory);
- ``*.md``/``*.txt``/``*.yaml`` and the rest as text, with timing figures masked (``12.3 s``, ``4 min``, ``1,234 tokens/s``,
  ISO dates), a report.md's ``## Cost`` section dropped (tokens/s, memory) and the source tree's path replaced by
  ``<SRC>``.

Exit 0 when every case matched, 1 when one differed (each difference printed), 2 when a run failed. The cases: a
4-step full fine-tune of the quickstart stand-in (with a checkpoint: optimizer and scheduler state), the same with
PoSE positions + copies, with T5 + calibration, with LoRA, a classifier and an embedding model on the small-bert
stand-in (longdoc tasks), ``retrofit eval`` (with ``--baseline original`` and passkey) of the first run's result and
of the classifier's (the long-document report).
A few minutes on 2 busy cores in all."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

QUICK = {
    "model": {"name_or_path": "baseline:quickstart"},
    "convert": {"scheme": "alibi", "options": {"scale_bias": True}},
    "data": {
        "dataset": "shakespeare:train",
        "max_documents": 4,
        "block_length": 256,
        "validation_fraction": 0.1,
        "max_validation_blocks": 4,
    },
    "train": {
        "method": "full",
        "steps": 4,
        "batch_size": 2,
        "learning_rate": 1.0e-3,
        "lr_scheduler": "cosine",
        "warmup_steps": 1,
        "weight_decay": 0.01,
        "eval_every": 2,
    },
    "checkpoint": {"every": 2, "keep_last": 1},
}


def _merge(base: dict, over: dict) -> dict:
    out = json.loads(json.dumps(base))
    for k, v in over.items():
        merge = isinstance(v, dict) and v and isinstance(out.get(k), dict)  # an empty dict replaces
        out[k] = _merge(out[k], v) if merge else v
    return out


def _encoder(task: str, dataset: str) -> dict:
    return {
        "task": task,
        "model": {"name_or_path": "baseline:small-bert"},
        "convert": {"scheme": "alibi"},
        "data": {"dataset": dataset, "block_length": 512, "min_block_length": 256, "max_validation_blocks": 4},
        "train": {"method": "full", "steps": 4, "batch_size": 2, "learning_rate": 1e-3, "warmup_steps": 1},
        "checkpoint": {"every": 2, "keep_last": 1},
    }


# name -> recipe (a fine-tune) or ("eval", case whose run is evaluated, extra arguments)
CASES: dict[str, dict | tuple] = {
    "full": QUICK,
    "pose_copies": _merge(
        QUICK,
        {
            "train": {"positions": {"method": "pose", "target_length": 1024}},
            "data": {"copies": {"spans": 1, "span_length": 16}},
        },
    ),
    "t5_calibrate": _merge(
        QUICK,
        {
            "convert": {
                "scheme": "t5",
                "options": {},
                "calibrate": {"data": "shakespeare:train", "steps": 3, "budget": 1024},
            }
        },
    ),
    "lora": _merge(QUICK, {"train": {"method": "lora", "learning_rate": 3e-3}}),
    "classification": _encoder("classification", "longdoc:mention"),
    "embedding": _encoder("embedding", "longdoc:needle"),
    "eval": (
        "eval",
        "full",
        ["--lengths", "1x,2x", "--budget", "2048", "--baseline", "original", "--passkey", "--passkey-trials", "1"],
    ),
    "eval_classifier": ("eval", "classification", ["--lengths", "1x,2x"]),  # its original is a masked LM
}

TIMING_KEY = re.compile(
    r"(^|_)(s|sec|secs|seconds|time|times|elapsed|wall|duration|date|when|started|finished|host|"
    r"hostname|per_s|tokens_per_s|rate|throughput|minutes|min|timestamp|cpu|machine|memory|mib|rss)($|_)",
    re.I,
)
TIMING_TEXT = [
    (re.compile(r"\d[\d,]*(\.\d+)?\s*(s|sec|seconds|min|minutes|h|ms)\b"), "<T>"),
    (re.compile(r"\d[\d,]*(\.\d+)?\s*(tokens?|it|steps?)/s\b"), "<RATE>"),
    (re.compile(r"\d{4}-\d\d-\d\d([T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)?)?"), "<DATE>"),
]


def _env(tree: Path, work: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RETROFIT_", "PYTHONPATH"))}
    env.update(
        PYTHONPATH=str(tree / "src"),
        RETROFIT_CACHE=str(work / "cache"),
        RETROFIT_STANDINS=str(work / "standins"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONHASHSEED="0",
    )
    return env


def _run(argv: list[str], tree: Path, work: Path, log: Path) -> None:
    cmd = [sys.executable, "-m", "retrofit", *argv]  # at the script's own priority (run it under nice)
    t = time.time()
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=work, env=_env(tree, work), stdout=f, stderr=subprocess.STDOUT).returncode
    print(f"  {' '.join(argv[:2])} under {tree}: rc {rc}, {time.time() - t:.0f} s", flush=True)
    if rc != 0:
        sys.exit(f"run failed (rc {rc}): {' '.join(cmd)}\n{log.read_text()[-3000:]}")


def run_case(name: str, tree: Path, side: str, work: Path) -> None:
    """Run one case under ``tree`` in ``WORK/run`` and move its folder to ``WORK/side/name``."""
    import yaml

    run, dest = work / "run", work / side / name
    shutil.rmtree(run, ignore_errors=True)
    shutil.rmtree(dest, ignore_errors=True)
    case = CASES[name]
    log = work / f"{side}-{name}.log"
    if isinstance(case, tuple):  # evaluate the result of another case, copied into place
        shutil.copytree(work / side / case[1], run)
        shutil.rmtree(run / "eval", ignore_errors=True)
        _run([case[0], str(run), "--out", str(run / "eval"), "--no-plots", "--no-progress", *case[2]], tree, work, log)
        dest.mkdir(parents=True)
        shutil.move(str(run / "eval"), dest / "eval")
        shutil.rmtree(run)
        return
    recipe = work / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**case, "output_dir": str(run)}))
    _run(["finetune", str(recipe)], tree, work, log)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(run), dest)


def _drop_timing(x):
    if isinstance(x, dict):
        return {k: _drop_timing(v) for k, v in x.items() if not TIMING_KEY.search(str(k))}
    if isinstance(x, list):
        return [_drop_timing(v) for v in x]
    if isinstance(x, str):
        return _mask(x)
    return x


def _mask(text: str) -> str:
    for pattern, sub in TIMING_TEXT:
        text = pattern.sub(sub, text)
    return text


def _text(path: Path, tree: Path) -> str:
    text = path.read_text().replace(str(tree.resolve()), "<SRC>").replace(str(tree), "<SRC>")
    return _without_cost(text) if path.suffix == ".md" else text


def _without_cost(text: str) -> str:
    """A report.md without its ``## Cost`` section (tokens/s and memory of this run: report.json's volatile
    ``cost``)."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            skipping = line.startswith("## Cost")
        if not skipping:
            out.append(line)
    return "".join(out)


def _json_lines(text: str):
    return [_drop_timing(json.loads(line)) for line in text.splitlines() if line.strip()]


def _torch_equal(a: Path, b: Path) -> str | None:
    import torch

    def load(p):
        try:
            return torch.load(p, map_location="cpu", weights_only=False)
        except Exception as e:  # not a torch file: the bytes differ, say so
            raise ValueError(f"{p.name}: bytes differ and it does not load with torch.load ({e})") from e

    def same(x, y, where):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            ok = isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
            return None if ok and torch.equal(x, y) else f"tensor {where} differs"
        if isinstance(x, dict) and isinstance(y, dict):
            if set(x) != set(y):
                return f"keys of {where} differ: {sorted(map(str, set(x) ^ set(y)))}"
            return next((d for k in x if (d := same(x[k], y[k], f"{where}.{k}"))), None)
        if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            if len(x) != len(y):
                return f"length of {where} differs"
            return next((d for i, (p, q) in enumerate(zip(x, y)) if (d := same(p, q, f"{where}[{i}]"))), None)
        return None if x == y or TIMING_KEY.search(where.rsplit(".", 1)[-1]) else f"{where}: {x!r} != {y!r}"

    try:
        return same(load(a), load(b), a.name)
    except ValueError as e:
        return str(e)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def compare_file(a: Path, b: Path, old: Path, new: Path) -> str | None:
    """None when the two files are the same output, else what differs."""
    if _sha(a) == _sha(b):
        return None
    suffix = a.suffix
    if suffix == ".safetensors":
        return f"sha256 differs ({_sha(a)[:12]} vs {_sha(b)[:12]})"
    if suffix in (".json", ".jsonl"):
        x, y = _text(a, old), _text(b, new)
        x, y = (
            (_json_lines(x), _json_lines(y))
            if suffix == ".jsonl"
            else (_drop_timing(json.loads(x)), _drop_timing(json.loads(y)))
        )
        if x == y:
            return None
        return f"content differs:\n    old {json.dumps(x)[:600]}\n    new {json.dumps(y)[:600]}"
    if suffix in (".md", ".txt", ".yaml", ".yml", ".j2", ".py", ".cfg", ".csv", ".log") or a.name == "SHA256SUMS":
        x, y = _mask(_text(a, old)).splitlines(), _mask(_text(b, new)).splitlines()
        if x == y:
            return None
        diff = [(i, p, q) for i, (p, q) in enumerate(zip(x, y)) if p != q][:3]
        more = "" if len(x) == len(y) else f" ({len(x)} vs {len(y)} lines)"
        return f"text differs{more}: " + "; ".join(f"line {i + 1}: {p!r} != {q!r}" for i, p, q in diff)
    return _torch_equal(a, b)


def compare(old_dir: Path, new_dir: Path, old: Path, new: Path) -> list[str]:
    files = lambda d: {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}  # noqa: E731
    fa, fb = files(old_dir), files(new_dir)
    out = [f"only under old: {p}" for p in sorted(fa - fb)] + [f"only under new: {p}" for p in sorted(fb - fa)]
    for rel in sorted(fa & fb):
        d = compare_file(old_dir / rel, new_dir / rel, old, new)
        if d:
            out.append(f"{rel}: {d}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, type=Path, help="the source tree before (a checkout; its src/ is used)")
    ap.add_argument("--new", required=True, type=Path, help="the source tree after")
    ap.add_argument("--work", type=Path, default=Path("/tmp/retrofit-same-outputs"), help="scratch folder")
    ap.add_argument("--only", action="append", choices=sorted(CASES), help="run these cases only (repeatable)")
    ap.add_argument("--compare-only", action="store_true", help="compare the folders of an earlier run, run nothing")
    a = ap.parse_args(argv)
    old, new, work = a.old.resolve(), a.new.resolve(), a.work.resolve()
    for tree in (old, new):
        if not (tree / "src" / "retrofit").is_dir():
            ap.error(f"{tree} is not a retrofit checkout (no src/retrofit)")
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "standins").exists():
        shutil.copytree(new / "standins", work / "standins")
    names = a.only or list(CASES)
    for name in names:
        if (
            isinstance(CASES[name], tuple)
            and CASES[name][1] not in names
            and not (work / "new" / CASES[name][1]).is_dir()
        ):
            names.insert(names.index(name), CASES[name][1])  # an eval needs the run it evaluates
    bad = 0
    for name in names:
        print(f"{name}:", flush=True)
        if not a.compare_only:
            run_case(name, old, "old", work)
            run_case(name, new, "new", work)
        diffs = compare(work / "old" / name, work / "new" / name, old, new)
        nfiles = sum(1 for p in (work / "new" / name).rglob("*") if p.is_file())
        print(f"  {'SAME' if not diffs else 'DIFFERENT'} ({nfiles} files)")
        for d in diffs:
            print(f"    {d}")
        bad += bool(diffs)
    print(f"{len(names) - bad} of {len(names)} cases the same" + (f"; {bad} differ" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
