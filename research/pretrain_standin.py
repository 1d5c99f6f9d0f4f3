#!/usr/bin/env python
"""Pretrain (or find cached) the offline GPT-2 stand-in and print its pretrain_stats.json.

    python research/pretrain_standin.py --preset quickstart
    nice python research/pretrain_standin.py --preset study          # about 30 min on 2 CPU cores
    python research/pretrain_standin.py --preset study2-gpt2 --ship  # also copy it into standins/ (to commit)

A preset found in ``standins/`` (the repo's shipped stand-ins, checked against their SHA256SUMS) is copied
into the cache instead of being pretrained; ``--force`` pretrains anew.

The model folder is printed on stderr (log) and is ``stats["path"]`` in the printed JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from harness import STANDINS  # the shipped stand-ins, committed with the study
from retrofit.foundation.errors import RetrofitError
from retrofit.models.standin import PRESETS, load_stats, ship
from retrofit.training import standin


def main(argv: list[str] | None = None) -> int:
    """Parse args, pretrain, print the stats JSON (with the folder under "path")."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quickstart", choices=sorted(PRESETS))
    parser.add_argument(
        "--cache-dir", default=None, help="default: $RETROFIT_CACHE/baseline (~/.cache/retrofit/baseline)"
    )
    parser.add_argument("--force", action="store_true", help="retrain even if a cached copy exists")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's choice; 1 is faster on an oversubscribed machine)",
    )
    parser.add_argument(
        "--shipped",
        default=str(STANDINS),
        help="folder of shipped stand-ins to copy from before pretraining ('' = none; default: standins/)",
    )
    parser.add_argument(
        "--ship", action="store_true", help="copy the result into --shipped with a SHA256SUMS, so it can be committed"
    )
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    logging.basicConfig(
        level=logging.INFO, datefmt="%H:%M:%S", format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.ship and not args.shipped:
        parser.error("--ship needs a --shipped folder")
    try:
        path = standin.pretrain(args.preset, cache_dir=args.cache_dir, force=args.force, shipped=args.shipped or None)
        if args.ship:
            ship(path, args.shipped)
    except RetrofitError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(json.dumps({"path": str(path), **load_stats(path)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
