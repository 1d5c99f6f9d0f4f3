"""Throughput of a LoRA fine-tune step: converted (alibi, rope, t5) vs the unconverted model.

A GPT-2-small-shaped model (12 layers, 768 wide, 12 heads, vocab 50257, random weights: the speed
does not depend on them), LoRA r=8 on the gpt2 default targets (the fine-tune's own wrapping,
``retrofit.training.model.make_trainable``), batch 1, AdamW, one forward + backward + step per
block. Variants run interleaved, round after round, so that a shared machine's load hits all of
them alike; the reported figure is the median over rounds of tokens/s.

    OMP_NUM_THREADS=2 python scripts/bench_finetune.py --length 1024 --rounds 3 --steps 2
    -> benchmarks/bench_finetune.json
    python scripts/bench_finetune.py --attention-dropout 0 --out benchmarks/bench_finetune_nodropout.json

Target: every converted variant >= 0.85x the unconverted model's tokens/s.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from retrofit.versions import cpu_info  # noqa: E402  (the CPU every figure was measured on)


def build(scheme: str | None, args):
    from transformers import GPT2Config, GPT2LMHeadModel

    import retrofit
    from retrofit.training import model as mdl
    from retrofit.training.recipe import TrainConfig

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=args.heads, vocab_size=50257,
                     n_positions=max(1024, args.length), attn_pdrop=args.attention_dropout)
    model = GPT2LMHeadModel(cfg)
    if scheme is not None:
        retrofit.convert(model, scheme)
    model.train()
    train = TrainConfig()
    train.lora.r, train.lora.alpha = 8, 16
    model = mdl.make_trainable(model, train)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, opt


def step(model, opt, ids) -> float:
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per variant per round")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--schemes", default="none,alibi,rope,t5,fire")
    ap.add_argument("--attention-dropout", type=float, default=0.1,
                    help="attn_pdrop of every variant, the unconverted one included (GPT-2 ships 0.1; under it the "
                         "bias paths other than ALiBi's run chunked on CPU, stock SDPA its math path)")
    ap.add_argument("--out", default="benchmarks/bench_finetune.json")
    args = ap.parse_args(argv)

    names = args.schemes.split(",")
    ids = torch.randint(0, 50257, (1, args.length), generator=torch.Generator().manual_seed(0))
    models = {n: build(None if n == "none" else n, args) for n in names}
    for n in names:  # warm-up (allocator, first-call paths)
        for _ in range(args.warmup):
            step(*models[n], ids)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names:
            dt = sum(step(*models[n], ids) for _ in range(args.steps)) / args.steps
            times[n].append(dt)
            print(f"round {r + 1}/{args.rounds} {n:>6}: {args.length / dt:8.1f} tokens/s", flush=True)

    import retrofit

    base = args.length / statistics.median(times["none"]) if "none" in times else None
    rows = {}
    for n in names:
        tps = args.length / statistics.median(times[n])
        paths = None
        if n != "none":
            paths = retrofit.describe(models[n][0].get_base_model()).get("attention_paths")
        rows[n] = {"tokens_per_s": round(tps, 1), "seconds_per_step": round(statistics.median(times[n]), 3),
                   "ratio_to_unconverted": round(tps / base, 3) if base else None,
                   "per_round_tokens_per_s": [round(args.length / t, 1) for t in times[n]], "attention_path": paths}
    result = {
        "benchmark": "LoRA fine-tune step (forward + backward + AdamW), batch 1",
        "model": {"layers": args.layers, "width": args.width, "heads": args.heads, "vocab": 50257},
        "length": args.length, "lora_r": 8, "attention_dropout": args.attention_dropout,
        "command": "python scripts/bench_finetune.py " + " ".join(argv if argv is not None else sys.argv[1:]), "rounds": args.rounds, "steps_per_round": args.steps,
        "target_ratio": 0.85, "results": rows,
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "cuda": torch.cuda.is_available(), **cpu_info()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| scheme | tokens/s | x unconverted | attention path |\n|---|---:|---:|---|")
    for n, row in rows.items():
        print(f"| {n} | {row['tokens_per_s']} | {row['ratio_to_unconverted']} | {', '.join(row['attention_path'] or ['stock'])} |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
