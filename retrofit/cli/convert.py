"""``retrofit convert MODEL --to SCHEME --out DIR``."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from ..errors import RetrofitError

log = logging.getLogger(__name__)


def _scheme_help() -> str:
    from ..encodings import SCHEMES
    from ..encodings.base import common_option_help

    lines = ["schemes and their options (--option key=value):"]
    for name, cls in SCHEMES.items():
        lines.append(f"  {name} ({cls.kind})")
        for key, text in cls.option_help().items():
            lines.append(f"      {key}: {text}")
    lines.append("  every scheme also takes:")
    lines += [f"      {key}: {text}" for key, text in common_option_help().items()]
    from ..adapters import ADAPTERS

    lines.append("architectures: " + "; ".join(f"{n} ({', '.join(c.model_types)})" for n, c in ADAPTERS.items()))
    return "\n".join(lines)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "convert",
        help="swap a model's positional mechanism and save the patched checkpoint",
        description="Load MODEL (hub id, local folder or GGUF), replace its positional mechanism with SCHEME, "
        "verify the patch is live, and save it (safetensors) to --out. Reload it with retrofit.load(OUT).",
        epilog=_scheme_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="hub id (gpt2) or local folder; with --gguf-file, the folder holding it")
    p.add_argument("--to", required=True, metavar="SCHEME", help="the new positional scheme (see below)")
    p.add_argument("--out", required=True, help="output folder (written atomically)")
    p.add_argument("--gguf-file", help="GGUF file name inside MODEL (or a path to it)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="scheme option, repeatable")
    p.add_argument("--dtype", default=None, help="load dtype: float32, bfloat16, float16, auto")
    p.add_argument("--kernel", default="auto", choices=["auto", "fused", "flex", "chunked"], help="attention path for bias schemes")
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    p.set_defaults(func=run)


def run(args) -> int:
    from .. import core, io
    from . import parse_options

    options = parse_options(args.option)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise RetrofitError(f"{out} exists and is not empty; pass --overwrite to replace it")
    from ..encodings import SCHEMES

    SCHEMES.get(args.to)  # fail on an unknown scheme before loading anything
    model, tokenizer = io.load_model(args.model, gguf_file=args.gguf_file, dtype=args.dtype)
    core.convert(model, args.to, kernel=args.kernel, **options)
    io.save(model, out, tokenizer=tokenizer)
    print(json.dumps({"out": str(out), **core.describe(model)}, indent=2, sort_keys=True))
    return 0
