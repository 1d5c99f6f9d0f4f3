"""``retrofit push RUN_DIR --repo user/name``: upload the model, card, report and plots to the Hub."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "push",
        help="upload a run's weights, config, tokenizer, card, report and plots to the Hugging Face Hub",
        description="Upload RUN_DIR's model (the native export if there is one, else the retrofit checkpoint: "
        "final/ of a fine-tune, or the folder retrofit convert wrote), tokenizer, model card (README.md, rendered "
        "for the repo from what the folder holds unless it was edited by hand), eval report and plots. Never the optimizer state, checkpoints or logs. "
        "The token comes from HF_TOKEN or the login cache (`hf auth login`).",
    )
    p.add_argument(
        "run_dir",
        help="a folder written by retrofit convert (--out), retrofit finetune or retrofit run "
        "(output_dir; its final/ model)",
    )
    p.add_argument("--repo", required=True, help="Hub repo id, user/name")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--revision", default="main", help="branch to push to (default main)")
    p.add_argument(
        "--dry-run", action="store_true", help="list what would be uploaded, with sizes; call nothing and write nothing"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..publishing.hub import format_plan, push, token_source

    if args.dry_run:
        result = push(args.run_dir, args.repo, private=args.private, revision=args.revision, dry_run=True)
        print(
            f"dry run: would upload to {args.repo}@{args.revision} ({'private' if args.private else 'public'}; "
            f"{result['weights']} weights; token: {token_source()}):"
        )
        print(format_plan(result["files"]))
        return 0
    result = push(args.run_dir, args.repo, private=args.private, revision=args.revision)
    print(
        f"pushed {len(result['files'])} files to https://huggingface.co/{args.repo} ({args.revision}): "
        f"{result['commit_url']}"
    )
    return 0
