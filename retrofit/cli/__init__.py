"""The ``retrofit`` command line. One module per subcommand, registered in COMMANDS.

Each module defines ``add_parser(subparsers)`` (which sets ``func`` on its parser)
and does its work in that function. Exit codes:

    0  success
    1  unexpected failure (a bug: please report it)
    2  bad input: unknown scheme/option/key, wrong type, bad length, missing data
    3  unsupported architecture
    4  a patch did not take effect (nothing was saved)
    5  Hub precondition failed (no token, ...)
    130 interrupted
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ..errors import RetrofitError

# One line per subcommand: (name, module under retrofit.cli)
COMMANDS = [
    ("convert", "convert"),
    ("describe", "describe"),
    ("finetune", "finetune"),
    ("eval", "eval"),
    ("export", "export"),
    ("run", "run"),
    ("push", "push"),
    ("card", "card"),
]


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="retrofit",
        description="Swap the positional mechanism of a pretrained Hugging Face model, "
        "fine-tune it briefly, and evaluate it past its native length.",
        epilog="Exit codes: 0 ok, 1 bug, 2 bad input, 3 unsupported architecture, "
        "4 patch not live, 5 Hub precondition, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"retrofit {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for _name, mod in COMMANDS:
        importlib.import_module(f"{__name__}.{mod}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
        return int(rc or 0)
    except RetrofitError as e:
        print(f"retrofit {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"retrofit {args.command}: interrupted", file=sys.stderr)
        return 130


def parse_options(pairs: list[str] | None) -> dict:
    """``["theta=10000", "scaling=yarn"]`` -> dict, values parsed as YAML scalars."""
    from ..errors import OptionError
    from ..schema import parse_overrides

    return parse_overrides(pairs, error=OptionError)
