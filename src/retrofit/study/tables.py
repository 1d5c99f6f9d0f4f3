"""The study's tables, in one place for ``retrofit study`` and the committed study reports (research/study.py).

A study is a list of cells, each ``{"name", "label", "scheme" (None: the continued-training control),
"method", "budget", "extra_tokens", "role", "seed" (absent: the base seed), "rows"}`` (``rows``: the
perplexity rows of its evaluation; a failed or missing cell has ``"error"`` instead), beside the original's
rows. From them: one row per cell (``cell_table``), the cheapest budget per scheme label and method that
meets the target (``cheapest_budgets``), the seeds (``seed_table``), passkey retrieval pooled over depths
(``pooled_passkey``), their markdown, and the ppl-vs-length plot.

The target: ppl@1x <= ``control_slack`` x the control's at equal tokens (budget 0: the original's) and
ppl@LONGx <= ``length_slack`` x its own ppl@1x.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..foundation.atomic import replacing
from ..foundation.schema import field_help as _f

EVALUATED = ("converted", "original")


def pooled_passkey(rows: list[dict]) -> dict:
    """{length: {"correct", "trials", "accuracy", "ci_low", "ci_high"}} over the depths."""
    from retrofit.scoring.intervals import wilson

    out = {}
    for r in rows:
        if r.get("accuracy") is None:
            continue
        c = out.setdefault(str(r["length"]), {"correct": 0, "trials": 0})
        c["correct"] += r["correct"]
        c["trials"] += r["trials"]
    for c in out.values():
        c["accuracy"] = round(c["correct"] / c["trials"], 4)
        c["ci_low"], c["ci_high"] = (round(x, 4) for x in wilson(c["correct"], c["trials"]))
    return out


# ----------------------------------------------------------------------------------------------
# the README's summary: cheapest budget per method; seeds as mean ± spread
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """What a cell must reach to count as recovered (the cheapest-budget and seeds tables)."""

    control_slack: float = _f(
        "ppl@1x at most this many times the continued-training control's at equal tokens (budget 0: the original's).",
        1.02,
    )
    long: int = _f("The long length, a multiple of the native length that the eval lengths include.", 16)
    length_slack: float = _f("ppl at the long length at most this many times the cell's own ppl@1x.", 1.05)


TARGET = Target()


def meets_target(p1: float | None, ref: float | None, plong: float | None, target: Target = TARGET) -> bool | None:
    """The target: ppl@1x <= control_slack x the reference's ppl@1x and ppl@LONGx <= length_slack x its own
    ppl@1x (None when a figure is missing)."""
    return (
        None if None in (p1, ref, plong) else (p1 <= target.control_slack * ref and plong <= target.length_slack * p1)
    )


def cheapest_budgets(table: list[dict], native: int, target: Target = TARGET) -> list[dict]:
    """Per scheme label and fine-tune method: the cheapest budget at which the cell meets the target (ppl@1x
    against the control's at equal tokens, at budget 0 the original's). Budget-0 cells (no fine-tune) count
    for every method. Seeded repeats are left out (the base seed)."""
    LONG = target.long
    orig = next(r for r in table if r["cell"].startswith("original (plain"))["ppl@1x"]
    controls = {
        (r["method"], r["budget"]): r.get("ppl@1x")
        for r in table
        if r.get("scheme") is None and r["cell"].startswith("control") and r.get("seed") is None
    }
    cells = [
        r
        for r in table
        if r.get("label")
        and r.get("scheme")
        and r.get("seed") is None
        and r.get("objective", "lm") == "lm"
        and not r.get("fade")
        and not r.get("random_offset")
    ]
    methods = sorted({r["method"] for r in cells if r["method"] != "none"}) or ["none"]
    out = []
    for label in dict.fromkeys(r["label"] for r in cells):
        for method in methods:
            mine = sorted(
                (r for r in cells if r["label"] == label and r["method"] in (method, "none")), key=lambda r: r["budget"]
            )
            if not mine:
                continue
            found, checked = None, []
            for r in mine:
                ref = orig if r["budget"] == 0 else controls.get((method, r["budget"]))
                p1, p16 = r.get("ppl@1x"), r.get(f"ppl@{LONG}x")
                ok = meets_target(p1, ref, p16, target)
                checked.append(
                    {"budget": r["budget"], "ppl@1x": p1, "reference@1x": ref, f"ppl@{LONG}x": p16, "met": ok}
                )
                if ok and found is None:
                    found = r["budget"]
            out.append({"label": label, "method": method, "cheapest_budget": found, "checked": checked})
    return out


def seed_table(
    table: list[dict], lengths: list[int], native: int, base_seed: int = 0, target: Target = TARGET
) -> list[dict]:
    """Cells run with several seeds: mean ± sample standard deviation (and min..max) of ppl@1x, ppl@LONGx,
    ppl@LONGx/1x and vs_control@1x over the seeds, the base seed included, and how many seeds meet the target
    (each against the control of its own seed)."""
    import statistics

    LONG = target.long

    groups: dict[tuple, list[dict]] = {}
    for r in table:
        if "label" in r and "error" not in r:
            groups.setdefault((r["label"], r["method"], r["budget"]), []).append(r)
    out = []
    for (label, method, budget), rows in groups.items():
        if len(rows) < 2:
            continue
        row = {
            "label": label,
            "method": method,
            "budget": budget,
            "seeds": sorted(base_seed if r.get("seed") is None else r["seed"] for r in rows),
        }
        for key in ("ppl@1x", f"ppl@{LONG}x", f"ppl@{LONG}x/1x", "vs_control@1x"):
            vals = [r[key] for r in rows if r.get(key) is not None]
            if len(vals) >= 2:
                row[key] = {
                    "mean": round(statistics.mean(vals), 4),
                    "sd": round(statistics.stdev(vals), 4),
                    "min": round(min(vals), 4),
                    "max": round(max(vals), 4),
                    "n": len(vals),
                }
        judged = [
            v
            for r in rows
            if (v := meets_target(r.get("ppl@1x"), r.get("control_ppl@1x"), r.get(f"ppl@{LONG}x"), target)) is not None
        ]  # the target, seed by seed, each against the control of its own seed
        if judged:
            row["met"] = {"seeds": sum(judged), "of": len(judged)}
        out.append(row)
    return out


def ppl_at(rows: list[dict], length: int, role: str = "converted", method: str = "non-overlapping", key: str = "ppl"):
    """``key`` (ppl; bpc for a masked LM) of the row at ``length`` read as ``method``, or None."""
    for r in rows:
        if r["length"] == length and r["role"] == role and r["method"] == method:
            return r.get(key)
    return None


def _bpc(row: dict, rows: list[dict], lengths: list[int], native: int, control: list[dict] | None, long: int):
    """A masked LM's bits per character beside its perplexity (the encoders' measure, Longformer's): at each
    length, against the control at 1x and its own 1x at ``long``; nothing for a model whose rows have none."""
    bpc = {L: ppl_at(rows, L, key="bpc") for L in lengths}
    if all(v is None for v in bpc.values()):
        return
    row.update({f"bpc@{L // native}x": v for L, v in bpc.items()})
    if control is not None:
        row["bpc_vs_control@1x"] = ratio(bpc[native], ppl_at(control, native, key="bpc"))
    row[f"bpc@{long}x/1x"] = ratio(bpc.get(long * native), bpc[native])


def cell_table(
    original: list[dict], results: list[dict], lengths: list[int], native: int, long: int = TARGET.long
) -> list[dict]:
    """One row per cell: ppl at each length, and the ratio to the control at equal tokens; the original first."""

    def reference(L, key="ppl"):
        return ppl_at(original, L, "baseline", "non-overlapping", key) or ppl_at(
            original, L, "baseline", "sliding", key
        )

    orig = {L: reference(L) for L in lengths}
    orig_bpc = {f"bpc@{L // native}x": reference(L, "bpc") for L in lengths}
    controls = {
        (c["method"], c["budget"], c.get("seed")): c for c in results if c.get("role") == "control" and "rows" in c
    }
    out = [
        {
            "cell": "original (plain at 1x, sliding beyond)",
            "scheme": None,
            "method": None,
            "budget": 0,
            "extra_tokens": 0,
            **{f"ppl@{L // native}x": orig[L] for L in lengths},
            **({} if all(v is None for v in orig_bpc.values()) else orig_bpc),
        }
    ]
    as_is = {L: ppl_at(original, L, "baseline-as-is") for L in lengths if L > native}
    if any(v is not None for v in as_is.values()):
        out.append(
            {
                "cell": "original (read past native as is)",
                "scheme": None,
                "method": None,
                "budget": 0,
                "extra_tokens": 0,
                "ppl@1x": orig[native],
                **{f"ppl@{L // native}x": v for L, v in as_is.items()},
            }
        )
    for c in results:
        row = {
            "cell": c["name"],
            "scheme": c["scheme"],
            "method": c["method"],
            "budget": c["budget"],
            "extra_tokens": c["extra_tokens"],
            "objective": c.get("objective", "lm"),
            "fade": c.get("fade", 0),
            "random_offset": c.get("random_offset", 0),
            "seconds": c.get("seconds"),
            **{k: c[k] for k in ("label", "seed", "pose") if c.get(k) is not None},
        }
        if "rows" not in c:
            out.append({**row, "error": c.get("error")})
            continue
        for L in lengths:
            row[f"ppl@{L // native}x"] = ppl_at(c["rows"], L)
        ctrl = controls.get((c["method"], c["budget"], c.get("seed")))
        native_ppl = row["ppl@1x"]
        if native_ppl and orig.get(native):
            row["vs_original@1x"] = round(native_ppl / orig[native], 4)
        if ctrl and c.get("role") != "control" and native_ppl:
            row["control_ppl@1x"] = ppl_at(ctrl["rows"], native)
            row["vs_control@1x"] = round(native_ppl / row["control_ppl@1x"], 4)
        _bpc(row, c["rows"], lengths, native, ctrl["rows"] if ctrl and c.get("role") != "control" else None, long)
        if native_ppl:
            for k in sorted({8, 16, long}):
                row[f"ppl@{k}x/1x"] = ratio(row.get(f"ppl@{k}x"), native_ppl)
            row["beats_original_sliding_everywhere"] = all(
                row.get(f"ppl@{L // native}x") is not None
                and orig[L] is not None
                and row[f"ppl@{L // native}x"] < orig[L]
                for L in lengths
            )
        out.append(row)
    return out


def ratio(a, b):
    return round(a / b, 4) if a is not None and b else None


def cheapest_markdown(rows: list[dict], words, target: Target = TARGET) -> list[str]:
    """``words(budget)``: how a budget reads in the table (None: not reached)."""
    if not rows:
        return []
    LONG = target.long
    out = [
        "### Cheapest budget",
        "",
        f"The cheapest fine-tune budget at which a method reaches ppl@1x <= {target.control_slack}x the "
        f"continued-training control's at equal tokens (budget 0: the original's) and ppl@{LONG}x <= "
        f"{target.length_slack}x its own ppl@1x.",
        "",
        f"| method | fine-tune | cheapest budget | at each budget: ppl@1x / reference, ppl@{LONG}x / ppl@1x |",
        "|---|---|---|---|",
    ]
    for r in rows:
        checks = "; ".join(
            f"{c['budget']:g}: {fmt(ratio(c['ppl@1x'], c['reference@1x']))}, {fmt(ratio(c[f'ppl@{LONG}x'], c['ppl@1x']))}"
            for c in r["checked"]
        )
        out.append(f"| {r['label']} | {r['method']} | {words(r['cheapest_budget'])} | {checks} |")
    return out + [""]


def seeds_markdown(rows: list[dict], target: Target = TARGET) -> list[str]:
    if not rows:
        return []
    LONG = target.long
    out = [
        "### Seeds",
        "",
        "Mean ± sample standard deviation over the seeds (min..max); the last column: how many "
        "seeds meet the target, each against the control of its own seed.",
        "",
        f"| method | fine-tune | budget | seeds | ppl@1x | ppl@{LONG}x | {LONG}x/1x | vs control@1x | target met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            f"{v['mean']:.3f} ± {v['sd']:.3f} ({v['min']:.3f}..{v['max']:.3f})" if (v := r.get(k)) else "–"
            for k in ("ppl@1x", f"ppl@{LONG}x", f"ppl@{LONG}x/1x", "vs_control@1x")
        ]
        met = f"{m['seeds']} of {m['of']}" if (m := r.get("met")) else "–"
        out.append(
            f"| {r['label']} | {r['method']} | {r['budget']:g} | {','.join(map(str, r['seeds']))} | "
            + " | ".join(cells)
            + f" | {met} |"
        )
    return out + [""]


def passkey_markdown(
    passkey: dict,
    lengths: list[int],
    native: int,
    title: str = "Passkey retrieval",
    pooled: str = "depths 0, 0.5 and 1 (greedy decoding)",
) -> list[str]:
    """Retrieval (passkey or recall) by model and length: ``{name: {"by_length": pooled_passkey(rows)}}``."""
    if not passkey:
        return []
    head = ["model", *[f"{L // native}x ({L})" for L in lengths]]
    out = [
        f"### {title}",
        "",
        f"Correct of trials at each length, pooled over {pooled}, with the 95% Wilson "
        "interval of the accuracy; – = not run at that length.",
        "",
        *md_head(head),
    ]
    for name, res in passkey.items():
        if "error" in res:
            out.append(f"| {name} | error: {res['error']} |")
            continue
        by = res["by_length"]
        vals = [
            f"{c['correct']}/{c['trials']} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]" if (c := by.get(str(L))) else "–"
            for L in lengths
        ]
        out.append(f"| {name} | " + " | ".join(vals) + " |")
    return out + [""]


def fmt(x):
    if x is None:
        return "–"
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def md_head(head: list[str]) -> list[str]:
    """A markdown table's first two lines."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]


