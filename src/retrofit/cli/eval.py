"""``retrofit eval MODEL``: perplexity vs length with baselines, loss by position, passkey, recall, cost."""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import logging
import typing
from pathlib import Path

from ..data.longdoc import listed as longdoc_tasks
from ..evaluation.lengths import parse_list
from ..evaluation.options import DEFAULTS, NAMES, ORIGINAL, QUICK, EvalOptions
from ..foundation.errors import OptionError
from ..foundation.quiet import progress_bars
from ..foundation.run_folder import REPORT, REPORT_MD

log = logging.getLogger(__name__)


def _floats(what: str):
    """An argparse ``type``: ``0,0.5,1`` -> ``[0.0, 0.5, 1.0]``."""

    def parse(text: str) -> list[float]:
        try:
            return [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be comma-separated numbers, got {text!r}") from None

    return parse


def _lengths(what: str):
    """An argparse ``type``: ``1x,2x,4096`` -> ``["1x", "2x", 4096]``, the parser recipes use."""

    def parse(text: str) -> list:
        try:
            return parse_list(text, what)
        except OptionError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{what}: ")) from None

    return parse


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a model past its native length (perplexity, passkey, recall, cost; a classifier's or "
        "embedding model's long-document task) against baselines",
        description="Score MODEL and every --baseline on exactly the same tokens at each length: non-overlapping "
        "windows and sliding windows (stride --stride). A baseline past its own limit gets only the sliding row, "
        "labelled as such. Writes report.json, report.md and plots to --out. A classifier or an embedding model "
        "(a run with task: classification or embedding, or such a checkpoint) is scored on its task instead: "
        f"accuracy or retrieval top-1 on long documents (--data {longdoc_tasks()}, or records), reading whole against --baseline original truncated at its native length "
        "and over native-size chunks (docs/encoders.md).",
    )
    p.add_argument(
        "model", help="retrofit checkpoint, run folder (its final/ model), local folder, hub id, or a .gguf file"
    )
    p.add_argument("--gguf-file", help="GGUF file name inside MODEL (or a path to it)")
    p.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="MODEL",
        help="a model to score on the same tokens (repeatable); 'original': the unconverted model MODEL "
        "was converted from (read from its run's recipe or its config's retrofit block), as in recipes",
    )
    add_option_flags(p)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a lighter evaluation for a CPU: "
        + ", ".join(f"{k}={_show(v)}" for k, v in QUICK.items())
        + " (flags given as well win)",
    )
    p.add_argument("--device", help="e.g. cuda, cpu (default: where the model loads)")
    p.add_argument("--dtype", help="float32, bfloat16, float16 or auto")
    p.add_argument(
        "--out",
        help="output folder (default: MODEL/eval for a local folder of yours, else eval-NAME here: a Hub id, a "
        ".gguf file, a shipped folder with a SHA256SUMS or a read-only one)",
    )
    p.add_argument("--no-plots", action="store_true", help="write report.json and report.md only")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="hide the progress bar (so does RETROFIT_PROGRESS=0 for every command)",
    )
    p.set_defaults(func=run)


