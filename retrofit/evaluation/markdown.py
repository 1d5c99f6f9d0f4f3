"""``report.md``: the tables of a Report."""

from __future__ import annotations


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
            if r["method"] == "sliding":
                cell += f" (w{r['window']}/s{r['stride']})" + ("*" if r["note"] else "")
            cells.append(cell)
        body.append([f"`{model}`", role, method, *cells])
    return _table(["model", "role", "method", *[str(L) for L in lengths]], body)


def cost_table(report) -> str:
    body = [[f"`{c['model']}`", str(c["length"]), c["method"], _fmt(c["tokens_per_s"], 0), _mb(c["peak_memory_bytes"]),
             _mb(c["peak_memory_delta_bytes"]), str(r.get("attention_path") or "–"),
             "" if c.get("same_pass_as_length") is None else f"same pass as {c['same_pass_as_length']}"]
            for c, r in zip(report["cost"], report.rows)]
    return _table(["model", "length", "method", "tokens/s", "peak memory", "peak − start", "attention", ""], body)


def passkey_table(report) -> str:
    pk = report["settings"]["passkey"]
    body = []
    for model in dict.fromkeys(r["model"] for r in report["passkey"]):
        for L in pk["lengths"]:
            cells = []
            for d in pk["depths"]:
                r = next(r for r in report["passkey"] if (r["model"], r["length"], r["depth"]) == (model, L, d))
                ci = f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]" if r.get("ci_low") is not None else ""
                cells.append("not run" if r["accuracy"] is None else f"{r['correct']}/{r['trials']}{ci}")
            body.append([f"`{model}`", str(L), *cells])
    return _table(["model", "length", *[f"depth {d:g}" for d in pk["depths"]]], body)


def _scheme(m: dict) -> str:
    """'alibi', or 'native rope' for an unconverted model."""
    return m["scheme"] or f"native {(m.get('native') or {}).get('kind') or ''}".strip()


def render_markdown(report, plots: dict | None = None) -> str:
    d = report.data
    out = ["# Evaluation report", ""]
    out.append(_table(["model", "role", "scheme", "base model", "max length", "parameters"],
                      [[f"`{m['name']}`", m["role"], _scheme(m), str(m["base_model"] or "–"),
                        str(m["max_length"] or "unlimited"), f"{m['parameters']:,}"] for m in d["models"]]))
    data = d["data"]
    out += ["", f"Data: `{data['spec']}`, {data['tokens']:,} tokens scored by every model at every length "
            f"(fingerprint `{data['fingerprint']}`, {data['documents']} documents, budget {data['budget']:,}).", ""]
    out += ["## Perplexity vs length", "",
            "Non-overlapping windows of each length, and sliding windows (window w, stride s) scoring the same "
            "tokens. Brackets: 95% CI over windows.", "", ppl_table(report), ""]
    notes = dict.fromkeys(r["note"] for r in report.rows if r["note"] and r["method"] == "sliding")  # the starred cells
    for note in notes:
        out += [f"\\* {note}.", ""]
    if "ppl_vs_length.png" in (plots or {}):
        out += ["![perplexity vs length](ppl_vs_length.png)", ""]
    if "loss_by_position.png" in (plots or {}):
        out += ["## Loss by position", "", "![loss by position](loss_by_position.png)", ""]
    if d.get("passkey"):
        s = d["settings"]["passkey"]
        out += ["## Passkey retrieval", "",
                f"Correct answers out of {s['trials']} trials per cell (greedy decoding, seed {d['seeds']['passkey']}), "
                "with the 95% Wilson interval of the accuracy.",
                "", passkey_table(report), ""]
        if "passkey.png" in (plots or {}):
            out += ["![passkey](passkey.png)", ""]
    env = d["environment"]
    out += ["## Cost", "", f"Memory measure: {d['cost'][0]['memory_measure'] if d['cost'] else '–'}.", "",
            cost_table(report), ""]
    out += ["## Environment", "",
            f"retrofit {env['retrofit']}, transformers {env['transformers']}, torch {env['torch']}, "
            f"Python {env['python']}; {env['hardware'].get('gpu') or env['hardware']['cpu']} "
            f"({env['hardware']['device']}).", ""]
    return "\n".join(out)
