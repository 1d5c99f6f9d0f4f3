"""The retrofit study: what each scheme and recipe buys on a real baseline, against the original.

    python scripts/study.py                      # both parts, the default grid
    python scripts/study.py --part gpt2 --schemes alibi,rope --methods lora --budgets 0,0.02
    python scripts/study.py --part smollm2 --smollm2-lengths 1024,2048,4096,8192

Part 1 (GPT-2 stand-in, ``retrofit.training.standin.pretrain("study")``): every scheme x method x fine-tune
budget (a fraction of the stand-in's pretraining tokens), evaluated on the held-out plays at
1x..32x the native length (non-overlapping windows), beside

- the original model: plain at 1x, sliding window (stride native/2) beyond, on the same tokens;
- the continued-training control: the *unconverted* original trained on the same data for the
  same steps with the same optimiser (so "beats the original" is not just "trained more").

Part 2 (SmolLM2-135M GGUF, RoPE, 8k native): its own ppl vs length; alibi + LoRA at 1k; rescaled
RoPE (yarn, ntk; factor 4) with no fine-tune; passkey accuracy by length.

Part 1 runs on any stand-in preset: ``--preset study2-llama`` is the RoPE one (LLaMA architecture, same
size and data as ``study2-gpt2``). A ``--schemes`` entry may carry the scheme's options
(``pi8=rope:scaling=linear;factor=8``), and an original that can read past its native length as is
(RoPE) gets those rows too (``original (read past native as is)``), beside the cropped sliding window.

Every cell is cached under ``--runs`` (``cell.json``), so an interrupted study resumes where it
stopped. Writes ``benchmarks/study.json``, ``benchmarks/study.md`` and ``benchmarks/study_*.png``.

Across machines: the stand-in comes from the repo's ``standins/`` when it is shipped there (the same
weights, checked by SHA-256, instead of pretraining anew), and the cells already in the ``--out`` report
go back into an empty ``--runs`` cache when that report was measured on the same stand-in (the SHA-256
of its weights) with the same settings; so a study can grow over several sessions on fresh machines.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import shlex
import shutil
import sys
import time
from pathlib import Path

from retrofit import run_folder as rf
from retrofit.atomic import write_text
from retrofit.errors import RecipeError
from retrofit.schema import parse_overrides
from retrofit.study import tables as T
from retrofit.study.tables import (EVALUATED, cheapest_budgets, cheapest_markdown, passkey_markdown, pooled_passkey,
                                   ppl_at, rows_of, seed_table, seeds_markdown)
from retrofit.study.tables import fmt, ratio
from retrofit.study.tables import cell_table as table_gpt2

log = logging.getLogger("study")
SCHEMES = ["alibi", "rope", "t5", "shaw", "nope", "fire", "sinusoidal"]
PASSKEY_DEPTHS = [0.0, 0.5, 1.0]
SMOLLM2_RUNS = ["original", "rope-yarnx4", "rope-ntkx4", "alibi", "alibi-lora", "rope-reduced-lora", "rope-yarnx4-lora",
                "nope", "nope-temperature", "rope-temperature", "rope-yarnx4-temperature", "control-lora",
                "control-yarnx4-lora"]
SMOLLM2_BETA = 0.1  # the length-aware temperature of the zero-shot runs (benchmarks/measure_temperature.json)
# what a cached cell must share with the planned one to be reused (a label may be given new options)
PLAN_KEYS = ("scheme", "options", "method", "steps", "objective", "fade", "random_offset", "pose", "seed", "block",
             "calibrate")
# --schemes entries: a scheme name, or [LABEL=]SCHEME:KEY=VALUE;KEY=VALUE (the scheme's options), e.g.
# "rope:scaling=yarn;factor=8" (cells named rope-yarn-8-...) or "pi8=rope:scaling=linear;factor=8".
# TRAIN_KEYS among them are the fine-tune's, not the scheme's: pose=TARGET trains with PoSE positions
# spanning TARGET tokens (train.positions.method: pose); block=N trains on blocks of N tokens (the same tokens
# per step: the batch shrinks by N / native); calibrate=STEPS first fits the scheme's own position parameters
# to the original (KL at the native length, everything else frozen), also at budget 0.
TRAIN_KEYS = ("pose", "block", "calibrate", "objective")  # objective=both: LM + KL to the original (sliding teacher)
OBJECTIVES = ("lm", "both", "distill")
STANDINS = Path(__file__).resolve().parents[1] / "standins"  # shipped stand-ins (scripts/pretrain_baseline.py --ship)


def parse_scheme(spec: str) -> dict:
    """One --schemes entry -> {"label", "scheme", "options"}; values read as YAML (``retrofit run --set``'s)."""
    head, _, opts = spec.partition(":")
    label, _, scheme = head.rpartition("=")  # LABEL=SCHEME, with or without options
    try:
        options = parse_overrides([x for x in opts.split(";") if x])
    except RecipeError as e:
        raise SystemExit(f"--schemes {spec!r}: an option is KEY=VALUE ({e})") from None
    train = {k: options.pop(k) for k in TRAIN_KEYS if k in options}
    if not label:
        label = "-".join([scheme, *(str(v) for v in options.values()), *(f"{k}{v}" for k, v in train.items())])
    if not scheme or any(c in label for c in "/ "):
        raise SystemExit(f"--schemes {spec!r}: expected SCHEME or [LABEL=]SCHEME:KEY=VALUE;...")
    if train.get("objective", "lm") not in OBJECTIVES:
        raise SystemExit(f"--schemes {spec!r}: objective= takes one of {', '.join(OBJECTIVES)}")
    for key in (k for k in train if k != "objective"):
        if not isinstance(train[key], int) or train[key] <= 0:
            raise SystemExit(f"--schemes {spec!r}: {key}= takes a positive int (pose=TARGET tokens, block=N tokens, "
                             f"calibrate=STEPS), got {train[key]!r}")
    return {"label": label, "scheme": scheme, "options": options, **train}


# ----------------------------------------------------------------------------------------------
# part 1: the GPT-2 stand-in
# ----------------------------------------------------------------------------------------------
def stand_in(args) -> tuple[Path, dict, int]:
    from retrofit import baseline
    from retrofit.training import standin

    path = standin.pretrain(args.preset, shipped=args.stand_ins or None)
    stats = baseline.load_stats(path)
    native = rf.native_length(path)
    return path, stats, native


def steps_for(fraction: float, pretrain_tokens: int, tokens_per_step: int) -> int:
    return max(1, math.ceil(fraction * pretrain_tokens / tokens_per_step)) if fraction > 0 else 0


def recipe_for(cell: dict, base: Path, native: int, args, out: Path) -> dict:
    block = cell.get("block") or native
    if block % native or args.batch_size * native % block:
        raise SystemExit(f"{cell['name']}: block={block} must be a multiple of the native {native} that divides "
                         f"the tokens of a step ({args.batch_size} x {native})")
    train = {
        "method": cell["method"], "steps": cell["steps"], "batch_size": args.batch_size * native // block,
        "learning_rate": args.lr_full if cell["method"] == "full" else args.lr_lora,
        "warmup_steps": max(1, cell["steps"] // 10), "lr_scheduler": "cosine", "seed": args.seed if cell.get("seed") is None else cell["seed"],
        "objective": cell.get("objective", "lm"), "train_norms": cell["method"] == "lora",
        "train_embeddings": cell["method"] == "lora" and args.lora_embeddings,
        "lora": {"r": 16, "alpha": 32, "dropout": 0.0},
        "positions": {"random_offset": cell.get("random_offset", 0), "native_fade_steps": cell.get("fade", 0)},
    }
    if cell.get("pose"):
        train["positions"].update(method="pose", target_length=cell["pose"])
    if train["objective"] != "lm":
        train["distill_weight"] = 1.0
    convert = {"scheme": cell["scheme"], **({"options": cell["options"]} if cell.get("options") else {})}
    if cell.get("calibrate"):
        convert["calibrate"] = {"data": "shakespeare:train", "steps": cell["calibrate"]}
    return {
        "model": {"name_or_path": str(base)},
        "convert": convert,
        "data": {"dataset": "shakespeare:train", "block_length": block, "validation_fraction": 0.03,
                 "max_validation_blocks": max(1, 16 * native // block)},  # the same validation tokens
        "train": train,
        "checkpoint": {"every": 0},
        "output_dir": str(out),
    }


def evaluate_model(model_or_path, lengths, args, baselines=(), sliding=False, tokenizer=None):
    import retrofit

    return retrofit.evaluate(model_or_path, lengths=lengths, data="shakespeare:heldout", baselines=list(baselines),
                             tokenizer=tokenizer, budget=args.eval_budget, sliding=sliding,
                             stride=args.stride, seed=args.seed, progress=False)


def run_cell(cell: dict, base: Path, native: int, lengths: list[int], args) -> dict:
    """Fine-tune (unless budget 0) and evaluate one cell; cached in <runs>/<name>/cell.json."""
    import retrofit

    cdir = Path(args.runs) / cell["name"]
    cached = cdir / "cell.json"
    if not _recompute(cell["name"], args):
        old = _cached_cell(cell, args)
        if old is not None:
            return old
    if args.cached_only or not args.new_cells:
        raise LookupError("not run yet (--cached-only)" if args.cached_only else "not run yet (--no-new-cells)")
    t0 = time.time()
    if cell["scheme"] is None:  # the control keeps its learned table: it is scored at the native length
        lengths = [native]
    if cell["steps"] == 0:  # conversion alone (and its calibration), no fine-tune
        model, tok = converted_stand_in(base, cell, args)
        report = evaluate_model(model, lengths, args, tokenizer=tok)
        trainable = 0
    else:
        shutil.rmtree(cdir / "ft", ignore_errors=True)  # cell.json stays until the new one replaces it
        out = retrofit.finetune(recipe_for(cell, base, native, args, cdir / "ft"))
        trainable = rf.versions(out)["trainable_parameters"]
        report = evaluate_model(str(Path(out) / rf.FINAL), lengths, args)
        shutil.rmtree(Path(out) / "checkpoints", ignore_errors=True)
    result = {**cell, "rows": rows_of(report), "seconds": round(time.time() - t0, 1), "trainable_parameters": trainable}
    cdir.mkdir(parents=True, exist_ok=True)
    write_text(cached, json.dumps(result, indent=1))
    return result


def converted_stand_in(base: Path, cell: dict, args):
    """(model, tokenizer): the stand-in converted as the cell says, its position parameters calibrated first
    when the cell has calibrate=STEPS (KL to the original at the native length, retrofit.calibrate)."""
    import copy

    import retrofit

    model, tok = retrofit.load_model(str(base))
    if not cell["scheme"]:
        return model, tok
    original = copy.deepcopy(model) if cell.get("calibrate") else None
    retrofit.convert(model, cell["scheme"], **cell.get("options", {}))
    if original is not None:
        retrofit.calibrate(model, original, "shakespeare:train", tokenizer=tok, steps=cell["calibrate"],
                           seed=args.seed, progress=False)
    return model, tok


def _recompute(name: str, args) -> bool:
    """Whether a cached cell (or its passkey) is run again: --force, or named in --rerun."""
    return args.force or name in args.rerun


def _cached_cell(cell: dict, args, warn: bool = True) -> dict | None:
    """The cell's cached figures when the cache has them for its plan, else None."""
    path = Path(args.runs) / cell["name"] / "cell.json"
    if not path.exists():
        return None
    old = json.loads(path.read_text())
    if plan_of(old) == plan_of(cell):
        return {**old, **{k: v for k, v in cell.items() if k not in old}}  # e.g. a label added since
    if warn:
        log.warning("cell %s: the cached run had other settings (%s); running it again", cell["name"], plan_of(old))
    return None


def _cached_or_pending(cell: dict, args) -> dict:
    """A cell the loop has not reached, for the report written midway: its cached figures (a --rerun cell
    keeps its old ones until replaced), else "pending"."""
    return _cached_cell(cell, args, warn=False) or {**cell, "error": "LookupError: not run yet (pending)"}


def grid(args, pretrain_tokens: int, native: int) -> list[dict]:
    tps = args.batch_size * native
    specs = [parse_scheme(x) for x in args.schemes]
    short = [x["label"] for x in specs if x.get("pose") and x["pose"] <= native]
    if short:
        raise SystemExit(f"--schemes {short}: pose=TARGET must exceed the native length {native}")
    cells = []
    for frac in args.budgets:
        steps = steps_for(frac, pretrain_tokens, tps)
        common = {"budget": frac, "steps": steps, "extra_tokens": steps * tps}
        for method in (args.methods if frac > 0 else ["none"]):
            seeded = frac in args.seed_budgets and frac > 0 and (not args.seed_methods or method in args.seed_methods)
            for seed in [None, *(args.seeds if seeded else [])]:
                tail = f"-seed{seed}" if seed is not None else ""
                extra = {"seed": seed} if seed is not None else {}
                cells.append({"name": f"control-{method}-{frac}{tail}", "label": "control", "scheme": None,
                              "method": method, **common, "role": "control", **extra})
                for spec in specs:
                    trains = spec.get("pose") or spec.get("block") or spec.get("objective", "lm") != "lm"
                    if frac > 0 and spec["label"] in args.zero_shot_only or frac == 0 and trains:
                        continue  # zero-shot-only labels train no cell; PoSE, long blocks, a teacher: no budget-0 cell
                    if seed is not None and spec["label"] not in args.seed_labels:
                        continue
                    cells.append({"name": f"{spec['label']}-{method}-{frac}{tail}", "label": spec["label"],
                                  "scheme": spec["scheme"],
                                  "options": spec["options"], "method": method, **common, "role": "converted",
                                  **{k: spec[k] for k in TRAIN_KEYS if spec.get(k)}, **extra})
    top = max(args.budgets)
    if top > 0 and args.variants:
        steps = steps_for(top, pretrain_tokens, tps)
        for scheme in [s for s in ("alibi", "rope") if s in args.schemes]:  # the plain schemes only
            common = {"scheme": scheme, "method": args.methods[0], "budget": top, "steps": steps,
                      "extra_tokens": steps * tps, "role": "converted"}
            cells.append({**common, "name": f"{scheme}-{common['method']}-{top}-distill", "objective": "both"})
            cells.append({**common, "name": f"{scheme}-{common['method']}-{top}-fade", "fade": max(1, steps // 2)})
            if scheme == "rope":
                cells.append({**common, "name": f"rope-{common['method']}-{top}-offset", "random_offset": 8 * native})
    return [c for c in cells if not (c["scheme"] is None and c["budget"] == 0)]


def part_gpt2(args, previous: dict | None = None, checkpoint=None) -> dict:
    """The grid on the stand-in. ``previous``: the report at --out (its cells come back, see restore_cells);
    ``checkpoint(report)`` is called with the report so far after every cell, so a run stopped midway
    leaves every finished cell in the report."""
    from retrofit.baseline import weights_sha256

    base, stats, native = stand_in(args)
    pretrain_tokens = stats["pretrain_tokens"]
    lengths = [native * k for k in args.multiples]
    sha = weights_sha256(base)
    log.info("stand-in %s: native %d, pretrained on %d tokens, weights sha256 %s", base, native, pretrain_tokens, sha[:12])
    kept = restore_cells(previous, base, sha, args) if previous and not args.force else []
    original = run_original(base, native, lengths, args)
    cells = grid(args, pretrain_tokens, native)
    planned = {c["name"] for c in cells}
    if set(args.rerun) - planned:
        raise SystemExit(f"--rerun {sorted(set(args.rerun) - planned)}: not cells of this grid; its cells: "
                         f"{', '.join(c['name'] for c in cells)}")
    kept = [c for c in kept if c["name"] not in planned]  # measured earlier, outside this grid: kept in the report
    if kept:
        log.info("keeping %d cells of the report that are not in this grid: %s", len(kept), [c["name"] for c in kept])
    stand = {"path": str(base), "native_length": native, "pretrain_tokens": pretrain_tokens,
             "weights_sha256": sha, "pretrain_stats": stats, "settings": settings_of(args)}

    def report(results: list[dict], passkey: dict) -> dict:
        table = table_gpt2(original, results, lengths, native)
        return {"stand_in": stand, "lengths": lengths, "original": original, "cells": results, "table": table,
                "seeds": seed_table(table, lengths, native, args.seed), "cheapest": cheapest_budgets(table, native),
                "passkey": passkey, "seconds": {
                    "original": json.loads((Path(args.runs) / "original" / "cell.json").read_text()).get("seconds"),
                    "cells": round(sum(c.get("seconds") or 0 for c in results), 1),
                    "passkey": round(sum(v.get("seconds") or 0 for v in passkey.values()), 1)}}

    results = []
    for i, cell in enumerate(cells, 1):
        log.info("[%d/%d] %s (%d steps)", i, len(cells), cell["name"], cell["steps"])
        try:
            results.append(run_cell(cell, base, native, lengths, args))
        except LookupError as e:  # not cached, and this run makes no new cells: said in the report, no traceback
            log.info("cell %s: %s", cell["name"], e)
            results.append({**cell, "error": f"{type(e).__name__}: {e}"})
        except Exception as e:  # record and go on: one broken cell must not hide the others
            log.exception("cell %s failed", cell["name"])
            results.append({**cell, "error": f"{type(e).__name__}: {e}"})
        if checkpoint is not None and args.new_cells and not args.cached_only:
            pending = [_cached_or_pending(c, args) for c in cells[i:]]
            checkpoint(report(results + pending + kept, (previous or {}).get("passkey") or {}))
    results += kept
    return report(results, passkey_part(base, native, lengths, results, args))


# ----------------------------------------------------------------------------------------------
# a study grown over several sessions: the cells of the committed report back into the --runs cache
# ----------------------------------------------------------------------------------------------
SETTINGS = ("preset", "batch_size", "lr_full", "lr_lora", "lora_embeddings", "eval_budget", "stride", "seed",
            "multiples")  # what decides every cell's figures besides the cell's own plan (plan_of)


def settings_of(args) -> dict:
    return {k: getattr(args, k) for k in SETTINGS}


def legacy_settings(previous: dict) -> dict | None:
    """The settings of a report written before they were recorded: read off its command, if that was a part-1 run."""
    try:
        old = parse_args(shlex.split(previous.get("command") or "")[2:])
    except SystemExit:  # a flag that no longer exists
        return None
    if old.part not in ("gpt2", "all"):
        return None
    return {**settings_of(old), "stride": old.stride or (previous.get("stand_in") or {}).get("native_length", 0) // 2}


def restore_cells(previous: dict, base: Path, sha: str, args) -> list[dict]:
    """The finished cells of the report at --out (e.g. committed by another session, on another machine) go
    back into the --runs cache where missing, with the original's rows and the passkey results, when that
    report was measured on this stand-in (the SHA-256 of its weights) with these settings (SETTINGS).
    Returns those cells. A report from before hashes were recorded counts as this stand-in's if its cache
    key and pretraining losses are this one's to the last digit (the same pretraining run), with the
    settings of its command. Anything else is an error, since running on would lose the report's cells:
    another --out, or --force."""
    from retrofit.baseline import load_stats

    recorded, mine = previous.get("stand_in") or {}, settings_of(args)
    if recorded.get("weights_sha256"):
        same = recorded["weights_sha256"] == sha
        theirs = recorded.get("settings") or {}
        stand = f"weights sha256 {recorded['weights_sha256'][:12]}, this one {sha[:12]}"
    else:  # a report from before the hash was recorded: the same pretraining run has the same losses
        old_stats, stats = recorded.get("pretrain_stats") or {}, load_stats(base)
        same = all(stats.get(k) is not None and old_stats.get(k) == stats.get(k)
                   for k in ("cache_key", "heldout_loss", "final_train_loss"))
        theirs = legacy_settings(previous) or {}
        stand = "no hash recorded, and other pretraining losses"
    why = (f"another stand-in ({stand})" if not same else
           f"other settings ({', '.join(k for k in SETTINGS if theirs.get(k) != mine[k])})" if theirs != mine else "")
    if why:
        raise SystemExit(f"the report at --out ({args.out}) was measured on {why}: running on would replace its "
                         f"cells. Give another --out, or --force to replace it.")
    runs, written = Path(args.runs), 0

    def put(path: Path, data: dict) -> None:
        nonlocal written
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, json.dumps(data, indent=1))
            written += 1

    if previous.get("original"):
        put(runs / "original" / "cell.json", {"rows": previous["original"],
                                              "seconds": (previous.get("seconds") or {}).get("original")})
    cells = [c for c in previous.get("cells", []) if "rows" in c and "error" not in c]
    for cell in cells:
        put(runs / cell["name"] / "cell.json", cell)
    for name, res in (previous.get("passkey") or {}).items():
        if "plan" in res and "error" not in res:
            put(runs / name / "passkey.json", res)
    log.info("restored %d results from the report at --out (same stand-in, same settings) into %s", written, runs)
    return cells


# ----------------------------------------------------------------------------------------------
# passkey retrieval on the stand-in, per length and depth, with the Wilson interval of each accuracy
# ----------------------------------------------------------------------------------------------
def passkey_budgets(args, budgets: list[float]) -> list[float]:
    """Budgets whose cells get the passkey test: 'top' (the largest), 'all', 'none' or a comma list."""
    spec = args.stand_in_passkey_budgets
    if spec == "none" or not args.stand_in_passkey_trials:
        return []
    if spec == "all":
        return sorted(set(budgets))
    if spec == "top":
        return [max(budgets)] if budgets else []
    return [float(x) for x in spec.split(",") if x]


def passkey_part(base: Path, native: int, lengths: list[int], results: list[dict], args) -> dict:
    """Passkey for the original (at every length it can read) and for the cells at the passkey budgets, the
    base seed's only (the extra seeds measure the spread of perplexity); each cached in
    <runs>/<cell>/passkey.json. {name: {"rows": [...], "by_length": {...}, "seconds"}}."""
    import retrofit

    wanted = passkey_budgets(args, [c["budget"] for c in results])
    if not wanted:
        return {}
    out = {}
    try:
        out["original"] = _passkey_cached("original", lambda: retrofit.load_model(str(base)), lengths, args)
    except Exception as e:  # recorded, not cached, like a cell's
        log.exception("passkey of the original failed")
        out["original"] = {"error": f"{type(e).__name__}: {e}"}
    for c in results:
        if "rows" not in c or c["budget"] not in wanted or c.get("seed") is not None:
            continue

        def load(c=c):
            if c["steps"] == 0:
                return converted_stand_in(base, c, args)
            final = Path(args.runs) / c["name"] / "ft" / rf.FINAL
            if not final.is_dir():
                raise LookupError(f"the fine-tuned weights of {c['name']} are not on this machine (its figures came "
                                  f"back from the report at --out); --rerun {c['name']} trains it again")
            return retrofit.load_model(str(final))

        cell_lengths = [native] if c["scheme"] is None else lengths  # the control keeps its learned table
        try:
            out[c["name"]] = _passkey_cached(c["name"], load, cell_lengths, args, plan_of(c))
        except Exception as e:  # recorded, not cached: one broken cell must not hide the others
            log.exception("passkey %s failed", c["name"])
            out[c["name"]] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _passkey_cached(name: str, load, lengths: list[int], args, cell_plan: dict | None = None) -> dict:
    path = Path(args.runs) / name / "passkey.json"
    plan = {"lengths": lengths, "trials": args.stand_in_passkey_trials, "depths": PASSKEY_DEPTHS, "seed": args.seed,
            **({"cell": cell_plan} if cell_plan else {})}  # a cell given new settings is tested again
    if path.exists() and not _recompute(name, args):
        old = json.loads(path.read_text())
        if old.get("plan") == plan:
            return old
    if args.cached_only:
        return {"error": "LookupError: not run yet (--cached-only)"}
    log.info("passkey: %s at %s, %d trials per length and depth", name, lengths, args.stand_in_passkey_trials)
    t0 = time.time()
    model, tok = load()
    rows = [row for L in lengths for row in _passkey_rows(model, tok, L, args)]
    res = {"plan": plan, "rows": rows, "by_length": pooled_passkey(rows), "seconds": round(time.time() - t0, 1)}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(res, indent=1))
    return res


def _passkey_rows(model, tok, length: int, args) -> list[dict]:
    """Passkey at one length and every depth; where the model cannot take the length (a learned table past
    its rows) or the prompt does not fit in it, one row saying why (accuracy None)."""
    import retrofit
    from retrofit.errors import LengthError

    try:
        rep = retrofit.evaluate(model, lengths=[length], data="shakespeare:heldout", tokenizer=tok, budget=length,
                                sliding=False, seed=args.seed, passkey=True, passkey_lengths=[length],
                                passkey_depths=PASSKEY_DEPTHS, passkey_trials=args.stand_in_passkey_trials,
                                progress=False)
    except LengthError as e:
        return [{"length": length, "depth": None, "correct": 0, "trials": 0, "accuracy": None, "note": str(e)}]
    keep = ("length", "depth", "correct", "trials", "accuracy", "ci_low", "ci_high", "note")
    return [{k: r.get(k) for k in keep} for r in rep.data["passkey"] if r["role"] in EVALUATED]


def run_original(base: Path, native: int, lengths: list[int], args) -> list[dict]:
    """The unconverted original: plain at 1x; past 1x it cannot run plainly, so its figure there is the
    sliding window (window = native, stride native/2). Every length scores the same target tokens, so
    that sliding figure is computed once and reported at every length (labelled ``sliding``)."""
    import retrofit

    cached = Path(args.runs) / "original" / "cell.json"
    if cached.exists() and not args.force:
        return json.loads(cached.read_text())["rows"]
    t0 = time.time()
    report = retrofit.evaluate(str(base), lengths=[native], data="shakespeare:heldout", budget=args.eval_budget,
                               sliding=True, stride=args.stride, seed=args.seed, progress=False)
    rows = rows_of(report)
    sliding = next(r for r in rows if r["method"] == "sliding")
    rows = [{**r, "role": "baseline"} for r in rows]
    rows += [{**sliding, "role": "baseline", "length": L, "note": f"sliding window {native}, same targets"}
             for L in lengths if L > native]
    rows += read_as_is(base, [L for L in lengths if L > native], args)
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_text(cached, json.dumps({"rows": rows, "seconds": round(time.time() - t0, 1)}, indent=1))
    return rows


def plan_of(cell: dict) -> dict:
    """The settings that decide a cell's figures (absent, empty and zero alike: cells cached before a key existed)."""
    return {k: cell.get(k) if k == "seed" else cell.get(k) or None for k in PLAN_KEYS}  # seed 0 is a seed


def read_as_is(base: Path, longer: list[int], args) -> list[dict]:
    """The original read past its native length unchanged (role ``baseline-as-is``), where its positional
    mechanism allows it (RoPE); a learned table refuses (LengthError), and then there are no such rows."""
    import retrofit
    from retrofit.errors import LengthError

    if not longer:
        return []
    try:
        report = retrofit.evaluate(str(base), lengths=longer, data="shakespeare:heldout", budget=args.eval_budget,
                                   sliding=False, seed=args.seed, progress=False)
    except LengthError as e:
        log.info("the original cannot read past its native length, so it has no as-is rows: %s", e)
        return []
    log.info("the original reads past its native length as is: rows at %s", longer)
    return [{**r, "role": "baseline-as-is", "note": "past the native length, unchanged"} for r in rows_of(report)]


# ----------------------------------------------------------------------------------------------
# part 2: SmolLM2
# ----------------------------------------------------------------------------------------------
def part_smollm2(args, previous: dict | None = None) -> dict:
    """The SmolLM2 runs of ``--smollm2-runs``, each cached under <runs>/smollm2/. ``previous``: the report's
    SmolLM2 part at --out; its finished runs go back into an empty cache (see restore_smollm2_runs)."""
    import retrofit
    from retrofit import assets

    gguf = Path(assets.smollm2_gguf())
    lengths = args.smollm2_lengths
    out = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to fp32)", "lengths": lengths, "runs": {}}

    def cached(name, fn):
        path = Path(args.runs) / "smollm2" / f"{name}.json"
        if path.exists() and not args.force:
            return json.loads(path.read_text())
        if args.cached_only:
            return {"error": "LookupError: not run yet (--cached-only)"}
        t0 = time.time()
        try:
            res = fn()
        except Exception as e:
            log.exception("smollm2 %s failed", name)
            res = {"error": f"{type(e).__name__}: {e}"}
        res["seconds"] = round(time.time() - t0, 1)
        if "error" not in res:  # a failure is reported, never cached
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, json.dumps(res, indent=1))
        return res

    def more_passkey(name, res, model):
        """A cached run with rows at a --passkey-lengths length it has no passkey for gets that passkey
        (the model rebuilt; its perplexity is not measured again), added to its cache with its seconds."""
        res = {k: v for k, v in res.items() if k != "passkey_error"}  # an earlier failure is not kept
        have = {int(x) for x in res.get("passkey") or {}}
        todo = [L for L in args.passkey_lengths if L not in have and any(r["length"] == L for r in res.get("rows", []))]
        if not todo or not args.passkey or args.cached_only or "error" in res:
            return res
        log.info("smollm2 %s: passkey at %s (the cached run has none there)", name, todo)
        t0 = time.time()
        try:
            m, tok = model()
            small = [min(lengths)]  # the perplexity evaluate() always measures: one short window, not kept
            extra = evaluate(m, tok, small, passkey_lengths=todo)["passkey"]
        except Exception as e:  # reported, not cached: the run's cached figures stay as they were
            log.exception("smollm2 %s: passkey at %s failed", name, todo)
            return {**res, "passkey_error": f"{type(e).__name__}: {e}"}
        res = {**res, "passkey": dict(sorted({**res.get("passkey", {}), **extra}.items(), key=lambda kv: int(kv[0]))),
               "passkey_seconds": {**res.get("passkey_seconds", {}), ",".join(map(str, todo)): round(time.time() - t0, 1)}}
        write_text(Path(args.runs) / "smollm2" / f"{name}.json", json.dumps(res, indent=1))
        return res

    def load():
        return retrofit.load_model(str(gguf.parent), gguf_file=gguf.name)

    def evaluate(model, tok, lens, passkey_lengths=None):
        rep = retrofit.evaluate(model, lengths=lens, data="shakespeare:heldout", tokenizer=tok,
                                budget=max(args.smollm2_budget, max(lens)), sliding=False, seed=args.seed,
                                passkey=args.passkey, passkey_trials=args.passkey_trials,
                                passkey_lengths=passkey_lengths or [x for x in args.passkey_lengths if x in lens] or lens[:1],
                                passkey_depths=PASSKEY_DEPTHS, progress=False)
        return {"rows": rows_of(rep), "passkey": _passkey_summary(rep)}

    def converted(scheme=None, **options):
        """The GGUF model, converted to ``scheme`` (None: as it is)."""
        def model():
            m, tok = load()
            if scheme:
                retrofit.convert(m, scheme, **options)
            return m, tok
        return model

    def tuned(name):
        """A LoRA run's fine-tuned model, from its folder (re-patched, or plain for a control)."""
        def model():
            final = Path(args.runs) / "smollm2" / f"{name}-ft" / rf.FINAL
            if not final.is_dir():
                raise LookupError(f"the fine-tuned weights of {name} are not on this machine; "
                                  f"--force with --smollm2-runs naming only this run trains it again")
            m, _ = retrofit.load_model(str(final), tokenizer=False)
            _, tok = load()
            return m, tok
        return model

    def lora_run(name, convert, eval_lengths, steps):
        """Convert, LoRA fine-tune at 1k tokens (norms trainable), evaluate at ``eval_lengths``."""
        def fn():
            recipe = {
                "model": {"name_or_path": str(gguf.parent), "gguf_file": gguf.name},
                **({"convert": convert} if convert else {}),
                "data": {"dataset": "shakespeare:train", "block_length": args.smollm2_train_length,
                         "validation_fraction": 0.03, "max_validation_blocks": 4},
                "train": {"method": "lora", "steps": steps, "batch_size": 1,
                          "learning_rate": args.smollm2_lr, "warmup_steps": max(1, steps // 10),
                          "train_norms": True, "lora": {"r": 16, "alpha": 32, "dropout": 0.0}, "seed": args.seed,
                          "gradient_checkpointing": True},
                "checkpoint": {"every": 0},
                "output_dir": str(Path(args.runs) / "smollm2" / f"{name}-ft"),
            }
            final = Path(retrofit.finetune(recipe)) / rf.FINAL
            summary = rf.summary(final.parent)
            return {"steps": steps, "train_length": args.smollm2_train_length,
                    "train_seconds": summary["train_seconds"], **evaluate(*model(), eval_lengths)}
        model = tuned(name)
        return name, name, fn, model

    long_lengths = args.smollm2_long_lengths or lengths
    reduced = {"scheme": "rope", "options": {"scaling": "yarn", "factor": max(lengths) / args.smollm2_train_length,
                                             "native_length": args.smollm2_train_length}}
    steps, ysteps = args.smollm2_steps, args.smollm2_yarn_lora_steps
    reduced_name = f"rope-yarn-native{args.smollm2_train_length}-lora-{steps}"
    yarn4 = {"scheme": "rope", "options": {"scaling": "yarn", "factor": 4.0}}
    beta = {"temperature": SMOLLM2_BETA}

    def zs(label, name, model, lens):  # a zero-shot run: (label, cache name, run, model)
        return label, name, (lambda: evaluate(*model(), lens)), model

    plan = {  # --smollm2-runs key: (label in the report, cache file under <runs>/smollm2/, run, its model)
        "original": zs("original", "original", converted(), lengths),
        "rope-yarnx4": zs("rope-yarnx4-no-finetune", "rope-yarnx4", converted("rope", scaling="yarn", factor=4.0),
                          long_lengths),
        "rope-ntkx4": zs("rope-ntkx4-no-finetune", "rope-ntkx4", converted("rope", scaling="ntk", factor=4.0),
                         long_lengths),
        "alibi": zs("alibi-no-finetune", "alibi-no-finetune", converted("alibi"), lengths),
        "alibi-lora": lora_run(f"alibi-lora-{steps}", {"scheme": "alibi"}, lengths, steps),
        "rope-reduced-lora": lora_run(reduced_name, reduced, lengths, steps),
        "rope-yarnx4-lora": lora_run(f"rope-yarnx4-lora-{ysteps}", yarn4, long_lengths, ysteps),
        # zero-shot past the native 8k: NoPE, and the length-aware temperature
        "nope": zs("nope-no-finetune", "nope", converted("nope"), long_lengths),
        "nope-temperature": zs(f"nope-temperature{SMOLLM2_BETA}-no-finetune", f"nope-temperature{SMOLLM2_BETA}",
                               converted("nope", **beta), long_lengths),
        "rope-temperature": zs(f"rope-temperature{SMOLLM2_BETA}-no-finetune", f"rope-temperature{SMOLLM2_BETA}",
                               converted("rope", **beta), long_lengths),
        "rope-yarnx4-temperature": zs(f"rope-yarnx4-temperature{SMOLLM2_BETA}-no-finetune",
                                      f"rope-yarnx4-temperature{SMOLLM2_BETA}",
                                      converted("rope", scaling="yarn", factor=4.0, **beta), long_lengths),
        # the continued-training controls: the same LoRA on the unconverted model, the same tokens
        "control-lora": lora_run(f"control-lora-{steps}", None, lengths, steps),
        "control-yarnx4-lora": lora_run(f"control-lora-{ysteps}-long", None, long_lengths, ysteps),
    }
    assert list(plan) == SMOLLM2_RUNS, "SMOLLM2_RUNS must list the plan"
    if previous and not args.force:
        restore_smollm2_runs(previous, {label: name for label, name, _, _ in plan.values()}, args)
    for key in args.smollm2_runs:
        label, name, fn, model = plan[key]
        out["runs"][label] = more_passkey(name, cached(name, fn), model)
    out["seconds"] = round(sum((res.get("seconds") or 0) + sum((res.get("passkey_seconds") or {}).values())
                               for res in out["runs"].values()), 1)  # as run, cached or not
    out["vs_control"] = smollm2_vs_control(out["runs"])
    out["longest_length_measured"] = max(
        r["length"] for res in out["runs"].values() for r in res.get("rows", [])) if out["runs"] else None
    return out


def restore_smollm2_runs(previous: dict, names: dict[str, str], args) -> None:
    """The finished SmolLM2 runs of the report at --out go back into the --runs cache where it has none, under
    the file name their label has in the plan (``names``: label -> cache name), as that report's machine had
    them: a session on a fresh machine then runs only the runs the report lacks. Each restored run keeps what
    it was measured with (its rows, steps, lengths and seconds); the cache is not checked against the
    current options either (--force runs everything again)."""
    written = []
    for label, res in (previous.get("runs") or {}).items():
        path = Path(args.runs) / "smollm2" / f"{names[label]}.json" if label in names else None
        if path is None or "error" in res or "rows" not in res or path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(res, indent=1))
        written.append(label)
    if written:
        log.info("restored %d SmolLM2 runs from the report at --out into %s: %s", len(written),
                 Path(args.runs) / "smollm2", ", ".join(written))


def smollm2_vs_control(runs: dict) -> list[dict]:
    """Each converted LoRA run against the continued-training control with the same LoRA steps (the
    unconverted model, the same tokens), at every length both measured: ppl / the control's ppl. The
    control's own gain over the original is the domain-adaptation share of the LoRA runs' gain."""
    controls = {r["steps"]: (label, r) for label, r in runs.items()
                if label.startswith("control-") and "rows" in r and r.get("steps")}
    out = []
    for label, r in runs.items():
        if label.startswith("control-") or "rows" not in r or r.get("steps") not in controls:
            continue
        clabel, c = controls[r["steps"]]
        lens = [L for L in sorted({x["length"] for x in r["rows"]}) if ppl_at(c["rows"], L) and ppl_at(r["rows"], L)]
        for L in lens:
            out.append({"run": label, "control": clabel, "length": L, "ppl": ppl_at(r["rows"], L),
                        "control_ppl": ppl_at(c["rows"], L), "ratio": ratio(ppl_at(r["rows"], L), ppl_at(c["rows"], L))})
    return out


def _passkey_summary(report) -> dict:
    """Accuracy by length over depths and trials, for the evaluated (converted-role) model."""
    acc: dict[int, list[int]] = {}
    for cell in report.data.get("passkey") or []:
        if cell.get("role") in EVALUATED and cell.get("accuracy") is not None:
            c = acc.setdefault(cell["length"], [0, 0])
            c[0] += cell["correct"]
            c[1] += cell["trials"]
    return {str(length): round(c / t, 3) for length, (c, t) in sorted(acc.items()) if t}


# ----------------------------------------------------------------------------------------------
# outputs
# ----------------------------------------------------------------------------------------------
def markdown(study: dict) -> str:
    lines = ["# The retrofit study", "", f"Hardware: {study['hardware']}", ""]
    g = study.get("gpt2")
    if g:
        s = g["stand_in"]
        lines += [f"## {stand_in_name(s)} (native {s['native_length']}, pretrained on {s['pretrain_tokens']:,} tokens)", "",
                  "Perplexity on the held-out plays, non-overlapping windows (the original: sliding window past 1x). "
                  "`vs control` = native-length ppl / the continued-training control's at equal extra tokens.", ""]
        lines += T.cells_markdown(g["table"])
        tokens = g["stand_in"]["pretrain_tokens"]
        lines += cheapest_markdown(g.get("cheapest") or [], lambda b: T.budget_words(b, tokens))
        lines += seeds_markdown(g.get("seeds") or [])
        lines += passkey_markdown(g.get("passkey") or {}, g["lengths"], g["stand_in"]["native_length"])
        if g.get("seconds"):
            lines += ["Seconds: " + ", ".join(f"{k} {v:,.0f}" for k, v in g["seconds"].items() if v is not None), ""]
    sm = study.get("smollm2")
    if sm:
        runs = sm["runs"]
        lens = sorted({r["length"] for res in runs.values() for r in res.get("rows", [])})
        head = ["run", *[f"ppl@{L}" for L in lens], "passkey accuracy by length", "fine-tune", "seconds"]
        lines += ["## SmolLM2-135M (RoPE, native 8192)", "",
                  "Perplexity on the held-out plays (non-overlapping windows); passkey: fraction of trials retrieved.", "",
                  *T.md_head(head)]
        for name, res in runs.items():
            if "error" in res:
                lines.append(f"| {name} | error: {res['error']} |")
                continue
            cells = [fmt(ppl_at(res["rows"], L)) for L in lens]
            ft = f"LoRA {res['steps']} steps at {res.get('train_length', 1024)}" if res.get("steps") else "none"
            pk = ", ".join(f"{k}: {v}" for k, v in (res.get("passkey") or {}).items()) or "–"
            if res.get("passkey_error"):
                pk += f"; later lengths not run: {res['passkey_error']}"
            secs = f"{res.get('seconds', '–')}" + "".join(f" + {v} (passkey at {k})"
                                                         for k, v in (res.get("passkey_seconds") or {}).items())
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {pk} | {ft} | {secs} |")
        if sm.get("vs_control"):
            lines += ["", "Against the continued-training control (LoRA on the unconverted model, the same steps and "
                          "tokens): ppl / the control's ppl at the same length.", "",
                      "| run | control | length | ppl | control ppl | ratio |", "|---|---|---|---|---|---|"]
            lines += [f"| {v['run']} | {v['control']} | {v['length']} | {fmt(v['ppl'])} | {fmt(v['control_ppl'])} | "
                      f"{fmt(v['ratio'])} |" for v in sm["vs_control"]]
        lines += ["", f"Longest length measured: {sm['longest_length_measured']}.",
                  f"Seconds of these runs, as each was run: {sm.get('seconds', 0):,.0f}."]
    return "\n".join(lines) + "\n"


def stand_in_name(s: dict) -> str:
    """"GPT-2 stand-in" or "LlamaForCausalLM stand-in `study2-llama`", from the stand-in's pretrain stats."""
    stats = s.get("pretrain_stats") or {}
    kind = "GPT-2" if stats.get("model_class", "GPT2LMHeadModel") == "GPT2LMHeadModel" else stats["model_class"]
    return f"{kind} stand-in" + (f" `{stats['preset']}`" if stats.get("preset") else "")


def plot(study: dict, out: Path) -> list[str]:
    """The ppl-vs-length plot next to ``out``: study_gpt2_ppl_vs_length.png for benchmarks/study.json
    (the first round's name), else <out stem>_ppl_vs_length.png, so one study never overwrites another's."""
    g = study.get("gpt2")
    if not g:
        return []
    stem = "study_gpt2" if out.stem == "study" else out.stem
    title = lambda top: f"{stand_in_name(g['stand_in'])}, fine-tune budget {top:.1%} of pretraining"  # noqa: E731
    return [T.plot(g, g["stand_in"]["native_length"], title, out.parent / f"{stem}_ppl_vs_length.png")]


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, its lists split (no check of names: main does that)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["gpt2", "smollm2", "all"], default="all")
    p.add_argument("--preset", default="study",
                   help="baseline preset of the stand-in (retrofit.baseline.PRESETS: study, study2-gpt2, study2-llama, ...)")
    p.add_argument("--schemes", default=",".join(SCHEMES),
                   help="comma list of SCHEME or [LABEL=]SCHEME:KEY=VALUE;KEY=VALUE, "
                        "e.g. 'alibi,yarn8=rope:scaling=yarn;factor=8,rope:scaling=dynamic;factor=8'")
    p.add_argument("--methods", default="full,lora", help="the first also runs the distill/fade/offset variants")
    p.add_argument("--budgets", default="0,0.001,0.005,0.02", help="fine-tune budgets, fractions of pretraining tokens")
    p.add_argument("--multiples", default="1,2,4,8,16,32", help="eval lengths as multiples of the native length")
    p.add_argument("--no-variants", dest="variants", action="store_false", help="skip distill/fade/offset cells")
    p.add_argument("--zero-shot-only", default="", help="comma list of --schemes labels run at budget 0 only")
    p.add_argument("--seeds", default="", help="extra fine-tune seeds (comma list) for --seed-labels at --seed-budgets, "
                   "with the control; cells named ...-seedN")
    p.add_argument("--seed-labels", default="", help="comma list of --schemes labels that get the extra seeds")
    p.add_argument("--seed-budgets", default="0.02,0.1", help="budgets that get the extra seeds")
    p.add_argument("--seed-methods", default="", help="methods that get the extra seeds (default: every --methods)")
    # defaults chosen by the 2%-budget sweep in docs/study.md (alibi vs the control, native-length ppl)
    p.add_argument("--batch-size", type=int, default=2, help="blocks of the native length per step")
    p.add_argument("--lr-lora", type=float, default=1e-3)
    p.add_argument("--lr-full", type=float, default=1.5e-4)
    p.add_argument("--lora-embeddings", action=argparse.BooleanOptionalAction, default=True,
                   help="LoRA cells also train the token embeddings (norms always train)")
    p.add_argument("--eval-budget", type=int, default=16384, help="tokens scored per length")
    p.add_argument("--stride", type=int, default=None, help="sliding stride for the original (default native/2)")
    p.add_argument("--smollm2-lengths", default="1024,2048,4096,8192")
    p.add_argument("--smollm2-long-lengths", default="8192,16384",
                   help="lengths for x4 rescaled RoPE (past the native 8k); empty = --smollm2-lengths")
    p.add_argument("--smollm2-runs", default=",".join(SMOLLM2_RUNS),
                   help="which SmolLM2 runs, in order")
    p.add_argument("--smollm2-steps", type=int, default=100, help="LoRA steps for the fine-tuned SmolLM2 runs")
    p.add_argument("--smollm2-yarn-lora-steps", type=int, default=30, help="LoRA steps before YaRN x4 past 8k")
    p.add_argument("--smollm2-train-length", type=int, default=1024, help="fine-tune block length (tokens)")
    p.add_argument("--smollm2-lr", type=float, default=5e-4)
    p.add_argument("--smollm2-budget", type=int, default=8192, help="tokens scored per length (at least one window)")
    p.add_argument("--passkey", action="store_true", default=True)
    p.add_argument("--no-passkey", dest="passkey", action="store_false")
    p.add_argument("--passkey-trials", type=int, default=1, help="trials per length and depth (3 depths)")
    p.add_argument("--passkey-lengths", default="1024,2048,4096,8192,16384",
                   help="SmolLM2 passkey lengths (each run: those it measures perplexity at)")
    p.add_argument("--stand-in-passkey-trials", type=int, default=10,
                   help="part 1: passkey trials per length and depth (3 depths); 0 = no passkey in part 1")
    p.add_argument("--stand-in-passkey-budgets", default="top",
                   help="part 1: which cells get the passkey test besides the original: top (the largest budget), "
                        "all, none, or a comma list of budgets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", default="runs/study", help="cache of finished cells")
    p.add_argument("--force", action="store_true", help="recompute cached cells")
    p.add_argument("--rerun", default="",
                   help="comma-separated cell names to run again (and test for passkey again) though cached, "
                        "e.g. a cell restored from the report whose fine-tuned weights are not on this machine")
    p.add_argument("--cached-only", action="store_true", help="report the cells already computed, run nothing new")
    p.add_argument("--no-new-cells", dest="new_cells", action="store_false",
                   help="part 1: fine-tune no new cell (those not cached are reported as not run), but run the passkey "
                        "test of the cached ones")
    p.add_argument("--out", default="benchmarks/study.json",
                   help="the report (JSON; .md and plots beside it); its cells go back into an empty --runs cache "
                        "when they were measured on the same stand-in with the same settings")
    p.add_argument("--stand-ins", default=str(STANDINS),
                   help="shipped stand-ins to copy from instead of pretraining ('' = none; default: standins/)")
    args = p.parse_args(argv)
    args.schemes = [s for s in args.schemes.split(",") if s]
    args.methods = args.methods.split(",")
    args.zero_shot_only = {x for x in args.zero_shot_only.split(",") if x}
    args.seeds = [int(x) for x in args.seeds.split(",") if x]
    args.seed_labels = {x for x in args.seed_labels.split(",") if x}
    args.seed_budgets = [float(x) for x in args.seed_budgets.split(",") if x]
    args.seed_methods = {x for x in args.seed_methods.split(",") if x}
    args.budgets = [float(b) for b in args.budgets.split(",")]
    args.multiples = [int(m) for m in args.multiples.split(",")]
    args.smollm2_lengths = [int(x) for x in args.smollm2_lengths.split(",")]
    args.smollm2_long_lengths = [int(x) for x in args.smollm2_long_lengths.split(",") if x]
    args.passkey_lengths = [int(x) for x in args.passkey_lengths.split(",") if x]
    args.smollm2_runs = [x for x in args.smollm2_runs.split(",") if x]
    args.rerun = {x for x in args.rerun.split(",") if x}
    return args


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    import torch

    import retrofit

    unknown = sorted({parse_scheme(x)["scheme"] for x in args.schemes} - set(retrofit.schemes()))
    if unknown:
        raise SystemExit(f"unknown schemes {unknown}; registered: {retrofit.schemes()}")
    all_labels = [parse_scheme(x)["label"] for x in args.schemes]
    twice = sorted({x for x in all_labels if all_labels.count(x) > 1})
    if twice:
        raise SystemExit(f"--schemes: two entries share the label(s) {twice}; name them LABEL=SCHEME:...")
    labels = set(all_labels)
    unknown = sorted((args.zero_shot_only | args.seed_labels) - labels)
    if unknown:
        raise SystemExit(f"--zero-shot-only/--seed-labels name no --schemes label: {unknown}; labels: {sorted(labels)}")
    if args.seed_methods - set(args.methods):
        raise SystemExit(f"--seed-methods {sorted(args.seed_methods - set(args.methods))} are not in --methods {args.methods}")
    if args.seed in args.seeds:
        raise SystemExit(f"--seeds are the extra seeds; {args.seed} is --seed already")
    if args.rerun and (args.cached_only or not args.new_cells):
        raise SystemExit("--rerun trains cells again; it cannot go with --cached-only or --no-new-cells")
    if args.rerun and args.part == "smollm2":
        raise SystemExit("--rerun names cells of the stand-in grid (--part gpt2); to run a SmolLM2 run again, "
                         "give --force with --smollm2-runs naming only that run")
    unknown = sorted(set(args.smollm2_runs) - set(SMOLLM2_RUNS))
    if unknown:
        raise SystemExit(f"unknown --smollm2-runs {unknown}; known: {', '.join(SMOLLM2_RUNS)}")
    out = Path(args.out)
    study = json.loads(out.read_text()) if out.exists() else {}
    previous = {**study.get("gpt2", {}), "command": study.get("command")} if study.get("gpt2") else None
    from retrofit.versions import cpu_info

    study.update({
        "command": shlex.join(["python", "scripts/study.py", *(sys.argv[1:] if argv is None else argv)]),
        "hardware": {"device": "cuda" if torch.cuda.is_available() else "cpu", "cpus": os.cpu_count(),
                     "platform": platform.platform(), "torch_threads": torch.get_num_threads(), **cpu_info()},
        "versions": {"retrofit": retrofit.__version__, "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__},
    })
    t0 = time.time()
    if args.part in ("gpt2", "all"):
        _, _, native = stand_in(args)
        args.stride = args.stride or native // 2
        def checkpoint(g: dict) -> None:  # the report so far, JSON only (the .md and plots at the end)
            out.parent.mkdir(parents=True, exist_ok=True)
            write_text(out, json.dumps({**study, "gpt2": g}, indent=1, default=str))

        study["gpt2"] = part_gpt2(args, previous, checkpoint)
    if args.part in ("smollm2", "all"):
        study["smollm2"] = part_smollm2(args, study.get("smollm2"))
    study["seconds"] = round(time.time() - t0, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, json.dumps(study, indent=1, default=str))
    (out.with_suffix(".md")).write_text(markdown(study))
    plots = plot(study, out)
    print(markdown(study))
    print(f"wrote {out}, {out.with_suffix('.md')}, {', '.join(plots)}")


if __name__ == "__main__":
    main()
