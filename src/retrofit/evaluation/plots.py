"""PNG plots of a Report: ppl vs length, loss by position, passkey and recall heatmaps.

Each ``*_figure(report)`` builds a matplotlib figure (the tests inspect it); ``plot_*`` saves it through
the atomic writer. The layout is constrained with the legends outside the axes, so nothing is drawn
over the data or past the figure's edge; titles are wrapped, never cut."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np

from ..foundation import run_folder
from ..foundation.atomic import replacing

_MATPLOTLIB = ("plt", "ticker", "Line2D", "Patch")  # bound by _load on the first figure


def _load() -> None:
    """matplotlib (its Agg backend), imported by the first figure, not by importing this module: its first import
    on a machine builds a font cache by running ``fc-list``, which a report without plots has no need of."""
    global plt, ticker, Line2D, Patch
    if "plt" in globals():
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch


def __getattr__(name: str):
    """``plots.plt`` and the rest of ``_MATPLOTLIB`` read from outside: matplotlib imported then."""
    if name in _MATPLOTLIB:
        _load()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


NOT_RUN_COLOR = "lightgrey"
# One colour per model (tab10, then tab20 for more), one line style and marker per method / model.
_SHADES = ("Blues", "Oranges", "Greens", "Purples", "Reds", "Greys", "YlOrBr", "PuRd")
_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "v", "D", "P")


# per method: (line, marker, filled) — a model's series differ in all three, not only in the legend
METHOD_STYLES = {
    "non-overlapping": ("-", "o", True),
    "sliding": ("--", "s", False),
    "native-window": (":", "^", False),
}


def method_style(method: str) -> tuple[str, str, bool]:
    """(line style, marker, filled) of a perplexity method; an unknown one gets a style of its own."""
    if method in METHOD_STYLES:
        return METHOD_STYLES[method]
    k = sum(map(ord, method))
    return _STYLES[k % len(_STYLES)], _MARKERS[k % len(_MARKERS)], False


def _model_colors(models) -> dict:
    cmap = plt.get_cmap("tab10" if len(models) <= 10 else "tab20")
    return {m: cmap(i % cmap.N) for i, m in enumerate(models)}


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False)) or text


def _plain(v: float, step: float) -> str:
    """A tick label in plain digits (no ×10ⁿ): as many decimals as the tick spacing needs."""
    decimals = max(0, -math.floor(math.log10(step))) if step > 0 else 0
    return f"{v:,.{decimals}f}"


def _plain_log_y(ax, lo: float, hi: float) -> None:
    """A log y axis from ``lo`` to ``hi`` labelled in plain numbers: evenly spaced round ticks when the
    range is under a decade or so (matplotlib would label only minor ticks, as 1.05×10²), 1-2-5 ticks
    otherwise."""
    pad = (hi / lo) ** 0.06 if hi > lo else 1.02
    lo, hi = lo / pad, hi * pad
    ax.set_ylim(lo, hi)
    if hi / lo < 20:
        ticks = [t for t in ticker.MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi) if lo <= t <= hi]
    else:
        ticks = [t for t in ticker.LogLocator(base=10, subs=(1, 2, 5)).tick_values(lo, hi) if lo <= t <= hi]
    if len(ticks) < 2:
        ticks = [lo, hi]
    step = min(b - a for a, b in zip(ticks, ticks[1:]))
    ax.yaxis.set_major_locator(ticker.FixedLocator(ticks))
    ax.yaxis.set_major_formatter(ticker.FixedFormatter([_plain(t, step) for t in ticks]))
    ax.yaxis.set_minor_locator(ticker.NullLocator())
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def _plain_log2_x(ax, values) -> None:
    """A log-2 x axis with a tick at each given value, labelled plainly (1,024, not 2¹⁰)."""
    values = sorted(set(values))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(ticker.FixedLocator(values))
    ax.xaxis.set_major_formatter(ticker.FixedFormatter([f"{v:,g}" for v in values]))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def _save(fig, path: Path) -> None:
    _load()
    try:
        with replacing(path) as tmp:
            # raw write: savefig into the temporary path replacing() hands out
            fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight", pad_inches=0.1)
    finally:
        plt.close(fig)


def ppl_figure(report):
    """Every model and method on one figure: a colour per model, a line style and marker per method
    (``METHOD_STYLES``: solid circles non-overlapping, dashed open squares sliding, dotted open triangles the
    native window), so no two series of one model look alike. A series of one point (the original at its native length)
    is a large diamond with its interval drawn on top of everything, so no other series hides it."""
    _load()
    series: dict[tuple, list] = {}
    for r in report.rows:
        series.setdefault((r["model"], r["method"]), []).append(r)
    colors = _model_colors(list(dict.fromkeys(m for m, _ in series)))
    # the legend (one entry a line, below the axes) grows the figure, never squeezes the plot
    fig, ax = plt.subplots(figsize=(7, max(4.5, 3.4 + 0.18 * len(series))), layout="constrained")
    ys_all = []
    # single points last, so they are drawn over the lines
    for (model, method), rows in sorted(series.items(), key=lambda kv: len(kv[1]) == 1):
        rows = sorted(rows, key=lambda r: r["length"])
        xs = [r["length"] for r in rows]
        ys = [r["ppl"] for r in rows]
        lo = [r["ci_low"] if r["ci_low"] is not None else r["ppl"] for r in rows]
        hi = [r["ci_high"] if r["ci_high"] is not None else r["ppl"] for r in rows]
        ys_all += ys + lo + hi
        strides = sorted({r["stride"] for r in rows})
        stride = (
            f", stride {strides[0]}"
            if len(strides) == 1
            else ", stride = window/2"
            if all(r["stride"] == max(1, r["window"] // 2) for r in rows)
            else ", strides " + "/".join(map(str, strides))
        )
        label = f"{model} ({method}" + (f"{stride})" if method == "sliding" else ")")
        color = colors[model]
        line, marker, filled = method_style(method)
        if len(rows) == 1:
            ax.errorbar(
                xs,
                ys,
                yerr=[[ys[0] - lo[0]], [hi[0] - ys[0]]],
                fmt="D" if method == "non-overlapping" else marker,
                color=color,
                markersize=9,
                markeredgecolor="black",
                markeredgewidth=1.2,
                capsize=4,
                elinewidth=1.2,
                zorder=10,
                label=label,
                clip_on=False,
            )
        else:
            ax.plot(
                xs,
                ys,
                linestyle=line,
                marker=marker,
                color=color,
                markersize=6 if filled else 5,
                markerfacecolor=color if filled else "white",
                label=label,
                zorder=3,
            )
            ax.fill_between(xs, lo, hi, color=color, alpha=0.10, linewidth=0, zorder=1)
    _plain_log2_x(ax, [r["length"] for r in report.rows])
    ax.set_yscale("log")
    ys_all = [y for y in ys_all if y is not None and y > 0 and math.isfinite(y)]
    if ys_all:
        _plain_log_y(ax, min(ys_all), max(ys_all))
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title(
        _wrap(
            f"Perplexity vs length ({report['data']['tokens']:,} tokens of {report['data']['spec']}; "
            "bands: 95% intervals)",
            90,
        ),
        fontsize=9,
    )
    ax.grid(True, which="major", alpha=0.3)
    fig.legend(loc="outside lower center", fontsize=7, ncol=1, frameon=False)
    return fig


def positions_figure(report):
    """Mean loss by position in the window, one line per (model, length): a shade per length within
    each model's colour family (darker = longer), a line style and marker per model; the legend is a
    column per model, below the axes."""
    _load()
    entries = report["loss_by_position"]
    models = list(dict.fromkeys(e["model"] for e in entries))
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    columns = []
    for k, model in enumerate(models):
        mine = sorted((e for e in entries if e["model"] == model), key=lambda e: e["length"])
        cmap = plt.get_cmap(_SHADES[k % len(_SHADES)])
        style, marker = _STYLES[k % len(_STYLES)], _MARKERS[k % len(_MARKERS)]
        column = [(Line2D([], [], linestyle="none"), _wrap(model, 40))]
        for i, e in enumerate(mine):
            shade = 0.9 if len(mine) == 1 else 0.45 + 0.5 * i / (len(mine) - 1)
            centers = [(a + b - 1) / 2 + 1 for a, b in zip(e["bucket_start"], e["bucket_end"])]  # 1 = the first token
            (line,) = ax.plot(
                centers,
                e["loss"],
                linestyle=style,
                marker=marker,
                markersize=3,
                linewidth=1.3,
                color=cmap(shade),
                label=f"{model} L={e['length']}",
            )
            column.append((line, f"L={e['length']:,}"))
        columns.append(column)
    # a block per model, padded to the same height; at most three columns of whole blocks (the legend
    # fills column by column)
    rows = max((len(c) for c in columns), default=0)
    ncol = min(len(columns), 3)
    per_column = -(-len(columns) // ncol) if columns else 0
    columns += [[]] * (ncol * per_column - len(columns))
    handles, labels = [], []
    for column in columns:
        column = column + [(Line2D([], [], linestyle="none"), "")] * (rows - len(column))
        handles += [h for h, _ in column]
        labels += [lab for _, lab in column]
    fig.set_figheight(max(4.5, 3.3 + 0.17 * rows * per_column))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,g}"))
    ax.set_xlabel("token's place in its window (1 = first; log-spaced buckets)")
    ax.set_ylabel("mean loss (nats)")
    ax.set_title("Loss by position (non-overlapping windows; L = window length)", fontsize=9)
    ax.grid(True, alpha=0.3)
    if handles:
        legend = fig.legend(
            handles,
            labels,
            loc="outside lower center",
            fontsize=7,
            ncol=ncol,
            frameon=False,
            handlelength=2.5,
            columnspacing=1.5,
        )
        headers = {_wrap(m, 40) for m in models}
        for text in legend.get_texts():
            if text.get_text() in headers:
                text.set_fontweight("bold")
    return fig


def passkey_figure(report):
    """One heatmap per model: accuracy over lengths (rows) x depths (columns); grey = not run (the
    legend says so, and so do the cells)."""
    return _retrieval_figure(report, "passkey", "Passkey retrieval", "depth of the key (0 = start)")


def recall_figure(report):
    """Recall's exact-match accuracy, drawn as passkey's."""
    s = report["settings"]["recall"]
    title = f"Recall: continue a {s['span']}-token random span from its first {s['cue']}"
    return _retrieval_figure(report, "recall", title, "depth of the span (0 = start)")


def _retrieval_figure(report, section: str, title: str, xlabel: str):
    _load()
    s = report["settings"][section]
    models = list(dict.fromkeys(r["model"] for r in report[section]))
    fig, axes = plt.subplots(
        1,
        len(models),
        figsize=(2.6 * len(models) + 1.6, 0.4 * len(s["lengths"]) + 2.6),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad=NOT_RUN_COLOR)
    any_not_run = False
    im = None
    for k, (ax, model) in enumerate(zip(axes[0], models)):
        grid = np.full((len(s["lengths"]), len(s["depths"])), np.nan)
        for r in report[section]:
            if r["model"] == model and r["accuracy"] is not None:
                grid[s["lengths"].index(r["length"]), s["depths"].index(r["depth"])] = r["accuracy"]
        im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(s["depths"])), [f"{d:g}" for d in s["depths"]])
        ax.set_yticks(range(len(s["lengths"])), [f"{L:,}" for L in s["lengths"]])
        ax.set_xlabel(xlabel, fontsize=8)
        if k == 0:
            ax.set_ylabel("length (tokens)")
        ax.set_title(_wrap(model, 26), fontsize=8)
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                v = grid[i, j]
                if np.isnan(v):
                    any_not_run = True
                    ax.text(j, i, "not run", ha="center", va="center", fontsize=6, color="dimgrey", style="italic")
                else:
                    ax.text(
                        j,
                        i,
                        f"{v:.0%}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if v < 0.2 or v > 0.85 else "black",
                    )
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.9, label="accuracy")
    fig.suptitle(_wrap(f"{title} ({s['trials']} trial{'s' * (s['trials'] != 1)} per cell)", 80), fontsize=9)
    if any_not_run:
        notes = [r.get("note") or "" for r in report[section] if r["accuracy"] is None]
        why = " (longer than the model accepts)" if notes and all("accepts at most" in n for n in notes) else ""
        fig.legend(
            [Patch(facecolor=NOT_RUN_COLOR, edgecolor="grey")],
            [f"not run{why}"],
            loc="outside lower center",
            fontsize=7,
            frameon=False,
        )
    return fig


def plot_ppl(report, path: Path) -> None:
    _save(ppl_figure(report), path)


def plot_positions(report, path: Path) -> None:
    _save(positions_figure(report), path)


def plot_passkey(report, path: Path) -> None:
    _save(passkey_figure(report), path)


def plot_recall(report, path: Path) -> None:
    _save(recall_figure(report), path)


def write_plots(report, out: Path) -> dict[str, Path]:
    """Write every plot the report has data for; {file name: path}."""
    wanted = (
        (run_folder.PLOT_PPL, report.rows, plot_ppl),
        (run_folder.PLOT_POSITIONS, report["loss_by_position"], plot_positions),
        (run_folder.PLOT_PASSKEY, report.data.get("passkey"), plot_passkey),
        (run_folder.PLOT_RECALL, report.data.get("recall"), plot_recall),
    )
    files = {}
    for name, has_data, plot in wanted:
        if has_data:
            files[name] = out / name
            plot(report, files[name])
    return files
