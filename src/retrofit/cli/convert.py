"""``retrofit convert MODEL --to SCHEME --out DIR``."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from ..foundation.errors import OptionError
from ..foundation.run_folder import CALIBRATE
from ..training.recipe import CalibrateConfig

CAL = CalibrateConfig()  # the calibration defaults (one place: the recipe's convert.calibrate section)
log = logging.getLogger(__name__)


HELP_FILE = Path(__file__).with_name("convert_help.txt")  # kernels_and_architectures() as text: help without torch


def _help_text() -> str:
    """The epilog of ``retrofit convert --help``: the catalog, the attention kernels, the architectures and the
    built-in names, without importing torch (the kernels and architectures from ``HELP_FILE``, which
    ``write_help_file`` writes from the tables and ``tests/cli/test_fast.py`` holds to them); with ``--to SCHEME``
    also that scheme's options (``scheme_help``)."""
    from ..foundation.catalog import CATALOG, schemes_help
    from . import ARGV as argv

    asked = argv[argv.index("--to") + 1] if "--to" in argv[:-1] else None
    asked = next((a.split("=", 1)[1] for a in argv if a.startswith("--to=")), asked)
    if asked in CATALOG:
        return scheme_help(asked)
    return f"{schemes_help()}\n{HELP_FILE.read_text().rstrip()}\n{_builtin_help()}"


def kernels_and_architectures() -> str:
    """The attention kernels (``kernels.KERNELS``) and the architectures (the adapters), from the tables (imports
    torch)."""
    from .. import kernels
    from ..models.sources import supported_architectures

    arch = (
        "architectures: " + supported_architectures() + "; and by structure any decoder of the LLaMA layout that "
        "passes the lossless probe (docs/support.md)"
    )
    return f"{kernels.help_text()}\n{arch}"


def write_help_file() -> Path:
    """Write ``HELP_FILE`` from the tables (after a kernel or an adapter is added)."""
    from ..foundation.atomic import write_text

    return write_text(HELP_FILE, kernels_and_architectures() + "\n")


def scheme_help(only: str | None = None) -> str:
    """The schemes (``only``: that one) with their options, the attention kernels, the architectures and the built-in
    names, from the registries (imports torch)."""
    from ..scheme import SCHEMES
    from ..scheme.base import common_option_help

    lines = ["schemes and their options (--option key=value):"]
    for name, cls in SCHEMES.items():
        if only is not None and name != only:
            continue
        lines.append(f"  {name} ({cls.kind})")
        for key, text in cls.option_help().items():
            lines.append(f"      {key}: {text}")
    lines.append("  every scheme also takes:")
    lines += [f"      {key}: {text}" for key, text in common_option_help().items()]
    lines.append(kernels_and_architectures())
    lines.append(_builtin_help())
    return "\n".join(lines)


def _kernel(name: str) -> str:
    """--kernel: a choice of the kernel table (``retrofit.kernels``), by its current name ("auto", the default,
    is checked without importing the table: argparse checks the default too)."""
    if name == "auto":
        return name
    from .. import kernels

    try:
        return kernels.check(name)
    except OptionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _builtin_help() -> str:
    import textwrap

    from ..models.builtin import names

    return textwrap.fill(
        "built-in models (MODEL; made on first use, then cached): " + ", ".join(names()),
        width=100,
        subsequent_indent="  ",
        break_on_hyphens=False,
    )


