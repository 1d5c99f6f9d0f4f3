"""``retrofit eval MODEL``: perplexity vs length with baselines, loss by position, passkey, recall, cost."""

from __future__ import annotations

import argparse
import codecs
import logging
from pathlib import Path

from ..errors import OptionError
from ..evaluation import defaults as D
from ..evaluation.lengths import parse_list
from ..quiet import progress_bars

log = logging.getLogger(__name__)


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise OptionError(f"{what} must be comma-separated numbers, got {text!r}") from None


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
        help="evaluate a model past its native length (perplexity, passkey, recall, cost) against baselines",
        description="Score MODEL and every --baseline on exactly the same tokens at each length: non-overlapping "
        "windows and sliding windows (stride --stride). A baseline past its own limit gets only the sliding row, "
        "labelled as such. Writes report.json, report.md and plots to --out.",
    )
    p.add_argument("model", help="retrofit checkpoint, run folder (its final/ model), local folder, hub id, or a .gguf file")
    p.add_argument("--gguf-file", help="GGUF file name inside MODEL (or a path to it)")
    p.add_argument("--lengths", default=None, type=_lengths("--lengths"),
                   help="comma-separated token counts or multiples of the model's native length "
                   f"(e.g. 1024,2048,4096 or 1x,2x,16x; default {','.join(D.LENGTHS)}, up to the model's limit)")
    p.add_argument("--data", default=D.DATA,
                   help="'stdlib', 'shakespeare[:heldout]', UTF-8 text files/folders/globs, or a datasets "
                   "name[:config[:split[:field]]] "
                   "(default: stdlib)")
    p.add_argument("--doc-separator", metavar="TEXT",
                   help="join documents with this text instead of EOS (escapes allowed: '\\n\\n' for wikitext rows)")
    p.add_argument("--baseline", action="append", default=[], metavar="MODEL",
                   help="a model to score on the same tokens (repeatable); 'original': the unconverted model MODEL "
                   "was converted from (read from its run's recipe or its config's retrofit block), as in recipes")
    p.add_argument("--budget", type=int, default=D.BUDGET, help="tokens scored per length (default %(default)s)")
    p.add_argument("--stride", type=int, default=None,
                   help="sliding-window stride (default: half of each sliding window)")
    p.add_argument("--no-sliding", action="store_true",
                   help="skip sliding rows where a model runs the length plainly "
                   "(baselines past their limit keep theirs)")
    p.add_argument("--batch-size", type=int, default=D.BATCH_SIZE, help="windows per forward pass (default %(default)s)")
    p.add_argument("--buckets", type=int, default=D.POSITION_BUCKETS,
                   help="log-spaced position buckets for loss by position (default %(default)s)")
    p.add_argument("--passkey", action="store_true", help="also run passkey retrieval")
    p.add_argument("--passkey-lengths", type=_lengths("--passkey-lengths"), help="comma-separated (default: --lengths)")
    p.add_argument("--passkey-depths", default=",".join(f"{d:g}" for d in D.PASSKEY_DEPTHS),
                   help="comma-separated, in [0, 1] (default %(default)s)")
    p.add_argument("--passkey-trials", type=int, default=D.PASSKEY_TRIALS,
                   help="trials per (length, depth) (default %(default)s)")
    p.add_argument("--recall", action="store_true",
                   help="also run recall: a random span of --recall-span tokens sits at each depth of the eval text, "
                   "its first --recall-cue tokens repeat at the end, the model must continue with the rest "
                   "(any --recall-* option turns it on)")
    p.add_argument("--recall-lengths", type=_lengths("--recall-lengths"), help="comma-separated (default: --lengths)")
    p.add_argument("--recall-depths", help="comma-separated, in [0, 1] (default "
                   f"{','.join(f'{d:g}' for d in D.RECALL_DEPTHS)})")
    p.add_argument("--recall-trials", type=int, help=f"trials per (length, depth) (default {D.RECALL_TRIALS})")
    p.add_argument("--recall-span", type=int, help=f"tokens in the random span (default {D.RECALL_SPAN})")
    p.add_argument("--recall-cue", type=int,
                   help=f"the span's first tokens repeated at the end, fewer than --recall-span (default {D.RECALL_CUE})")
    p.add_argument("--seed", type=int, default=D.SEED, help="passkey and recall seed (default %(default)s)")
    p.add_argument("--device", help="e.g. cuda, cpu (default: where the model loads)")
    p.add_argument("--dtype", help="float32, bfloat16, float16 or auto")
    p.add_argument("--out", help="output folder (default: MODEL/eval for a local folder, else eval-NAME)")
    p.add_argument("--no-plots", action="store_true", help="write report.json and report.md only")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar (so does RETROFIT_PROGRESS=0 for every command)")
    p.set_defaults(func=run)


def _baselines(args) -> list:
    """``--baseline`` values; ``original`` becomes the model MODEL was converted from, loaded and unconverted
    (what a recipe's ``baselines: [original]`` scores)."""
    from ..run_folder import original_source

    out = []
    for b in args.baseline:
        if b != "original":
            out.append(b)
            continue
        src = original_source(args.model) if Path(args.model).exists() else None
        if src is None:
            raise OptionError(f"--baseline original: {args.model} records no model it was converted from (no "
                              "run recipe, no retrofit block in its config); name that model instead: --baseline NAME")
        from ..pipeline import load_original

        log.info("--baseline original: %s", src["name_or_path"])
        out.append(load_original(src["name_or_path"], gguf_file=src["gguf_file"], dtype=args.dtype or src["dtype"],
                                 device=args.device))
    return out


def _recall_options(args) -> dict:
    """``evaluate``'s recall keywords: the defaults (``evaluation.defaults``) where an option is not given."""
    given = {"lengths": args.recall_lengths, "trials": args.recall_trials, "span": args.recall_span,
             "cue": args.recall_cue,
             "depths": _floats(args.recall_depths, "--recall-depths") if args.recall_depths is not None else None}
    opts = {f"recall_{k}": v for k, v in given.items() if v is not None}
    return {"recall": args.recall or bool(opts), **opts}


def run(args) -> int:
    from ..evaluation import evaluate
    from ..evaluation.markdown import ppl_table
    from ..run_folder import eval_dir
    from . import output_folder

    out = output_folder(args.out or eval_dir(args.model), overwrite=True,  # reports in it are replaced
                        flag="--out" if args.out else "the default --out")
    report = evaluate(
        args.model,
        args.lengths,
        data=args.data,
        gguf_file=args.gguf_file,
        doc_separator=codecs.decode(args.doc_separator, "unicode_escape") if args.doc_separator else None,
        baselines=_baselines(args),
        budget=args.budget,
        stride=args.stride,
        sliding=not args.no_sliding,
        batch_size=args.batch_size,
        position_buckets=args.buckets,
        passkey=args.passkey,
        passkey_lengths=args.passkey_lengths,
        passkey_depths=_floats(args.passkey_depths, "--passkey-depths"),
        passkey_trials=args.passkey_trials,
        **_recall_options(args),
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        progress=not args.no_progress and progress_bars(),
    )
    report.save(out, plots=not args.no_plots)
    print(ppl_table(report))
    print(f"\nwrote {out / 'report.json'}, {out / 'report.md'}" + ("" if args.no_plots else " and plots"))
    return 0
