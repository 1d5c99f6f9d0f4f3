"""The verdict of an evaluation: whether each evaluated model runs past its native length, whether it
*reads* there (the far-context gain over its own native-size window on the same tokens: ``farcontext``),
and how it compares with the original read through a sliding window; and which retrieval tests cannot inform
(every trial failed even at the native length). Computed from the report's rows alone, so it says only
what was measured; ``report.md`` opens with it and ``report.json`` carries it (``verdict``)."""

from __future__ import annotations

RUNS_TOLERANCE = 1.10  # ppl at the longest length within 10% of 1x: "runs" there without breaking down


def _row(rows, model, method, length):
    return next((r for r in rows if (r["model"], r["method"], r["length"]) == (model, method, length)), None)


def model_verdict(data: dict, model: dict) -> dict | None:
    """One evaluated model's verdict at the longest length past its native one, or None when no length
    past native was run plainly. Reading is the far-context gain (``farcontext``): full context against a
    native-size window on the same tokens, with its paired interval."""
    rows, name = data["rows"], model["name"]
    native = (model.get("native") or {}).get("length")
    past = [
        r for r in rows if r["model"] == name and r["method"] == "non-overlapping" and native and r["length"] > native
    ]
    if not past:
        return None
    far = max(past, key=lambda r: r["length"])
    L = far["length"]
    at1 = _row(rows, name, "non-overlapping", native)
    out = {
        "model": name,
        "native": native,
        "length": L,
        "multiple": round(L / native, 2),
        "ppl": far["ppl"],
        "ppl_1x": at1["ppl"] if at1 else None,
    }
    out["runs"] = at1 is not None and far["ppl"] <= RUNS_TOLERANCE * at1["ppl"]
    reach = next((r for r in (data.get("copy") or {}).get("reach", []) if r["model"] == name), None)
    if reach is not None:
        out["reach"] = {
            k: reach[k]
            for k in (
                "reach",
                "reach_low",
                "reach_high",
                "reach_x",
                "reach_low_x",
                "reach_high_x",
                "reference_gain",
                "copies",
            )
        }
    gains = [g for g in data.get("far_context") or [] if g["model"] == name and g["length"] == L]
    for g in gains:
        key = "own" if g["against"] == "own native window" else "original"
        out[key] = {k: g[k] for k in ("against", "gain", "ci_low", "ci_high", "reads")}
    return out


def uninformative(data: dict, section: str) -> list[str]:
    """Models whose every trial of a retrieval section failed at lengths within their native length: the
    test cannot rank such a model (it fails where nothing positional is asked of it)."""
    out = []
    natives = {m["name"]: (m.get("native") or {}).get("length") for m in data["models"]}
    for name in dict.fromkeys(r["model"] for r in data.get(section) or []):
        inside = [
            r
            for r in data[section]
            if r["model"] == name
            and natives.get(name)
            and r["length"] <= natives[name]
            and r.get("accuracy") is not None
        ]
        if inside and not any(r["correct"] for r in inside):
            out.append(name)
    return out


def verdict(data: dict) -> dict:
    """``{"models": [model_verdict...], "passkey_uninformative": [...], "recall_uninformative": [...]}``."""
    evaluated = [m for m in data["models"] if m["role"] != "baseline"]
    return {
        "models": [v for v in (model_verdict(data, m) for m in evaluated) if v is not None],
        "passkey_uninformative": uninformative(data, "passkey"),
        "recall_uninformative": uninformative(data, "recall"),
    }


def _x(v: float) -> str:
    return f"{v:.2f}x"


def _gain(g: dict) -> str:
    """Four decimals, as ``farcontext`` rounds them (``reads`` is decided on the interval shown)."""
    ci = f" [{g['ci_low']:.4f}, {g['ci_high']:.4f}]" if g["ci_low"] is not None else ""
    return f"gain {g['gain']:.4f}{ci}"


def lines(v: dict) -> list[str]:
    """The verdict as sentences (markdown bullets) for report.md and the model card."""
    out = []
    for m in v["models"]:
        at = f"at {m['length']:,} tokens ({m['multiple']:g}x its native {m['native']:,})"
        s = f"- `{m['model']}` {at}: ppl {m['ppl']:.2f}"
        if m["ppl_1x"] is not None:
            s += f", {_x(m['ppl'] / m['ppl_1x'])} its ppl at 1x ({m['ppl_1x']:.2f})"
            s += ": it **runs** there." if m["runs"] else ": it **breaks down** there."
        out.append(s)
        if "own" in m:
            out.append(
                f"  - Full context against its own native-size window on the same tokens: {_gain(m['own'])} "
                + (
                    "— it **reads past its native length**."
                    if m["own"]["reads"]
                    else "— one window only, so no interval: nothing can be said (raise --budget)."
                    if m["own"]["ci_low"] is None
                    else "— it **does not read past its native length**: the far tokens **hurt** (the interval lies "
                    "below 1: its own native window scores better)."
                    if m["own"]["ci_high"] < 1.0
                    else "— it **does not read past its native length** (the interval holds 1: the far tokens do not "
                    "help)."
                )
            )
        if "reach" in m:
            r = m["reach"]
            out.append(
                "  - Effective reach: not measurable — it copies nothing even at short distance."
                if not r["copies"]
                else f"  - Effective reach (the longest distance at which retrieval of a natural span keeps half "
                f"its gain at 1/4 native): **{r['reach']:,} tokens ({r['reach_x']:g}x native)** "
                f"[{r['reach_low_x']:g}x, {r['reach_high_x']:g}x]."
            )
        if "original" in m:
            g = m["original"]
            out.append(
                f"  - Against the {g['against']} on the same tokens: {_gain(g)} — "
                + (
                    "**better than the original with a sliding window**."
                    if g["reads"]
                    else "not better: a user would do as well with the original and a sliding window."
                )
            )
    if not v["models"]:
        out.append("- No length past a model's native length was run plainly: nothing to say about reach.")
    for section, what in (("passkey", "Passkey"), ("recall", "Recall")):
        names = v[f"{section}_uninformative"]
        if names:
            out.append(
                f"- {what} cannot inform on {', '.join(f'`{n}`' for n in names)}: every trial failed even "
                "within the native length, so its zeros past native say nothing about positions."
            )
    out.append(
        "- Gain: the window's perplexity over the full context's on the same tokens (above 1: the tokens "
        "past the window help), with a paired bootstrap 95% interval over windows."
    )
    return out