def cells_markdown(table: list[dict], long: int = TARGET.long) -> list[str]:
    """The table of every cell (``cell_table``'s rows): ppl at each length, against the control and the original."""
    keys = [k for k in table[0] if k.startswith("ppl@")]
    ratios = [f"ppl@{k}x/1x" for k in sorted({8, 16, long}) if f"ppl@{k}x" in keys]  # lengths measured only
    head = [
        "cell",
        "extra tokens",
        *keys,
        "vs control@1x",
        "vs original@1x",
        *(k[4:] for k in ratios),
        "< original everywhere",
        "seconds",
    ]
    lines = md_head(head)
    for r in table:
        vals = [
            r["cell"],
            f"{r.get('extra_tokens', 0):,}",
            *[fmt(r.get(k)) for k in keys],
            fmt(r.get("vs_control@1x")),
            fmt(r.get("vs_original@1x")),
            *(fmt(r.get(k)) for k in ratios),
            str(r.get("beats_original_sliding_everywhere", "")) if "error" not in r else f"error: {r['error']}",
            fmt(round(r["seconds"]) if r.get("seconds") is not None else None),
        ]
        lines.append("| " + " | ".join(vals) + " |")
    return lines + [""]


def bpc_markdown(table: list[dict], long: int = TARGET.long) -> list[str]:
    """A masked LM's cells in bits per character (``cell_table``'s bpc keys); nothing for a causal LM."""
    keys = [
        k
        for k in dict.fromkeys(k for r in table for k in r)
        if k.startswith("bpc@") and k.endswith("x") and "/" not in k
    ]
    if not keys:
        return []
    head = ["cell", *(k.replace("bpc@", "BPC@") for k in keys), "BPC vs control@1x", f"BPC {long}x/1x"]
    lines = ["", "## Bits per character (masked tokens)", "", *md_head(head)]
    for r in table:
        if not any(r.get(k) is not None for k in keys):
            continue
        vals = [fmt(r.get(k)) for k in (*keys, "bpc_vs_control@1x", f"bpc@{long}x/1x")]
        lines.append("| " + " | ".join([r["cell"], *vals]) + " |")
    return lines + [""]


