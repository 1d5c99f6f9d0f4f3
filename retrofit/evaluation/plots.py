"""PNG plots of a Report: ppl vs length, loss by position, passkey heatmap."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ppl(report, path: Path) -> None:
    """Every model and method on one figure; sliding rows dashed."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[tuple, list] = {}
    for r in report.rows:
        series.setdefault((r["model"], r["method"]), []).append(r)
    for (model, method), rows in series.items():
        xs = [r["length"] for r in rows]
        ys = [r["ppl"] for r in rows]
        lo = [r["ci_low"] if r["ci_low"] is not None else r["ppl"] for r in rows]
        hi = [r["ci_high"] if r["ci_high"] is not None else r["ppl"] for r in rows]
        strides = sorted({r["stride"] for r in rows})
        stride = f", stride {strides[0]}" if len(strides) == 1 else ", stride = window/2" if all(
            r["stride"] == max(1, r["window"] // 2) for r in rows) else ", strides " + "/".join(map(str, strides))
        label = f"{model} ({method}" + (f"{stride})" if method == "sliding" else ")")
        line, = ax.plot(xs, ys, "o-" if method == "non-overlapping" else "s--", label=label)
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title(f"Perplexity vs length ({report['data']['tokens']:,} tokens of {report['data']['spec']})", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, path)


def plot_positions(report, path: Path) -> None:
    """Mean loss by position in the window, one line per (model, length)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for e in report["loss_by_position"]:
        centers = [max(0.5, (a + b - 1) / 2) for a, b in zip(e["bucket_start"], e["bucket_end"])]
        ax.plot(centers, e["loss"], marker=".", label=f"{e['model']} L={e['length']}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in window (tokens, log-spaced buckets)")
    ax.set_ylabel("mean loss (nats)")
    ax.set_title("Loss by position (non-overlapping windows)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    _save(fig, path)


def plot_passkey(report, path: Path) -> None:
    """One heatmap per model: accuracy over lengths (rows) x depths (columns); grey = not run."""
    s = report["settings"]["passkey"]
    models = list(dict.fromkeys(r["model"] for r in report["passkey"]))
    fig, axes = plt.subplots(1, len(models), figsize=(3.2 * len(models) + 1, 0.45 * len(s["lengths"]) + 1.8),
                             squeeze=False)
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="lightgrey")
    for ax, model in zip(axes[0], models):
        grid = np.full((len(s["lengths"]), len(s["depths"])), np.nan)
        for r in report["passkey"]:
            if r["model"] == model and r["accuracy"] is not None:
                grid[s["lengths"].index(r["length"]), s["depths"].index(r["depth"])] = r["accuracy"]
        im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(s["depths"])), [f"{d:g}" for d in s["depths"]])
        ax.set_yticks(range(len(s["lengths"])), [str(L) for L in s["lengths"]])
        ax.set_xlabel("depth")
        ax.set_ylabel("length")
        ax.set_title(model[-30:], fontsize=8)
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.0%}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="accuracy")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(report, out: Path) -> dict[str, Path]:
    """Write every plot the report has data for; {file name: path}."""
    files = {}
    if report.rows:
        files["ppl_vs_length.png"] = out / "ppl_vs_length.png"
        plot_ppl(report, files["ppl_vs_length.png"])
    if report["loss_by_position"]:
        files["loss_by_position.png"] = out / "loss_by_position.png"
        plot_positions(report, files["loss_by_position.png"])
    if report.data.get("passkey"):
        files["passkey.png"] = out / "passkey.png"
        plot_passkey(report, files["passkey.png"])
    return files
