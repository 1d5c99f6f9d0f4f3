"""The committed study reports (``benchmarks/study*.json/.md/.png``), rebuilt from their cell caches.

A *round* is one committed report: a grid on a stand-in (``retrofit.training.standin``; budgets as fractions of
its pretraining tokens, cells named ``LABEL-METHOD-FRACTION[-seedN]``), or the SmolLM2 runs. Each report's
``Round`` is written in ``research/study.py``; everything else is here, once: the scheme entries
(``[LABEL=]SCHEME:KEY=VALUE;...``), the cells a round holds, their plans, the cache they are read from
(``retrofit.study.cache``; a cell missing from it is reported as not run), the report's cells put back into an
empty cache (same stand-in, same settings), the tables (``retrofit.study.tables``), the markdown and the plot.
Nothing here trains or evaluates: a new study is ``retrofit study GRID.yaml``. A module of the research folder
(``research/study.py`` and ``research/study_sweep.py`` import it), not of the package: nothing a user runs needs it;
``research/test_study_rounds.py`` checks it.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from retrofit.foundation.atomic import write_text
from retrofit.foundation.errors import RecipeError
from retrofit.foundation.schema import parse_overrides
from retrofit.study import tables as T
from retrofit.study.cache import CellCache, read

log = logging.getLogger(__name__)
PASSKEY_DEPTHS = [0.0, 0.5, 1.0]
NOT_RUN = "LookupError: not run yet (not in the cache)"  # a cell the cache lacks
# what a cached cell must share with the planned one to be reused (a label may be given new options)
PLAN_KEYS = (
    "scheme",
    "options",
    "method",
    "steps",
    "objective",
    "fade",
    "random_offset",
    "pose",
    "seed",
    "block",
    "calibrate",
)
# scheme entries: a scheme name, or [LABEL=]SCHEME:KEY=VALUE;KEY=VALUE (the scheme's options), e.g.
# "rope:scaling=yarn;factor=8" (cells named rope-yarn-8-...) or "pi8=rope:scaling=linear;factor=8".
# TRAIN_KEYS among them are the fine-tune's, not the scheme's: pose=TARGET trained with PoSE positions spanning
# TARGET tokens; block=N on blocks of N tokens (the same tokens per step); calibrate=STEPS first fitted the
# scheme's own position parameters to the original (also at budget 0); objective=both: LM + KL to the original.
TRAIN_KEYS = ("pose", "block", "calibrate", "objective")
OBJECTIVES = ("lm", "both", "distill")
# what decides every cell's figures besides the cell's own plan (plan_of): recorded in the report
SETTINGS = (
    "preset",
    "batch_size",
    "lr_full",
    "lr_lora",
    "lora_embeddings",
    "eval_budget",
    "stride",
    "seed",
    "multiples",
)


@dataclass
class Round:
    """One committed report: where it and its cache are, the grid of its cells and the settings they ran with."""

    out: str
    runs: str = "runs/study"
    part: str = "gpt2"  # what is rebuilt: gpt2, the grid on the stand-in `preset`; smollm2, the SmolLM2 runs
    preset: str = "study"
    schemes: list = field(default_factory=list)  # scheme entries, [LABEL=]SCHEME:KEY=VALUE;...
    methods: list = field(default_factory=lambda: ["full", "lora"])  # the first also had the variants
    budgets: list = field(default_factory=lambda: [0, 0.001, 0.005, 0.02])  # fractions of pretraining tokens
    multiples: list = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])  # eval lengths / native
    variants: bool = True  # distill/fade/offset cells of alibi and rope at the top budget
    zero_shot_only: list = field(default_factory=list)  # labels with budget-0 cells only
    seeds: list = field(default_factory=list)  # extra fine-tune seeds, for seed_labels at seed_budgets
    seed_labels: list = field(default_factory=list)
    seed_budgets: list = field(default_factory=lambda: [0.02, 0.1])
    seed_methods: list = field(default_factory=list)  # empty: every method
    batch_size: int = 2  # blocks of the native length per step
    lr_lora: float = 1e-3
    lr_full: float = 1.5e-4
    lora_embeddings: bool = True
    eval_budget: int = 16384  # tokens scored per length
    stride: Optional[int] = None  # the original's sliding stride (None: native/2)
    seed: int = 0
    passkey_trials: int = 10  # per length and depth; 0 = no passkey
    passkey_budgets: str = "top"  # which budgets' cells had the passkey test: top, all, none, or "0.02,0.1"
    smollm2: list = field(default_factory=list)  # the SmolLM2 runs, in order: (label, cache file name)
    smollm2_lengths: list = field(default_factory=lambda: [1024, 2048, 4096, 8192])
    plot: bool = True  # write the ppl-vs-length plot (named by plot())

    def __post_init__(self):
        self.budgets = [float(b) for b in self.budgets]
        self.seed_budgets = [float(b) for b in self.seed_budgets]
        specs = [parse_scheme(x) for x in self.schemes]
        labels = [s["label"] for s in specs]
        twice = sorted({x for x in labels if labels.count(x) > 1})
        if twice:
            raise RecipeError(f"schemes: two entries share the label(s) {twice}; name them LABEL=SCHEME:...")
        unknown = sorted((set(self.zero_shot_only) | set(self.seed_labels)) - set(labels))
        if unknown:
            raise RecipeError(f"zero_shot_only/seed_labels name no scheme label: {unknown}; labels: {labels}")
        if set(self.seed_methods) - set(self.methods):
            raise RecipeError(
                f"seed_methods {sorted(set(self.seed_methods) - set(self.methods))} are not in methods {self.methods}"
            )
        if self.seed in self.seeds:
            raise RecipeError(f"seeds are the extra seeds; {self.seed} is the base seed already")

    def settings(self, native: int) -> dict:
        return {k: getattr(self, k) for k in SETTINGS} | {"stride": self.stride or native // 2}


def budget_words(budget, pretrain_tokens: int) -> str:
    """A committed report's budget in words: a share of the stand-in's pretraining tokens, and the tokens."""
    if budget is None:
        return "not reached"
    return "0 (no fine-tune)" if budget == 0 else f"{budget:.1%} ({round(budget * pretrain_tokens):,} tokens)"


def parse_scheme(spec: str) -> dict:
    """One scheme entry -> {"label", "scheme", "options", and its TRAIN_KEYS}; values read as YAML
    (``retrofit run --set``'s)."""
    head, _, opts = spec.partition(":")
    label, _, scheme = head.rpartition("=")  # LABEL=SCHEME, with or without options
    try:
        options = parse_overrides([x for x in opts.split(";") if x])
    except RecipeError as e:
        raise RecipeError(f"scheme {spec!r}: an option is KEY=VALUE ({e})") from None
    train = {k: options.pop(k) for k in TRAIN_KEYS if k in options}
    if not label:
        label = "-".join([scheme, *(str(v) for v in options.values()), *(f"{k}{v}" for k, v in train.items())])
    if not scheme or any(c in label for c in "/ "):
        raise RecipeError(f"scheme {spec!r}: expected SCHEME or [LABEL=]SCHEME:KEY=VALUE;...")
    if train.get("objective", "lm") not in OBJECTIVES:
        raise RecipeError(f"scheme {spec!r}: objective= takes one of {', '.join(OBJECTIVES)}")
    for key in (k for k in train if k != "objective"):
        if not isinstance(train[key], int) or train[key] <= 0:
            raise RecipeError(
                f"scheme {spec!r}: {key}= takes a positive int (pose=TARGET tokens, block=N tokens, "
                f"calibrate=STEPS), got {train[key]!r}"
            )
    return {"label": label, "scheme": scheme, "options": options, **train}


def steps_for(fraction: float, pretrain_tokens: int, tokens_per_step: int) -> int:
    return max(1, math.ceil(fraction * pretrain_tokens / tokens_per_step)) if fraction > 0 else 0


def plan_of(cell: dict) -> dict:
    """The settings that decide a cell's figures (absent, empty and zero alike: cells cached before a key existed)."""
    return {k: cell.get(k) if k == "seed" else cell.get(k) or None for k in PLAN_KEYS}  # seed 0 is a seed


def cells(r: Round, pretrain_tokens: int, native: int) -> list[dict]:
    """The cells of a round on a stand-in, in their order: per budget, method and seed, the control first; then
    the variants at the top budget."""
    tps = r.batch_size * native
    specs = [parse_scheme(x) for x in r.schemes]
    short = [x["label"] for x in specs if x.get("pose") and x["pose"] <= native]
    if short:
        raise RecipeError(f"schemes {short}: pose=TARGET must exceed the native length {native}")
    out = []
    for frac in r.budgets:
        steps = steps_for(frac, pretrain_tokens, tps)
        common = {"budget": frac, "steps": steps, "extra_tokens": steps * tps}
        for method in r.methods if frac > 0 else ["none"]:
            seeded = frac in r.seed_budgets and frac > 0 and (not r.seed_methods or method in r.seed_methods)
            for seed in [None, *(r.seeds if seeded else [])]:
                tail = f"-seed{seed}" if seed is not None else ""
                extra = {"seed": seed} if seed is not None else {}
                out.append(
                    {
                        "name": f"control-{method}-{frac}{tail}",
                        "label": "control",
                        "scheme": None,
                        "method": method,
                        **common,
                        "role": "control",
                        **extra,
                    }
                )
                for spec in specs:
                    trains = spec.get("pose") or spec.get("block") or spec.get("objective", "lm") != "lm"
                    if frac > 0 and spec["label"] in r.zero_shot_only or frac == 0 and trains:
                        continue  # zero-shot-only labels train no cell; PoSE, long blocks, a teacher: no budget-0 cell
                    if seed is not None and spec["label"] not in r.seed_labels:
                        continue
                    out.append(
                        {
                            "name": f"{spec['label']}-{method}-{frac}{tail}",
                            "label": spec["label"],
                            "scheme": spec["scheme"],
                            "options": spec["options"],
                            "method": method,
                            **common,
                            "role": "converted",
                            **{k: spec[k] for k in TRAIN_KEYS if spec.get(k)},
                            **extra,
                        }
                    )
    top = max(r.budgets)
    if top > 0 and r.variants:
        steps = steps_for(top, pretrain_tokens, tps)
        for scheme in [s for s in ("alibi", "rope") if s in r.schemes]:  # the plain schemes only
            common = {
                "scheme": scheme,
                "method": r.methods[0],
                "budget": top,
                "steps": steps,
                "extra_tokens": steps * tps,
                "role": "converted",
            }
            out.append({**common, "name": f"{scheme}-{common['method']}-{top}-distill", "objective": "both"})
            out.append({**common, "name": f"{scheme}-{common['method']}-{top}-fade", "fade": max(1, steps // 2)})
            if scheme == "rope":
                out.append({**common, "name": f"rope-{common['method']}-{top}-offset", "random_offset": 8 * native})
    return [c for c in out if not (c["scheme"] is None and c["budget"] == 0)]


def cached_cell(cache: CellCache, cell: dict) -> dict:
    """The cell's cached figures for its plan (a label added since kept), else the cell marked not run."""
    old = cache.get(cell["name"], plan_of(cell), plan_of)
    if old is None:
        return {**cell, "error": NOT_RUN}
    return {**old, **{k: v for k, v in cell.items() if k not in old}}


# ----------------------------------------------------------------------------------------------
# a grid on a stand-in
# ----------------------------------------------------------------------------------------------
def stand_in(r: Round, shipped) -> tuple[Path, dict, int]:
    """The stand-in's folder, pretrain stats and native length (the shipped copy where there is one)."""
    from retrofit.foundation import run_folder
    from retrofit.models.standin import load_stats
    from retrofit.training import standin

    path = standin.pretrain(r.preset, shipped=shipped or None)
    return path, load_stats(path), run_folder.native_length(path)


def part_gpt2(r: Round, previous: dict | None, shipped) -> dict:
    """The round's report on its stand-in, from the cache under ``r.runs``; ``previous``: the report at
    ``r.out``, whose cells go back into an empty cache first (restore_cells) and are kept when this grid
    lacks them."""
    from retrofit.models.standin import weights_sha256

    base, stats, native = stand_in(r, shipped)
    pretrain_tokens = stats["pretrain_tokens"]
    lengths = [native * k for k in r.multiples]
    sha = weights_sha256(base)
    log.info(
        "stand-in %s: native %d, pretrained on %d tokens, weights sha256 %s", base, native, pretrain_tokens, sha[:12]
    )
    cache = CellCache(r.runs)
    kept = restore_cells(previous, base, sha, r, native, cache) if previous else []
    original = read(cache.path("original"), None, lambda _: None)
    if original is None:
        raise LookupError(f"the original's figures are not in {cache.path('original')}: nothing to rebuild from")
    cells_ = cells(r, pretrain_tokens, native)
    planned = {c["name"] for c in cells_}
    kept = [c for c in kept if c["name"] not in planned]  # measured earlier, outside this grid: kept in the report
    if kept:
        log.info("keeping %d cells of the report that are not in this grid: %s", len(kept), [c["name"] for c in kept])
    results = [cached_cell(cache, c) for c in cells_] + kept
    passkey = passkey_part(native, lengths, results, r, cache)
    table = T.cell_table(original["rows"], results, lengths, native)
    stand = {
        "path": str(base),
        "native_length": native,
        "pretrain_tokens": pretrain_tokens,
        "weights_sha256": sha,
        "pretrain_stats": stats,
        "settings": r.settings(native),
    }
    return {
        "stand_in": stand,
        "lengths": lengths,
        "original": original["rows"],
        "cells": results,
        "table": table,
        "seeds": T.seed_table(table, lengths, native, r.seed),
        "cheapest": T.cheapest_budgets(table, native),
        "passkey": passkey,
        "seconds": {
            "original": original.get("seconds"),
            "cells": round(sum(c.get("seconds") or 0 for c in results), 1),
            "passkey": round(sum(v.get("seconds") or 0 for v in passkey.values()), 1),
        },
    }


def restore_cells(previous: dict, base: Path, sha: str, r: Round, native: int, cache: CellCache) -> list[dict]:
    """The finished cells of the report at ``r.out`` go back into the cache where missing, with the original's
    rows and the passkey results, when that report was measured on this stand-in (the SHA-256 of its weights)
    with these settings (SETTINGS). Returns those cells. A report from before hashes were recorded counts as
    this stand-in's if its cache key and pretraining losses are this one's to the last digit (the same
    pretraining run); its settings are then the round's. Anything else is an error."""
    from retrofit.models.standin import load_stats

    recorded, mine = previous.get("stand_in") or {}, r.settings(native)
    if recorded.get("weights_sha256"):
        same = recorded["weights_sha256"] == sha
        theirs = recorded.get("settings") or {}
        stand = f"weights sha256 {recorded['weights_sha256'][:12]}, this one {sha[:12]}"
    else:  # a report from before the hash was recorded: the same pretraining run has the same losses
        old_stats, stats = recorded.get("pretrain_stats") or {}, load_stats(base)
        same = all(
            stats.get(k) is not None and old_stats.get(k) == stats.get(k)
            for k in ("cache_key", "heldout_loss", "final_train_loss")
        )
        theirs = mine
        stand = "no hash recorded, and other pretraining losses"
    why = (
        f"another stand-in ({stand})"
        if not same
        else f"other settings ({', '.join(k for k in SETTINGS if theirs.get(k) != mine[k])})"
        if theirs != mine
        else ""
    )
    if why:
        raise RecipeError(f"the report at {r.out} was measured on {why}: its cells are not this round's")
    written = 0
    if previous.get("original"):
        written += cache.restore(
            "original", {"rows": previous["original"], "seconds": (previous.get("seconds") or {}).get("original")}
        )
    restored = [c for c in previous.get("cells", []) if "rows" in c and "error" not in c]
    for cell in restored:
        written += cache.restore(cell["name"], cell)
    for name, res in (previous.get("passkey") or {}).items():
        if "plan" in res and "error" not in res:
            written += cache.restore(name, res, "passkey.json")
    log.info("restored %d results from the report at %s (same stand-in, same settings) into %s", written, r.out, r.runs)
    return restored


def passkey_budgets(r: Round, budgets: list[float]) -> list[float]:
    """Budgets whose cells had the passkey test: 'top' (the largest), 'all', 'none' or a comma list."""
    spec = r.passkey_budgets
    if spec == "none" or not r.passkey_trials:
        return []
    if spec == "all":
        return sorted(set(budgets))
    if spec == "top":
        return [max(budgets)] if budgets else []
    return [float(x) for x in spec.split(",") if x]


def passkey_plan(plan: dict) -> dict:
    """A passkey record's plan with its cell's plan read as plan_of reads a cell (keys added since alike)."""
    return {**plan, **({"cell": plan_of(plan["cell"])} if plan.get("cell") else {})}


def passkey_part(native: int, lengths: list[int], results: list[dict], r: Round, cache: CellCache) -> dict:
    """Passkey of the original and of the base seed's cells at the passkey budgets, from
    ``<runs>/<cell>/passkey.json``: {name: {"plan", "rows", "by_length", "seconds"}} (a missing one: not run)."""
    wanted = passkey_budgets(r, [c["budget"] for c in results])
    if not wanted:
        return {}
    todo = [("original", lengths, None)] + [
        (c["name"], [native] if c["scheme"] is None else lengths, plan_of(c))  # the control keeps its learned table
        for c in results
        if "rows" in c and c["budget"] in wanted and c.get("seed") is None
    ]
    out = {}
    for name, cell_lengths, cell_plan in todo:
        plan = {
            "lengths": cell_lengths,
            "trials": r.passkey_trials,
            "depths": PASSKEY_DEPTHS,
            "seed": r.seed,
            **({"cell": cell_plan} if cell_plan else {}),
        }
        got = cache.get(name, plan, lambda rec: passkey_plan(rec.get("plan") or {}), "passkey.json")
        out[name] = got if got is not None else {"error": NOT_RUN}
    return out


# ----------------------------------------------------------------------------------------------
# the SmolLM2 runs
# ----------------------------------------------------------------------------------------------
SMOLLM2_MODEL = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to fp32)"


def part_smollm2(r: Round, previous: dict | None) -> dict:
    """The SmolLM2 runs of the round (``r.smollm2``: label, cache file), each from ``<runs>/smollm2/<file>.json``;
    the report's finished runs go back into an empty cache first (each as it was measured)."""
    cache = CellCache(Path(r.runs) / "smollm2")  # one file per run, <name>.json, no folder per run (name "")
    file = lambda name: f"{name}.json"  # noqa: E731
    restored = [
        label
        for label, name in r.smollm2
        if label in (previous or {}).get("runs", {})
        and "error" not in previous["runs"][label]
        and "rows" in previous["runs"][label]
        and cache.restore("", previous["runs"][label], file(name))
    ]
    if restored:
        log.info(
            "restored %d SmolLM2 runs from the report at %s into %s: %s",
            len(restored),
            r.out,
            cache.root,
            ", ".join(restored),
        )
    out = {"model": SMOLLM2_MODEL, "lengths": r.smollm2_lengths, "runs": {}}
    for label, name in r.smollm2:
        res = read(cache.path("", file(name)), None, lambda _: None)
        out["runs"][label] = (
            {k: v for k, v in res.items() if k != "passkey_error"} if res is not None else {"error": NOT_RUN}
        )
    out["seconds"] = round(
        sum(
            (res.get("seconds") or 0) + sum((res.get("passkey_seconds") or {}).values()) for res in out["runs"].values()
        ),
        1,
    )  # as run
    out["vs_control"] = smollm2_vs_control(out["runs"])
    out["longest_length_measured"] = (
        max(r["length"] for res in out["runs"].values() for r in res.get("rows", [])) if out["runs"] else None
    )
    return out


def smollm2_vs_control(runs: dict) -> list[dict]:
    """Each converted LoRA run against the continued-training control with the same LoRA steps (the
    unconverted model, the same tokens), at every length both measured: ppl / the control's ppl."""
    controls = {
        r["steps"]: (label, r)
        for label, r in runs.items()
        if label.startswith("control-") and "rows" in r and r.get("steps")
    }
    out = []
    for label, r in runs.items():
        if label.startswith("control-") or "rows" not in r or r.get("steps") not in controls:
            continue
        clabel, c = controls[r["steps"]]
        lens = [
            L for L in sorted({x["length"] for x in r["rows"]}) if T.ppl_at(c["rows"], L) and T.ppl_at(r["rows"], L)
        ]
        for L in lens:
            out.append(
                {
                    "run": label,
                    "control": clabel,
                    "length": L,
                    "ppl": T.ppl_at(r["rows"], L),
                    "control_ppl": T.ppl_at(c["rows"], L),
                    "ratio": T.ratio(T.ppl_at(r["rows"], L), T.ppl_at(c["rows"], L)),
                }
            )
    return out


# ----------------------------------------------------------------------------------------------
# the report
# ----------------------------------------------------------------------------------------------
def rebuild(r: Round, command: str, shipped=None) -> list[str]:
    """Rebuild the round's report at ``r.out`` (JSON, markdown, plot) from its cache; returns the files written.
    The report keeps the hardware, versions and seconds of the runs it reports; ``command`` is recorded."""
    out = Path(r.out)
    study = json.loads(out.read_text()) if out.exists() else {}
    study["command"] = command
    if not study.get("hardware"):
        study.update(_machine())
    if r.part == "gpt2":
        study["gpt2"] = part_gpt2(r, study.get("gpt2"), shipped)
    else:
        study["smollm2"] = part_smollm2(r, study.get("smollm2"))
    study.setdefault("seconds", 0.0)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, json.dumps(study, indent=1, default=str))
    write_text(out.with_suffix(".md"), markdown(study))
    return [str(out), str(out.with_suffix(".md")), *(plot(study, out) if r.plot else [])]


def _machine() -> dict:
    import os
    import platform

    import torch
    import transformers

    from retrofit.foundation.versions import __version__, cpu_info

    return {
        "hardware": {
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch_threads": torch.get_num_threads(),
            **cpu_info(),
        },
        "versions": {"retrofit": __version__, "torch": torch.__version__, "transformers": transformers.__version__},
    }


def stand_in_name(s: dict) -> str:
    """ "GPT-2 stand-in" or "LlamaForCausalLM stand-in `study2-llama`", from the stand-in's pretrain stats."""
    stats = s.get("pretrain_stats") or {}
    kind = "GPT-2" if stats.get("model_class", "GPT2LMHeadModel") == "GPT2LMHeadModel" else stats["model_class"]
    return f"{kind} stand-in" + (f" `{stats['preset']}`" if stats.get("preset") else "")


def markdown(study: dict) -> str:
    lines = ["# The retrofit study", "", f"Hardware: {study['hardware']}", ""]
    g = study.get("gpt2")
    if g:
        s = g["stand_in"]
        lines += [
            f"## {stand_in_name(s)} (native {s['native_length']}, pretrained on {s['pretrain_tokens']:,} tokens)",
            "",
            "Perplexity on the held-out plays, non-overlapping windows (the original: sliding window past 1x). "
            "`vs control` = native-length ppl / the continued-training control's at equal extra tokens.",
            "",
        ]
        lines += T.cells_markdown(g["table"])
        tokens = g["stand_in"]["pretrain_tokens"]
        lines += T.cheapest_markdown(g.get("cheapest") or [], lambda b: budget_words(b, tokens))
        lines += T.seeds_markdown(g.get("seeds") or [])
        lines += T.passkey_markdown(g.get("passkey") or {}, g["lengths"], g["stand_in"]["native_length"])
        if g.get("seconds"):
            lines += ["Seconds: " + ", ".join(f"{k} {v:,.0f}" for k, v in g["seconds"].items() if v is not None), ""]
    sm = study.get("smollm2")
    if sm:
        runs = sm["runs"]
        lens = sorted({r["length"] for res in runs.values() for r in res.get("rows", [])})
        head = ["run", *[f"ppl@{L}" for L in lens], "passkey accuracy by length", "fine-tune", "seconds"]
        lines += [
            "## SmolLM2-135M (RoPE, native 8192)",
            "",
            "Perplexity on the held-out plays (non-overlapping windows); passkey: fraction of trials retrieved.",
            "",
            *T.md_head(head),
        ]
        for name, res in runs.items():
            if "error" in res:
                lines.append(f"| {name} | error: {res['error']} |")
                continue
            vals = [T.fmt(T.ppl_at(res["rows"], L)) for L in lens]
            ft = f"LoRA {res['steps']} steps at {res.get('train_length', 1024)}" if res.get("steps") else "none"
            pk = ", ".join(f"{k}: {v}" for k, v in (res.get("passkey") or {}).items()) or "–"
            if res.get("passkey_error"):
                pk += f"; later lengths not run: {res['passkey_error']}"
            secs = f"{res.get('seconds', '–')}" + "".join(
                f" + {v} (passkey at {k})" for k, v in (res.get("passkey_seconds") or {}).items()
            )
            lines.append(f"| {name} | " + " | ".join(vals) + f" | {pk} | {ft} | {secs} |")
        if sm.get("vs_control"):
            lines += [
                "",
                "Against the continued-training control (LoRA on the unconverted model, the same steps and "
                "tokens): ppl / the control's ppl at the same length.",
                "",
                "| run | control | length | ppl | control ppl | ratio |",
                "|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {v['run']} | {v['control']} | {v['length']} | {T.fmt(v['ppl'])} | {T.fmt(v['control_ppl'])} | "
                f"{T.fmt(v['ratio'])} |"
                for v in sm["vs_control"]
            ]
        lines += [
            "",
            f"Longest length measured: {sm['longest_length_measured']}.",
            f"Seconds of these runs, as each was run: {sm.get('seconds', 0):,.0f}.",
        ]
    return "\n".join(lines) + "\n"


def plot(study: dict, out: Path) -> list[str]:
    """The ppl-vs-length plot next to ``out``: study_gpt2_ppl_vs_length.png for benchmarks/study.json
    (the first round's name), else <out stem>_ppl_vs_length.png, so one study never overwrites another's."""
    g = study.get("gpt2")
    if not g:
        return []
    stem = "study_gpt2" if out.stem == "study" else out.stem
    title = lambda top: f"{stand_in_name(g['stand_in'])}, fine-tune budget {top:.1%} of pretraining"  # noqa: E731
    return [T.plot(g, g["stand_in"]["native_length"], title, out.parent / f"{stem}_ppl_vs_length.png")]