def plot(g: dict, native: int, title, path: Path) -> str:
    """The ppl-vs-length plot of a study (``g``: its "table" and "cells") at ``path``: the original and the
    controls as flat lines, every plain cell of the largest budget as a curve (the base seed's). ``title(top)``:
    the title, given the largest budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    keys = [k for k in g["table"][0] if k.startswith("ppl@")]
    xs = [int(k[4:-1]) for k in keys]
    top = max((c["budget"] for c in g["cells"] if "rows" in c and c["scheme"]), default=0)  # the largest budget run
    labels = list(dict.fromkeys(r.get("label") or r.get("scheme") for r in g["table"] if r.get("scheme")))
    colors = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(labels)}  # one per label
    for r in g["table"]:
        plain = r.get("objective", "lm") == "lm" and not r.get("fade") and not r.get("random_offset")
        if not (r["cell"].startswith("original") or (r.get("budget") == top and plain)):
            continue
        ys = [r.get(k) for k in keys]
        if ys[0] is None:
            continue  # a cell not run (or failed): nothing to draw
        if r["cell"] == "original (read past native as is)":
            ax.plot(xs, ys, color="black", linestyle="-.", linewidth=1, label=r["cell"])
            continue
        if r.get("seed") is not None:
            continue  # the base seed's line; the seeds table holds the spread
        if r["cell"].startswith(("original", "control")):  # a flat reference line, one style per method
            style = "--" if r["cell"].startswith("original") else (":" if r.get("method") == "full" else (0, (1, 3)))
            ax.axhline(
                ys[0],
                color="black" if r.get("method") != "lora" else "dimgray",
                linestyle=style,
                linewidth=1,
                label=r["cell"],
            )
            continue
        ax.plot(
            xs,
            ys,
            marker="o" if r["method"] == "full" else "x",
            color=colors.get(r.get("label") or r["scheme"]),
            linestyle="-" if r["method"] == "full" else "--",
            label=r["cell"],
        )
    from matplotlib import ticker

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(ticker.FixedLocator(xs))
    ax.xaxis.set_major_formatter(ticker.FixedFormatter([f"{x:g}x" for x in xs]))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))  # 240, not 2.4x10^2
    ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if str(round(v))[0] in "23456" else ""))
    ax.set_xlabel(f"length / native ({native})")
    ax.set_ylabel("perplexity (held-out plays)")
    ax.set_title(title(top))
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside the data
    fig.set_figwidth(11)
    fig.tight_layout()
    try:
        with replacing(Path(path)) as tmp:
            fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    return str(path)


def use_of(report: dict) -> dict | None:
    """What a cell's eval report says of use past native, for the evaluated model: its effective reach
    (``copy.reach``) and its far-context gains at the longest length (``far_context``); None without them."""
    name = next((m["name"] for m in report["models"] if m["role"] in EVALUATED), None)
    reach = next((r for r in (report.get("copy") or {}).get("reach", []) if r["model"] == name), None)
    gains = [g for g in report.get("far_context") or [] if g["model"] == name]
    longest = max((g["length"] for g in gains), default=None)
    if reach is None and not gains:
        return None
    return {"reach": reach, "gains": [g for g in gains if g["length"] == longest]}


def use_markdown(use: dict, native: int) -> list[str]:
    """Does each cell read past its native length? Effective reach (retrieval of a span of the text) and the
    far-context gain over its own native-size window on the same tokens, at the longest length."""
    rows = {name: u for name, u in use.items() if u}
    if not rows:
        return []
    lines = [
        "",
        "## Does it read past its native length?",
        "",
        "Effective reach: the longest distance at which retrieving a span of the eval text keeps half of its gain "
        "at 1/4 native [from the intervals' ends]; the original reads through its sliding window (the floor). "
        "Gain: perplexity through its own native-size window over the full context's on the same tokens, at the "
        "longest length (above 1 beyond the interval: it reads there).",
        "",
        *md_head(["cell", "effective reach", "gain over its own window", "reads past native"]),
    ]
    for name, u in rows.items():
        r = u.get("reach")
        reach = f"{r['reach_x']:g}x [{r['reach_low_x']:g}x, {r['reach_high_x']:g}x]" if r else "–"
        own = next((g for g in u.get("gains") or [] if g["against"] == "own native window"), None)
        ci = f" [{own['ci_low']:.3f}, {own['ci_high']:.3f}]" if own and own["ci_low"] is not None else " (one window)"
        gain = f"{own['gain']:.3f}{ci} at {own['length'] // native}x" if own else "–"
        lines.append(f"| {name} | {reach} | {gain} | {'yes' if own and own['reads'] else 'no' if own else '–'} |")
    return lines + [""]
