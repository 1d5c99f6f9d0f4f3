"""Run a study grid on the pipeline's stages and write its reports.

Each cell is a pipeline run (``retrofit.pipeline.stages.run``) in ``OUT/cells/<name>/``: the recipe with the
cell's keys set, its fine-tune and its eval exactly as ``retrofit run`` does them (a cell killed midway
resumes from its last checkpoint when the recipe checkpoints). A budget-0 cell is the model converted (and
calibrated, when the recipe says so) by the fine-tune's own steps and scored by the pipeline's eval, with no
training. A finished cell is cached in ``OUT/cells/<name>/cell.json`` with the recipe it ran: the same
grid run again reuses it, a cell whose recipe changed runs again, ``rerun`` patterns recompute the cells
they match. Then ``OUT/study.json``, ``OUT/study.md`` and ``OUT/ppl_vs_length.png``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from pathlib import Path

from ..foundation import run_folder, schema
from ..foundation.atomic import write_text
from ..foundation.errors import LengthError, OptionError, RecipeError, RetrofitError
from ..foundation.versions import cpu_info, library_versions
from ..models.io import load_original
from ..pipeline.recipe import _hash, load_recipe
from ..pipeline.stages import STAGES, evaluate_section
from ..pipeline.stages import run as run_pipeline
from ..training.standin import ensure
from . import tables
from .cache import CellCache, read, write
from .grid import Grid, cells

log = logging.getLogger(__name__)
CELLS, CELL, ORIGINAL = run_folder.STUDY_CELLS, run_folder.STUDY_CELL, run_folder.STUDY_ORIGINAL
REPORT, REPORT_MD, PLOT = run_folder.STUDY_REPORT, run_folder.STUDY_REPORT_MD, run_folder.STUDY_PLOT


def base_recipe(grid: Grid) -> dict:
    """The grid's recipe as a plain dict, without what the study decides (output_dir, baselines, export, push)."""
    raw = schema.read_yaml(grid.recipe) if isinstance(grid.recipe, str) else copy.deepcopy(grid.recipe)
    for key in ("export", "push"):
        raw.pop(key, None)
    raw["export"] = {"native": False}  # a cell is measured, not published
    raw.setdefault("eval", {})["baselines"] = []  # the original is scored once, for every cell
    raw["output_dir"] = "unset"
    return raw


def cell_recipe(raw: dict, cell: dict, out: Path):
    """The pipeline recipe of one cell (a RunRecipe). The control keeps its own mechanism: it is scored at
    the native length only."""
    overrides = [*cell["overrides"], f"output_dir={out / CELLS / cell['name']}"]
    if cell["scheme"] is None:
        overrides += ["convert.options={}", "convert.calibrate.data=null", "eval.lengths=[1x]"]
    if not cell["budget"]:
        overrides.append("train.steps=1")  # the recipe must validate; budget 0 trains nothing
    rr = load_recipe(raw, overrides)
    if cell["scheme"] is None:
        rr.eval = _within_native(rr.eval, rr.eval.lengths)
    return rr


def _within_native(e, lengths, native: int | None = None):
    """An eval section whose passkey and recall keep to the native length (where a model that cannot read past
    it is tested): the lengths of theirs that are ``1x`` or at most ``native`` tokens; none left, none run."""
    from ..evaluation.lengths import resolve

    keep = {}
    for kind in ("passkey", "recall"):
        asked = getattr(e, f"{kind}_lengths") or lengths
        mine = [x for x in asked if x == "1x" or native is not None and resolve([x], native)[0] <= native]
        keep.update({kind: bool(mine) and getattr(e, kind), f"{kind}_lengths": mine or None})
    return dataclasses.replace(e, **keep)


def run_cell(cell: dict, raw: dict, out: Path, rerun=()) -> dict:
    """One cell: its figures from the cache when it ran with this recipe (and is not to be rerun), else run."""
    rr = cell_recipe(raw, cell, out)
    plan = _hash({k: v for k, v in rr.to_dict().items() if k != "output_dir"})  # the folder may move
    cache = CellCache(rr.run_dir.parent, rerun)
    old = cache.get(cell["name"], plan)
    if old is not None:
        log.info("%s: cached", cell["name"])
        return {**cell, **{k: v for k, v in old.items() if k != "plan"}}
    t0 = time.time()
    if cell["budget"]:
        run_pipeline(rr, force=STAGES if cache.recompute(cell["name"]) else ())
        report = json.loads((rr.run_dir / run_folder.EVAL / run_folder.REPORT).read_text())
        trainable = run_folder.versions(rr.run_dir).get("trainable_parameters")
    else:
        report = _zero_shot(rr).data
        trainable = 0
    result = {
        "rows": [{**r, "role": "converted"} for r in report["rows"] if r["role"] in tables.EVALUATED],
        "passkey": [r for r in report.get("passkey") or [] if r["role"] in tables.EVALUATED],
        "recall": [r for r in report.get("recall") or [] if r["role"] in tables.EVALUATED],
        "use": tables.use_of(report),
        "seconds": round(time.time() - t0, 1),
        "trainable_parameters": trainable,
    }
    cache.put(cell["name"], {"plan": plan, **result})
    return {**cell, **result}


