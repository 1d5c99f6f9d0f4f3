#!/usr/bin/env python
"""Pretraining throughput of a baseline preset's model on this machine: tokens/s of the real
training loop (``retrofit.training.standin.train``: AdamW, clipping, cosine schedule) on random token blocks,
for each precision x torch thread count, the variants run round after round in one process
(median tokens/s over the rounds). It tells how long ``pretrain(preset)`` will take before starting it.

    python research/bench_pretrain.py --presets study2-gpt2,study2-llama --out benchmarks/bench_pretrain.json
    python research/bench_pretrain.py --presets study --precisions fp32 --threads 1,2 --steps 4 --rounds 2
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import statistics
import sys
import time

import torch

from harness import command, stamp, write_record
from retrofit.models.standin import PRESETS, StandinConfig, build_model, get_config
from retrofit.training import standin


def time_steps(cfg: StandinConfig, model, blocks: torch.Tensor) -> float:
    """Seconds for ``cfg.steps`` steps of the baseline's own training loop."""
    t0 = time.perf_counter()
    standin.train(model, blocks, cfg)
    return time.perf_counter() - t0


def bench_preset(name: str, args) -> list[dict]:
    base = get_config(name)
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, base.vocab_size, (64 * base.batch_size, base.n_positions), generator=g)
    variants = [(p, t) for p in args.precisions for t in args.threads]
    times: dict[tuple, list[float]] = {v: [] for v in variants}
    n_params = None
    for r in range(args.rounds + 1):  # round 0 warms every variant up and is not counted
        for precision, threads in variants:
            cfg = dataclasses.replace(base, precision=precision, steps=args.steps, warmup_steps=1)
            torch.set_num_threads(threads)
            model = build_model(cfg, base.vocab_size, eos_token_id=0)
            n_params = sum(p.numel() for p in model.parameters())
            s = time_steps(cfg, model, blocks)
            if r:
                times[(precision, threads)].append(s)
            print(
                f"[bench_pretrain] {name} {precision} threads={threads} round {r}: {s:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    tokens = args.steps * base.batch_size * base.n_positions
    preset_tokens = base.steps * base.batch_size * base.n_positions
    rows = []
    for (precision, threads), ts in times.items():
        rate = tokens / statistics.median(ts)
        rows.append(
            {
                "preset": name,
                "arch": base.arch,
                "n_params": n_params,
                "precision": precision,
                "threads": threads,
                "tokens_per_step": base.batch_size * base.n_positions,
                "tokens_per_s": round(rate, 1),
                "seconds_per_round": [round(t, 3) for t in ts],
                "preset_steps": base.steps,
                "preset_tokens": preset_tokens,
                "estimated_pretrain_hours": round(preset_tokens / rate / 3600, 2),
            }
        )
    best = max(r["tokens_per_s"] for r in rows)
    for r in rows:
        r["vs_best"] = round(r["tokens_per_s"] / best, 3)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="study2-gpt2,study2-llama", help=f"comma list of {', '.join(PRESETS)}")
    p.add_argument("--precisions", default="fp32,bf16", help="comma list of fp32, bf16 (CPU autocast)")
    p.add_argument("--threads", default=f"1,{os.cpu_count()}", help="comma list of torch thread counts")
    p.add_argument("--steps", type=int, default=6, help="training steps per measurement")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (after one warm-up round)")
    p.add_argument("--out", default="benchmarks/bench_pretrain.json")
    args = p.parse_args(argv)
    args.precisions = args.precisions.split(",")
    args.threads = list(dict.fromkeys(int(t) for t in args.threads.split(",")))  # 1 core: "1,1" -> [1]
    logging.basicConfig(level=logging.WARNING)
    rows = []
    for name in args.presets.split(","):
        rows += bench_preset(name, args)
    result = {
        "benchmark": "bench_pretrain",
        "command": command(__file__, argv),
        "method": "standin.train on random blocks; variants interleaved round after round in one process, "
        "tokens/s = tokens per measurement / median seconds; round 0 is a warm-up",
        **stamp(),
        "rows": rows,
    }
    write_record(args.out, result)
    for r in rows:
        print(
            f"| {r['preset']} | {r['precision']} | {r['threads']} | {r['tokens_per_s']:.0f} tok/s "
            f"| {r['estimated_pretrain_hours']} h |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
