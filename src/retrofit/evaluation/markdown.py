"""``report.md``: the tables of a Report."""

from __future__ import annotations

from ..foundation import run_folder
from . import verdict


def _fmt(x, digits: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.{digits}f}" if abs(x) < 1e6 else f"{x:.3g}"
    return str(x)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _mb(b) -> str:
    return "–" if b is None else f"{b / 2**20:,.0f} MiB"


def ppl_table(report) -> str:
    """Models x methods down, lengths across; each cell 'ppl [CI]'."""
    lengths = report["settings"]["lengths"]
    keys = []
    for r in report.rows:
        k = (r["model"], r["role"], r["method"])
        if k not in keys:
            keys.append(k)
    body = []
    for model, role, method in keys:
        cells = []
        for L in lengths:
            r = next((r for r in report.rows if (r["model"], r["method"], r["length"]) == (model, method, L)), None)
            if r is None:
                cells.append("–")
                continue
            cell = _fmt(r["ppl"])
            if r["ci_low"] is not None:
                cell += f" [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]"
            if r["method"] in ("sliding", "native-window"):
                starred = r["note"] and not r["note"].startswith("past the native")
                cell += f" (w{r['window']}/s{r['stride']})" + ("*" if starred else "")
            cells.append(cell)
        body.append([f"`{model}`", role, method, *cells])
    natives = [(m.get("native") or {}).get("length") for m in report["models"]]
    native = min((n for n in natives if n), default=None)
    head = [f"{L} ({L / native:g}x)" + (" †" if L > native else "") if native else str(L) for L in lengths]
    return _table(["model", "role", "method", *head], body)


def cost_table(report) -> str:
    """Speed and peak memory per row. The increment over the start is shown where it is measured (the CUDA
    allocator); a CPU process's peak RSS keeps what the allocator held from earlier work, so none is shown."""
    delta = bool(report["cost"]) and report["cost"][0]["memory_measure"].startswith("torch.cuda")
    body = [
        [
            f"`{c['model']}`",
            str(c["length"]),
            c["method"],
            _fmt(c["tokens_per_s"], 0),
            _mb(c["peak_memory_bytes"]),
            *([_mb(c["peak_memory_delta_bytes"])] if delta else []),
            str(r.get("kernel") or "–"),
            "–" if c.get("same_pass_as_length") is None else f"same pass as {c['same_pass_as_length']}",
        ]
        for c, r in zip(report["cost"], report.rows)
    ]
    return _table(
        [
            "model",
            "length",
            "method",
            "tokens/s",
            "peak memory",
            *(["peak − start"] if delta else []),
            "attention",
            "note",
        ],
        body,
    )


def _correct(r: dict) -> str:
    """'4/5 [0.38, 0.96]': correct of trials with the 95% Wilson interval."""
    ci = f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]" if r.get("ci_low") is not None else ""
    return f"{r['correct']}/{r['trials']}{ci}"


def _recall_cell(r: dict) -> str:
    """'9/10 [0.60, 0.98]; 96% tok, -0.21': exact matches, then per-token accuracy and mean log-prob."""
    return f"{_correct(r)}; {r['token_accuracy']:.0%} tok, {r['mean_logprob']:.2f}"


def _grid(report, section: str, cell) -> str:
    """A retrieval section as a table: a row per (model, length), a column per depth."""
    s = report["settings"][section]
    body = []
    for model in dict.fromkeys(r["model"] for r in report[section]):
        for L in s["lengths"]:
            cells = []
            for d in s["depths"]:
                r = next(r for r in report[section] if (r["model"], r["length"], r["depth"]) == (model, L, d))
                cells.append("not run" if r["accuracy"] is None else cell(r))
            body.append([f"`{model}`", str(L), *cells])
    return _table(["model", "length", *[f"depth {d:g}" for d in s["depths"]]], body)


def passkey_table(report) -> str:
    return _grid(report, "passkey", _correct)


def recall_table(report) -> str:
    return _grid(report, "recall", _recall_cell)


def copy_table(report) -> str:
    """Retrieval at distance: a row per model, a column per distance; 'gain [CI] exact' per cell."""
    cells = report["copy"]["cells"]
    distances = sorted({c["distance"] for c in cells})
    natives = {m["name"]: (m.get("native") or {}).get("length") for m in report["models"]}
    body = []
    for model in dict.fromkeys(c["model"] for c in cells):
        row = [f"`{model}`"]
        for d in distances:
            c = next((c for c in cells if (c["model"], c["distance"]) == (model, d)), None)
            if c is None or not c["trials"]:
                row.append("not run")
            else:
                lo, hi = c["copy_gain_ci"]
                row.append(
                    f"{c['copy_gain']:.2f} [{lo:.2f}, {hi:.2f}]; {c['exact']}/{c['trials']}"
                    + (" (sliding window)" if c.get("note") else "")
                )
        reach = next((r for r in report["copy"]["reach"] if r["model"] == model), None)
        row.append(
            f"{reach['reach']:,} ({reach['reach_x']:g}x) [{reach['reach_low_x']:g}x, {reach['reach_high_x']:g}x]"
            if reach
            else "–"
        )
        body.append(row)
    native = min((n for n in natives.values() if n), default=None)
    head = [f"d={d:,}" + (f" ({d / native:g}x)" if native else "") for d in distances]
    return _table(["model", *head, "effective reach"], body)


def _scheme(m: dict) -> str:
    """'alibi', or 'native rope' for an unconverted model."""
    return m["scheme"] or f"native {(m.get('native') or {}).get('kind') or ''}".strip()