def _tokens(rr) -> int:
    """Tokens per optimizer step."""
    t = rr.finetune.train
    return t.batch_size * t.gradient_accumulation_steps * rr.finetune.data.block_length


def _zero_shot(rr):
    """The model converted (and calibrated) as the fine-tune would start, evaluated by the pipeline's eval."""
    from ..training.calibrate import calibrate
    from ..training.model import convert, load, make_teacher

    r = rr.finetune
    model, tok = load(r.model)
    teacher = make_teacher(model, r.model) if r.convert.calibrate.data else None
    convert(model, r.convert)
    if teacher is not None:
        calibrate(model, teacher, r.convert.calibrate, tokenizer=tok, seed=r.train.seed, progress=False)
    model.eval()
    native = _native(model)
    return evaluate_section(
        (f"{r.model.name_or_path} + {r.convert.scheme} (not fine-tuned)", model, tok), [], rr.eval, native
    )


def _native(model) -> int:
    from ..patch.conversion import describe

    return describe(model)["native"]["length"]


def run_original(raw: dict, out: Path) -> dict:
    """The unconverted original, once: plain at 1x with the sliding window beside it (reported at every longer
    length: it scores the same target tokens there), and read as is past 1x where its mechanism allows.
    Cached in OUT/original.json."""
    rr = load_recipe(
        raw,
        [
            f"output_dir={out / CELLS / 'original'}",
            "convert.scheme=null",
            "convert.options={}",
            "convert.calibrate.data=null",
        ],
    )
    path = out / ORIGINAL
    plan = _hash({"model": dataclasses.asdict(rr.finetune.model), "eval": dataclasses.asdict(rr.eval)})
    cached = read(path, plan)
    if cached is not None:
        return cached
    t0 = time.time()
    m = rr.finetune.model
    ensure(m.name_or_path)  # a recipe's stand-in (standin:NAME) is built here, as `retrofit run` builds it
    name, model, tok = load_original(m.name_or_path, gguf_file=m.gguf_file, dtype=m.dtype)
    native = _native(model)
    from ..evaluation.lengths import resolve

    lengths = resolve(rr.eval.lengths, native)
    one = dataclasses.replace(_within_native(rr.eval, lengths, native), lengths=[native], sliding=True)
    if one.copy:  # retrieval at every distance the cells are measured at, through the original's window: the floor
        one = dataclasses.replace(one, copy_distances=_copy_distances(rr.eval, lengths, native))
    report = evaluate_section((name, model, tok), [], one, native).data
    rows = [{**r, "role": "baseline"} for r in report["rows"]]
    sliding = next(r for r in rows if r["method"] == "sliding")
    rows += [{**sliding, "length": L, "note": f"sliding window {native}, same targets"} for L in lengths if L > native]
    longer = [L for L in lengths if L > native]
    if longer:
        try:
            plain = dataclasses.replace(rr.eval, lengths=longer, sliding=False, passkey=False, recall=False)
            rows += [
                {**r, "role": "baseline-as-is", "note": "past the native length, unchanged"}
                for r in evaluate_section((name, model, tok), [], plain, native).data["rows"]
                if r["length"] in longer and r["method"] == "non-overlapping"  # a masked LM adds its sliding row
            ]
        except LengthError as e:
            log.info("the original cannot read past its native length, so it has no as-is rows: %s", e)
    result = {
        "plan": plan,
        "native_length": native,
        "lengths": lengths,
        "rows": rows,
        "passkey": report.get("passkey") or [],
        "recall": report.get("recall") or [],
        "use": tables.use_of(report),
        "seconds": round(time.time() - t0, 1),
    }
    write(path, result)
    return result


def _copy_distances(section, lengths: list[int], native: int) -> list[int]:
    """The copy distances the cells are measured at (the defaults: those up to the longest length), in tokens."""
    from ..evaluation.lengths import resolve
    from ..evaluation.options import DEFAULTS

    out = resolve(section.copy_distances, native)
    return [d for d in out if d <= max(lengths)] if section.copy_distances == DEFAULTS.copy_distances else out


