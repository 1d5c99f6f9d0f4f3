"""``retrofit describe MODEL`` and ``retrofit describe --list``."""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser(
        "describe",
        help="show a model's positional mechanism, or list schemes and architectures",
        description="Print, as JSON, what MODEL uses now (scheme, options, native mechanism, max length). "
        "With --list, print the registered schemes and architectures.",
    )
    p.add_argument("model", nargs="?", help="hub id or local folder (a retrofit checkpoint is re-patched)")
    p.add_argument("--gguf-file", help="GGUF file name inside MODEL")
    p.add_argument("--list", action="store_true", help="list schemes and architectures")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..foundation.errors import RetrofitError
    from ..models import io
    from ..patch import conversion

    if args.list:
        from ..adapters import ADAPTERS
        from ..scheme import SCHEMES

        info = {
            "schemes": {n: {"kind": c.kind, "options": c.option_help()} for n, c in SCHEMES.items()},
            "architectures": {n: list(c.model_types) for n, c in ADAPTERS.items()},
        }
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    if not args.model:
        raise RetrofitError("give a MODEL, or --list")
    model, _ = io.load_model(args.model, gguf_file=args.gguf_file, tokenizer=False)
    print(json.dumps(conversion.describe(model), indent=2, sort_keys=True, default=str))
    return 0
