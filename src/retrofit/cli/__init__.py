"""The ``retrofit`` command line. One module per subcommand, registered in COMMANDS.

Each module defines ``add_parser(subparsers)`` (which sets ``func`` on its parser)
and does its work in that function. Exit codes:

    0  success
    1  unexpected failure (a bug: please report it)
    2  bad input: unknown scheme/option/key, wrong type, bad length, missing data
    3  unsupported architecture
    4  a patch did not take effect (nothing was saved)
    5  Hub precondition failed (no token, Hub unreachable, ...)
    130 interrupted

Building the parser imports no torch (``retrofit --help`` is instant): a subcommand's long epilog
(scheme options, recipe keys) is a function, run only when that help is printed.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from ..foundation.errors import RetrofitError

# One line per subcommand: (name, module under retrofit.cli)
COMMANDS = [
    ("convert", "convert"),
    ("describe", "describe"),
    ("finetune", "finetune"),
    ("eval", "eval"),
    ("export", "export"),
    ("run", "run"),
    ("study", "study"),
    ("push", "push"),
    ("card", "card"),
]


ARGV: list[str] = []  # the command line being parsed (``retrofit convert --help --to SCHEME`` reads it)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose epilog may be a function, called when the help is printed."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    from ..foundation.catalog import schemes_help
    from ..foundation.versions import __version__

    parser = Parser(
        prog="retrofit",
        description="Swap the positional mechanism of a pretrained Hugging Face model, "
        "fine-tune it briefly, and evaluate it past its native length.",
        epilog=schemes_help() + "\n\nexit codes: 0 ok, 1 bug (please report it), 2 bad input, 3 unsupported "
        "architecture, 4 patch not live, 5 Hub precondition, 130 interrupted.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"retrofit {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="debug logging, and the library messages retrofit otherwise keeps quiet",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for _name, mod in COMMANDS:
        importlib.import_module(f"{__name__}.{mod}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..foundation.quiet import configure, hushed

    parser = build_parser()
    ARGV[:] = attach_dash_values(sys.argv[1:] if argv is None else argv)  # what a help epilog may read
    args = parser.parse_args(ARGV)
    configure(args.verbose)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with hushed():
            rc = args.func(args)
        return int(rc or 0)
    except RetrofitError as e:
        print(f"retrofit {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"\nretrofit {args.command}: interrupted", file=sys.stderr)
        return 130


_DASH_VALUE = re.compile(r"^-[\d.]")


def attach_dash_values(argv: list[str]) -> list[str]:
    """``--lengths -128,256`` -> ``--lengths=-128,256``. argparse takes a word starting with '-' for an
    option unless it is one plain negative number; attached, the option's own check says what is wrong."""
    out: list[str] = []
    for i, word in enumerate(argv):
        if word == "--":
            return out + argv[i:]
        if out and _DASH_VALUE.match(word) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def output_folder(path, overwrite: bool, flag: str = "--out"):
    """The Path of an output folder to be written, checked before any work: a folder that can be created
    or written into, empty unless ``overwrite`` (True for commands that write into an existing one)."""
    from pathlib import Path

    from ..foundation.atomic import check_creatable
    from ..foundation.errors import OutputError

    out = Path(path)
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise OutputError(f"{flag} {out} exists and is not empty; pass --overwrite to replace it")
    check_creatable(out, flag)
    return out


def check_scheme(name: str) -> None:
    """An unknown scheme name is an error (exit 2) at once: the torch-free catalog (``foundation/catalog.py``)."""
    from ..foundation.catalog import entry

    entry(name)


def parse_options(pairs: list[str] | None) -> dict:
    """``["theta=10000", "scaling=yarn"]`` -> dict, values parsed as YAML scalars."""
    from ..foundation.errors import OptionError
    from ..foundation.schema import parse_overrides

    return parse_overrides(pairs, error=OptionError)
