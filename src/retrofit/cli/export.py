"""``retrofit export RUN_DIR --native --out DIR``."""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a converted model as a native transformers architecture (no retrofit needed to load it)",
        description="Export RUN_DIR (a retrofit checkpoint, or a run folder holding final/) to --out. With --native, "
        "the weights are mapped into an architecture transformers already has (Falcon for GPT-2+ALiBi with "
        "scale_bias=true, GPT-NeoX for GPT-2+RoPE, the same architecture for NoPE/sinusoidal/extend tables and rescaled "
        "RoPE), so plain AutoModelForCausalLM.from_pretrained(OUT) loads it; the logits are checked against the "
        "patched model and the result is printed as JSON and written to OUT/retrofit_export.json. Without "
        "--native, the retrofit format is written (load it with retrofit.load).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="retrofit checkpoint folder, or a run folder with final/")
    p.add_argument("--out", required=True, help="output folder (written atomically)")
    p.add_argument("--native", action="store_true", help="map into a native transformers architecture")
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="longest input of the exported model where the architecture has a table "
        "(NoPE/sinusoidal/extend; default: the model's reach if finite (extend: its table), else "
        "max(8192, 4 x native))",
    )
    p.add_argument(
        "--check-length",
        type=int,
        default=None,
        help="tokens of the random-input equivalence check (default min(4 x native, native + 1024))",
    )
    p.add_argument(
        "--approximate",
        action="store_true",
        help="where no architecture is exact, write the closest one anyway (gpt2+alibi with "
        "scale_bias=false -> Falcon); the result says exact: false, why, and the perplexity difference",
    )
    p.add_argument(
        "--ppl-text",
        default=None,
        help="text (a retrofit data spec) for the perplexity difference of an inexact export "
        "(default: retrofit.export's, the standard library)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..native_export import export
    from . import output_folder

    out = output_folder(args.out, args.overwrite)
    given = {"ppl_text": args.ppl_text} if args.ppl_text else {}  # else export's own default
    result = export(
        args.run_dir,
        out,
        native=args.native,
        max_length=args.max_length,
        check_length=args.check_length,
        approximate=args.approximate,
        **given,
    )
    print(json.dumps(result, indent=2, sort_keys=True, default=str))
    return 0
