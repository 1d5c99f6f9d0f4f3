"""Throughput of a LoRA fine-tune step, every scheme vs the unconverted model, with dropout as shipped.

A GPT-2-small-shaped model (12 layers, 768 wide, 12 heads, vocab 50257, random weights: the speed
does not depend on them) with GPT-2's own dropouts (``attn_pdrop`` 0.1), LoRA r=8 on the gpt2 default
targets (the fine-tune's own wrapping, ``retrofit.training.model.make_trainable``), batch 1, AdamW, one
forward + backward + step per block. The attention dropout is the fine-tune's default
(``train.attention_dropout``, set by ``retrofit.training.model.set_attention_dropout`` as the loop does):
a converted model trains without it; the unconverted model keeps GPT-2's 0.1 (as the continued-training
control does), and ``none-nodrop`` is the unconverted model without it, for a like-for-like kernel
comparison. Variants run interleaved, round after round, so that a shared machine's load hits all of
them alike; the reported figure is the median over rounds of tokens/s.

    OMP_NUM_THREADS=1 python research/bench_finetune.py --length 1024 --rounds 3 --steps 2
    -> benchmarks/bench_finetune.json
    python research/bench_finetune.py --attention-dropout 0.1 --out /tmp/with-dropout.json   # keep GPT-2's 0.1

Target: every converted variant >= 0.85x the unconverted model's tokens/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness import command, stamp, write_record

UNCONVERTED = {"none": 0.1, "none-nodrop": 0.0}  # the unconverted variants and their attn_pdrop


def build(name: str, args):
    """A variant's model and optimizer; the attention dropout each one trains with."""
    from transformers import GPT2Config, GPT2LMHeadModel

    import retrofit
    from retrofit.training.model import make_trainable, set_attention_dropout
    from retrofit.training.recipe import TrainConfig

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=args.layers,
        n_embd=args.width,
        n_head=args.heads,
        vocab_size=50257,
        n_positions=max(1024, args.length),
        attn_pdrop=UNCONVERTED.get(name, 0.1),
    )
    model = GPT2LMHeadModel(cfg)
    train = TrainConfig()
    train.lora.r, train.lora.alpha = 8, 16
    if args.attention_dropout is not None:
        train.attention_dropout = args.attention_dropout
    dropout = cfg.attn_pdrop
    if name not in UNCONVERTED:
        retrofit.convert(model, name)
        dropout = set_attention_dropout(model, train)
        dropout = cfg.attn_pdrop if dropout is None else dropout
    model.train()
    model = make_trainable(model, train)
    model.attention_dropout_used = dropout
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
    ap.add_argument("--schemes", default="none,none-nodrop,alibi,rope,t5,shaw,fire,xl,nezha,nope,sinusoidal")
    ap.add_argument(
        "--attention-dropout",
        type=float,
        default=None,
        help="train.attention_dropout of the converted variants (default: the fine-tune's, 0; "
        "0.1 keeps GPT-2's, under which the bias kernels other than ALiBi's run chunked on CPU)",
    )
    ap.add_argument("--out", default="benchmarks/bench_finetune.json")
    args = ap.parse_args(argv)

    names = args.schemes.split(",")
    ids = torch.randint(0, 50257, (1, args.length), generator=torch.Generator().manual_seed(0))
    models = {n: build(n, args) for n in names}
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

    base = {u: args.length / statistics.median(times[u]) for u in UNCONVERTED if u in times}
    rows = {}
    for n in names:
        tps = args.length / statistics.median(times[n])
        ran = None
        if n not in UNCONVERTED:
            ran = retrofit.describe(models[n][0].get_base_model()).get("kernels")
        rows[n] = {
            "tokens_per_s": round(tps, 1),
            "seconds_per_step": round(statistics.median(times[n]), 3),
            "attention_dropout": models[n][0].attention_dropout_used,
            "ratio_to_unconverted": round(tps / base["none"], 3) if "none" in base else None,
            "ratio_to_unconverted_nodrop": round(tps / base["none-nodrop"], 3) if "none-nodrop" in base else None,
            "per_round_tokens_per_s": [round(args.length / t, 1) for t in times[n]],
            "kernels": ran,
        }
    result = {
        "benchmark": "LoRA fine-tune step (forward + backward + AdamW), batch 1",
        "model": {"layers": args.layers, "width": args.width, "heads": args.heads, "vocab": 50257},
        "length": args.length,
        "lora_r": 8,
        "attention_dropout": args.attention_dropout,
        "unconverted": "none: GPT-2's attn_pdrop 0.1 kept (an unconverted fine-tune); none-nodrop: 0",
        "command": command(__file__, argv),
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "target_ratio": 0.85,
        "results": rows,
        **stamp(),
    }
    result["hardware"]["cuda"] = torch.cuda.is_available()
    out = write_record(args.out, result)
    print(
        "\n| scheme | attention dropout | tokens/s | x unconverted | x unconverted, no dropout | kernel |\n"
        "|---|---:|---:|---:|---:|---|"
    )
    for n, row in rows.items():
        print(
            f"| {n} | {row['attention_dropout']} | {row['tokens_per_s']} | {row['ratio_to_unconverted']} | "
            f"{row['ratio_to_unconverted_nodrop']} | {', '.join(row['kernels'] or ['stock'])} |"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