def render_markdown(report, plots: dict | None = None) -> str:
    """report.md: the models and data, the verdict, then a section per measure that ran (a causal LM's measures'
    ``Measure.markdown``, in the catalog's order), the cost, the environment."""
    from .measure import by_task

    plots = plots or {}
    sections = (_head, *(m.markdown for m in by_task()["causal-lm"]), _cost_and_environment)
    return "\n".join(line for section in sections for line in section(report, plots))


def _head(report, plots: dict) -> list[str]:
    d = report.data
    out = ["# Evaluation report", ""]
    out.append(
        _table(
            ["model", "role", "scheme", "base model", "max length", "parameters"],
            [
                [
                    f"`{m['name']}`",
                    m["role"],
                    _scheme(m),
                    str(m["base_model"] or "–"),
                    str(m["max_length"] or "unlimited"),
                    f"{m['parameters']:,}",
                ]
                for m in d["models"]
            ],
        )
    )
    data = d["data"]
    docs = data["documents"]
    out += [
        "",
        f"Data: `{data['spec']}`, {data['tokens']:,} tokens scored by every model at every length "
        f"(fingerprint `{data['fingerprint']}`, {docs} document{'s' if docs != 1 else ''}, budget "
        f"{data['budget']:,}).",
        "",
    ]
    out += ["## Verdict", "", *verdict.lines(d.get("verdict") or verdict.verdict(d)), ""]
    return out


def perplexity_section(report, plots: dict) -> list[str]:
    out = []
    out += [
        "## Perplexity vs length",
        "",
        "Non-overlapping windows of each length, and sliding windows (window w, stride s) scoring the same "
        "tokens. Brackets: 95% CI over windows.",
        "",
        ppl_table(report),
        "",
    ]
    out += ["† past the native length.", ""]
    notes = dict.fromkeys(
        r["note"]
        for r in report.rows
        if r["note"] and r["method"] == "sliding" and not r["note"].startswith("past the native")
    )  # the starred cells (the header has †)
    for note in notes:
        out += [f"\\* {note}.", ""]
    if run_folder.PLOT_PPL in plots:
        out += [f"![perplexity vs length]({run_folder.PLOT_PPL})", ""]
    if run_folder.PLOT_POSITIONS in plots:
        out += ["## Loss by position", "", f"![loss by position]({run_folder.PLOT_POSITIONS})", ""]
    return out


def passkey_section(report, plots: dict) -> list[str]:
    d, out = report.data, []
    if not d.get("passkey"):
        return []
    s = d["settings"]["passkey"]
    out += [
        "## Passkey retrieval",
        "",
        f"Correct answers out of {s['trials']} trials per cell (greedy decoding, seed {d['seeds']['passkey']}), "
        "with the 95% Wilson interval of the accuracy.",
        "",
        passkey_table(report),
        "",
    ]
    if run_folder.PLOT_PASSKEY in plots:
        out += [f"![passkey]({run_folder.PLOT_PASSKEY})", ""]
    return out


def recall_section(report, plots: dict) -> list[str]:
    d, out = report.data, []
    if not d.get("recall"):
        return []
    s = d["settings"]["recall"]
    out += [
        "## Recall",
        "",
        f"A random span of {s['span']} tokens sits at each depth of the eval text; its first {s['cue']} "
        f"repeat at the end and the model must continue with the other {s['span'] - s['cue']}. Each cell: "
        f"exact continuations out of {s['trials']} trials (seed {d['seeds'].get('recall')}) with the 95% "
        "Wilson interval; the share of continuation tokens predicted right; the mean log-probability per "
        "continuation token. Teacher-forced in one forward pass: a continuation is exact exactly when "
        "greedy decoding would produce it.",
        "",
        recall_table(report),
        "",
    ]
    if run_folder.PLOT_RECALL in plots:
        out += [f"![recall]({run_folder.PLOT_RECALL})", ""]
    return out


def copy_section(report, plots: dict) -> list[str]:
    d, out = report.data, []
    if not d.get("copy"):
        return []
    s = d["settings"]["copy"]
    distractors = f" ({s['keys'] - 1} distractor spans between)" if s["keys"] > 1 else ""
    out += [
        "## Retrieval at distance",
        "",
        f"A {s['span']}-token span of the eval text (natural text) stands d tokens before its first {s['cue']} "
        f"tokens repeat at the end{distractors}; "
        f"each cell: the copy gain (nats per token the first occurrence saves on the span's other "
        f"{s['span'] - s['cue']} tokens) with its bootstrap 95% interval, and exact greedy continuations of "
        f"{s['trials']} paired trials. Effective reach: the longest distance keeping half of the gain at the "
        "shortest one [from the intervals' ends]. A baseline with a limit reads through its sliding window.",
        "",
        copy_table(report),
        "",
    ]
    return out


def _cost_and_environment(report, plots: dict) -> list[str]:
    d, out = report.data, []
    env = d["environment"]
    out += [
        "## Cost",
        "",
        f"Memory measure: {d['cost'][0]['memory_measure'] if d['cost'] else '–'}.",
        "",
        cost_table(report),
        "",
    ]
    out += [
        "## Environment",
        "",
        f"retrofit {env['retrofit']}, transformers {env['transformers']}, torch {env['torch']}, "
        f"Python {env['python']}; {env['hardware'].get('gpu') or env['hardware']['cpu']} "
        f"({env['hardware']['device']}).",
        "",
    ]
    return out