def add_parser(sub) -> None:
    p = sub.add_parser(
        "convert",
        help="swap a model's positional mechanism and save the patched checkpoint",
        description="Load MODEL (hub id, local folder or GGUF), replace its positional mechanism with SCHEME, "
        "verify the patch is live, and save it (safetensors) to --out. Reload it with retrofit.load(OUT).",
        epilog=_help_text,  # called when --help is printed
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "model",
        help="hub id (gpt2), local folder or built-in name (see below); with --gguf-file, the folder holding it",
    )
    p.add_argument("--to", required=True, metavar="SCHEME", help="the new positional scheme (see below)")
    p.add_argument("--out", required=True, help="output folder (written atomically)")
    p.add_argument("--gguf-file", help="GGUF file name inside MODEL (or a path to it)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="scheme option, repeatable")
    p.add_argument("--dtype", default=None, help="load dtype: float32, bfloat16, float16, auto")
    p.add_argument(
        "--kernel",
        default="auto",
        type=_kernel,
        metavar="KERNEL",
        help="attention kernel: auto picks per call (recorded in describe), or one of the kernels "
        "listed below (saved with the checkpoint)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    p.add_argument(
        "--force", action="store_true", help="convert a retrofit checkpoint again (its scheme is reverted first)"
    )
    c = p.add_argument_group("calibration (train only the new position parameters to match the original first)")
    c.add_argument(
        "--calibrate",
        metavar="DATA",
        help="data spec (shakespeare:train, stdlib, files, a datasets name): before saving, train only the "
        "scheme's position parameters for KL to the original on native-length blocks of DATA; "
        f"writes {CALIBRATE} with the ratio to the original at 1x before and after",
    )
    c.add_argument(
        "--calibrate-steps", type=int, default=CAL.steps, metavar="N", help="optimizer steps (default %(default)s)"
    )
    c.add_argument(
        "--calibrate-lr",
        type=float,
        default=CAL.learning_rate,
        metavar="LR",
        help="Adam peak learning rate (default %(default)s)",
    )
    c.add_argument(
        "--calibrate-batch-size",
        type=int,
        default=CAL.batch_size,
        metavar="N",
        help="blocks per step (default %(default)s)",
    )
    c.add_argument(
        "--calibrate-heldout",
        default=CAL.heldout,
        metavar="DATA",
        help="held-out data spec for the before/after ratio; must share no document with DATA (default %(default)s)",
    )
    c.add_argument(
        "--calibrate-budget",
        type=int,
        default=CAL.budget,
        metavar="TOKENS",
        help="held-out tokens scored before and after (default %(default)s)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..models.sources import precheck
    from . import check_scheme, output_folder, parse_options

    options = parse_options(args.option)
    out = output_folder(args.out, args.overwrite)
    check_scheme(args.to)  # the cheap checks first: a wrong word is said before torch is imported
    precheck(args.model, args.gguf_file)
    from ..models import io
    from ..models.sources import sentence_transformers_source
    from ..patch import conversion

    model, tokenizer = io.load_model(args.model, gguf_file=args.gguf_file, dtype=args.dtype)
    _refuse_converted(model, args)
    teacher = _teacher(model, args) if args.calibrate else None
    conversion.convert(model, args.to, kernel=args.kernel, force=args.force, **options)
    record = _calibrate(model, teacher, tokenizer, args) if args.calibrate else None
    del teacher
    io.save(model, out, tokenizer=tokenizer, source=sentence_transformers_source(args.model, args.gguf_file))
    shown = {"out": str(out), **conversion.describe(model)}
    if record is not None:
        from ..foundation.atomic import write_text

        write_text(out / CALIBRATE, json.dumps(record, indent=2) + "\n")
        shown["calibration"] = {k: v for k, v in record.items() if k != "kl"}
    print(json.dumps(shown, indent=2, sort_keys=True))
    return 0


def _teacher(model, args):
    """The frozen original the calibration matches (a converted checkpoint given with --force: reloaded, reverted)."""
    from ..training.model import make_teacher
    from ..training.recipe import ModelConfig

    return make_teacher(model, ModelConfig(name_or_path=args.model, gguf_file=args.gguf_file, dtype=args.dtype))


def _calibrate(model, teacher, tokenizer, args) -> dict:
    from ..training.calibrate import calibrate, check_calibratable, summary_line

    check_calibratable(model)
    if tokenizer is None:
        from ..foundation.errors import OptionError

        raise OptionError(f"--calibrate needs a tokenizer; {args.model} has none")
    section = CalibrateConfig(
        data=args.calibrate,
        steps=args.calibrate_steps,
        learning_rate=args.calibrate_lr,
        batch_size=args.calibrate_batch_size,
        heldout=args.calibrate_heldout,
        budget=args.calibrate_budget,
    )
    record = calibrate(model, teacher, section, tokenizer=tokenizer)
    log.info("%s", summary_line(record))
    return record


def _refuse_converted(model, args) -> None:
    from ..foundation.errors import AlreadyConvertedError
    from ..patch.conversion import describe, is_converted

    if is_converted(model) and not args.force:
        raise AlreadyConvertedError(
            f"{args.model} is already converted to {describe(model)['scheme']!r}; pass --force to revert that and "
            f"convert it to {args.to!r}"
        )
