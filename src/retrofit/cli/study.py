"""``retrofit study GRID``: which scheme for my model, at what budget? A grid of pipeline runs with the control."""

from __future__ import annotations

import argparse


def _keys_help() -> str:
    from ..study.grid import help_text

    return (
        "grid keys (YAML):\n" + help_text() + "\n\nexamples:\n"
        "  retrofit study recipes/study-tiny.yaml\n"
        "  retrofit study my-grid.yaml --out runs/my-study --rerun 'alibi-*'\n"
        "  retrofit study my-grid.yaml --set budgets=[0,200,800] --set seeds=[0,1,2]"
    )


def add_parser(sub) -> None:
    p = sub.add_parser(
        "study",
        help="a grid of schemes x budgets x methods x seeds against the continued-training control: "
        "the cheapest budget per scheme, seeds, retrieval, a plot",
        description="Run every cell of the grid (each a `retrofit run` of the grid's recipe with the cell's keys set, "
        "cached in OUT/cells/<cell>/), beside the continued-training control (the unconverted model fine-tuned on "
        "the same tokens) and the original, then write OUT/study.json, OUT/study.md (every cell, the cheapest "
        "budget per scheme that meets the target, the seeds, passkey/recall) and OUT/ppl_vs_length.png. Running "
        "it again reuses every finished cell and resumes the others (see docs/study.md).",
        epilog=_keys_help,  # called when --help is printed
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("grid", help="study grid YAML (see recipes/study-tiny.yaml)")
    p.add_argument("--out", default=None, help="the study folder (default: the grid's output_dir, runs/<grid name>)")
    p.add_argument(
        "--rerun",
        action="append",
        default=[],
        metavar="PATTERN",
        help="recompute the cells whose name matches (shell pattern, repeatable): --rerun 'alibi-*'",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a grid key, value parsed as YAML (repeatable): --set budgets=[0,100]",
    )
    p.add_argument("--check", action="store_true", help="validate the grid, list its cells, and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    import time

    from ..study import Grid, cells, run_study
    from ..study.run import PLOT, REPORT, REPORT_MD

    grid = Grid.from_yaml(args.grid, args.overrides)
    if args.check:
        for c in cells(grid):
            print(c["name"], " ".join(c["overrides"]))
        return 0
    t0 = time.perf_counter()
    out = run_study(grid, out=args.out, rerun=args.rerun)
    print((out / REPORT_MD).read_text())
    print(f"retrofit study: done in {time.perf_counter() - t0:.0f} s; {out / REPORT}, {out / REPORT_MD}, {out / PLOT}")
    return 0