def flag(f: dataclasses.Field) -> str:
    """The command-line flag of an ``EvalOptions`` field."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _show(v) -> str:
    return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) if isinstance(v, (list, tuple)) else str(v)


def add_option_flags(p) -> None:
    """One flag per ``EvalOptions`` field, its help and default read from the field. A flag not given
    leaves the attribute unset (``argparse.SUPPRESS``), so ``run`` passes only what the user gave."""
    hints = typing.get_type_hints(EvalOptions)
    for f in dataclasses.fields(EvalOptions):
        name, tp, default = flag(f), hints[f.name], getattr(DEFAULTS, f.name)
        kw = {"dest": f.name, "default": argparse.SUPPRESS}
        shown = (
            "off" if default is False else "on" if default is True else "none" if default is None else _show(default)
        )
        text = f.metadata["help"] + ("" if f.name == "data" else f" (default: {shown})")  # data: its help says
        if tp is bool:
            kw["action"] = "store_false" if name.startswith("--no-") else "store_true"
            text = (
                f"{f.metadata['help']} On by default; this flag leaves it out."
                if name.startswith("--no-")
                else f.metadata["help"]
            )
        elif f.name.endswith(("lengths", "distances")):
            kw["type"], kw["metavar"] = _lengths(name), "LIST"
        elif f.name.endswith("depths"):
            kw["type"], kw["metavar"] = _floats(name), "LIST"
        elif int in (tp, *typing.get_args(tp)):
            kw["type"], kw["metavar"] = int, "N"
        elif f.name == "doc_separator":
            kw["metavar"] = "TEXT"
        p.add_argument(name, help=text.replace("%", "%%"), **kw)


def _baselines(args) -> list:
    """``--baseline`` values as ``retrofit.evaluate`` takes them; ``original`` is the model MODEL was converted
    from, loaded and unconverted (what a recipe's ``baselines: [original]`` scores; resolved by ``evaluate``)."""
    return list(args.baseline)


def _options(args) -> dict:
    """``evaluate``'s option keywords: the flags given (the rest keep ``EvalOptions``' defaults); any
    ``--recall-*`` option turns recall on, any ``--passkey-*`` option passkey."""
    given = {
        **(QUICK if getattr(args, "quick", False) else {}),
        **{k: getattr(args, k) for k in NAMES if hasattr(args, k)},
    }
    for measure in ("recall", "passkey"):
        if any(k.startswith(f"{measure}_") for k in given):
            given[measure] = True
    if given.get("doc_separator"):
        given["doc_separator"] = codecs.decode(given["doc_separator"], "unicode_escape")
    return given


def precheck(args) -> None:
    """What can be said of MODEL and each --baseline before torch is imported: a missing path (a run folder
    reads as its final/ model), a folder that is not a model, a Hub id neither cached nor reachable; and what
    MODEL's config rules out (``evaluation.preflight``: a task model's data, lengths past a converted limit)."""
    from ..evaluation import preflight
    from ..evaluation.options import eval_options
    from ..foundation.run_folder import model_dir
    from ..models.sources import precheck as check

    for name in [args.model, *(b for b in args.baseline if b != ORIGINAL)]:
        gguf = args.gguf_file if name is args.model else None
        check(str(model_dir(name)) if Path(name).is_dir() and not gguf else name, gguf)  # "./x" stays a path
    given = _options(args)
    preflight.check(args.model, eval_options(**given), default_lengths="lengths" not in given)


def _say_out(args, out: Path) -> None:
    """A model folder not written into (``run_folder.kept_as_is``): where the report goes instead, said first."""
    from ..foundation.run_folder import kept_as_is

    why = None if args.out or not Path(args.model).is_dir() else kept_as_is(Path(args.model))
    if why:
        print(f"{args.model}: {why}, so the report goes to {out}/ (--out chooses another folder)", flush=True)


def run(args) -> int:
    precheck(args)  # the cheap checks first: a missing model is said at once
    from ..evaluation import evaluate
    from ..evaluation.markdown import ppl_table
    from ..foundation.run_folder import eval_dir
    from . import output_folder

    out = output_folder(
        args.out or eval_dir(args.model),
        overwrite=True,  # reports in it are replaced
        flag="--out" if args.out else "the default --out",
    )
    _say_out(args, out)
    report = evaluate(
        args.model,
        gguf_file=args.gguf_file,
        baselines=_baselines(args),
        **_options(args),
        device=args.device,
        dtype=args.dtype,
        progress=not args.no_progress and progress_bars(),
    )
    report.save(out, plots=not args.no_plots)
    print(report.table() if hasattr(report, "table") else ppl_table(report))  # a masked LM's, a task's: their own
    plots = (report.data.get("plots") or []) if not args.no_plots else []  # a task's report draws none
    print(f"\nwrote {out / REPORT}, {out / REPORT_MD}" + (" and plots" if plots else ""))
    return 0
