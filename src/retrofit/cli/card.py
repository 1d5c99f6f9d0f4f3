"""``retrofit card RUN_DIR``: (re)write the model card of a run folder."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "card",
        help="write a run's model card (README.md) from its recipe and eval report",
        description="Render the model card of RUN_DIR (Hub metadata, budget, eval tables and plots, how to load, "
        "limits) from run.yaml/recipe.yaml, summary.json and eval/report.json.",
    )
    p.add_argument("run_dir", help="a run folder (retrofit run's output_dir)")
    p.add_argument("--out", help="where to write the card (default RUN_DIR/README.md)")
    p.add_argument("--template", help="a Jinja template instead of the bundled model_cards/model_card.md.j2")
    p.add_argument("--print", dest="show", action="store_true", help="print the card instead of writing it")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..publishing.cards import render_card, write_card

    if args.show:
        print(render_card(args.run_dir, args.template), end="")
        return 0
    print(write_card(args.run_dir, args.out, args.template))
    return 0