def run_study(grid: Grid, out: str | Path | None = None, rerun=()) -> Path:
    """Run (or resume) every cell of ``grid``, then write the reports; returns the study folder."""
    out = Path(out or grid.output_dir)
    raw = base_recipe(grid)
    plan = cells(grid)
    unknown = [p for p in rerun if not any(CellCache(out, [p]).recompute(c["name"]) for c in plan)]
    if unknown:
        raise OptionError(
            f"--rerun {unknown}: no cell of this grid matches; its cells: {', '.join(c['name'] for c in plan)}"
        )
    for c in plan:  # every recipe validates before anything runs
        c["extra_tokens"] = _tokens(cell_recipe(raw, c, out)) * c["budget"]
    original = run_original(raw, out)
    if grid.target.long * original["native_length"] not in original["lengths"]:
        raise RecipeError(
            f"target.long is {grid.target.long}x, which the recipe's eval.lengths "
            f"{original['lengths']} lack: add {grid.target.long}x to them, or set target.long"
        )
    results = []
    for i, cell in enumerate(plan, 1):
        log.info("[%d/%d] %s", i, len(plan), cell["name"])
        try:
            results.append(run_cell(cell, raw, out, rerun))
        except RetrofitError:
            raise  # bad input: the same in every cell
        except Exception as e:  # record and go on: one broken cell must not hide the others
            log.exception("cell %s failed", cell["name"])
            results.append({**cell, "error": f"{type(e).__name__}: {e}"})
    return write_reports(grid, out, original, results)


def write_reports(grid: Grid, out: Path, original: dict, results: list[dict]) -> Path:
    native, lengths, target = original["native_length"], original["lengths"], grid.target
    table = tables.cell_table(original["rows"], results, lengths, native, target.long)
    retrieval = {}
    for kind in ("passkey", "recall"):
        got = {"original": original.get(kind)} | {c["name"]: c.get(kind) for c in results if c.get("seed") is None}
        retrieval[kind] = {name: {"by_length": tables.pooled_passkey(rows)} for name, rows in got.items() if rows}
    study = {
        "grid": dataclasses.asdict(grid),
        "native_length": native,
        "lengths": lengths,
        "original": original["rows"],
        "cells": results,
        "table": table,
        "cheapest": tables.cheapest_budgets(table, native, target),
        "seeds": tables.seed_table(table, lengths, native, grid.seeds[0], target),
        "retrieval": retrieval,
        "use": {"original": original.get("use")} | {c["name"]: c.get("use") for c in results if c.get("seed") is None},
        "seconds": {
            "original": original.get("seconds"),
            "cells": round(sum(c.get("seconds") or 0 for c in results), 1),
        },
        "environment": {"hardware": cpu_info(), "versions": library_versions()},  # where the reports were written
    }
    write_text(out / REPORT, json.dumps(study, indent=1, default=str))
    tables.plot(
        {"table": table, "cells": results},
        native,
        lambda top: f"ppl vs length, fine-tune budget {top} steps",
        out / PLOT,
    )
    write_text(out / REPORT_MD, markdown(study, target))
    return out


def _steps(budget) -> str:
    return "not reached" if budget is None else "0 (no fine-tune)" if budget == 0 else f"{budget} steps"


def markdown(study: dict, target) -> str:
    model = (
        study["grid"]["recipe"]
        if isinstance(study["grid"]["recipe"], str)
        else study["grid"]["recipe"].get("model", {}).get("name_or_path")
    )
    lines = [
        f"# Study: {model}",
        "",
        f"Native length {study['native_length']}. Perplexity on the recipe's eval data, "
        "non-overlapping windows (the original: sliding window past 1x). `vs control` = ppl@1x / the "
        "continued-training control's (the unconverted model fine-tuned on the same tokens).",
        "",
    ]
    lines += tables.cells_markdown(study["table"], target.long)
    lines += tables.bpc_markdown(study["table"], target.long)
    lines += tables.cheapest_markdown(study["cheapest"], _steps, target)
    lines += tables.seeds_markdown(study["seeds"], target)
    lines += tables.use_markdown(study.get("use") or {}, study["native_length"])
    for kind, title in (("passkey", "Passkey retrieval"), ("recall", "Recall")):
        lines += tables.passkey_markdown(
            study["retrieval"].get(kind) or {}, study["lengths"], study["native_length"], title, "depths"
        )
    lines.append(f"![ppl vs length]({PLOT})")
    return "\n".join(lines) + "\n"
