"""Denormals in the biased kernels: do they carry weight, and what does flushing them cost or save?

Per scheme and length, a GPT-2-small-shaped body (random weights, batch 1) converted to the scheme runs one
train step (forward, loss, backward) three ways: retrofit's scoped flush (``retrofit.kernels.denormal``, the
default), no flush (``RETROFIT_FLUSH_DENORMAL=0``), and a step-wide ``torch.set_flush_denormal(True)``
around the whole step (the calling thread only, as torch sets it). Recorded: max |difference| of the output
and of every gradient between the flushed and unflushed runs (relative to the largest value), and the
seconds of each (stock, unconverted, beside them: the ratios are read in one process, repeat after repeat).

    OMP_NUM_THREADS=1 python research/measure_denormal.py --out benchmarks/measure_denormal.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import retrofit
from harness import command, stamp, write_record


def build(scheme: str, layers: int, length: int):
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.GPT2Config(
        n_layer=layers,
        n_embd=768,
        n_head=12,
        n_positions=max(1024, length),
        vocab_size=50257,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )
    model = tf.GPT2LMHeadModel(cfg)
    if scheme != "stock":
        retrofit.convert(model, scheme)
    model.train()
    return model


def step(model, x, how: str):
    """One train step: (output, {name: grad}, seconds). how: scoped | off | step-wide."""
    os.environ["RETROFIT_FLUSH_DENORMAL"] = "0" if how in ("off", "step-wide") else "1"
    model.zero_grad(set_to_none=True)
    t = time.perf_counter()
    if how == "step-wide":
        torch.set_flush_denormal(True)
    try:
        out = model.transformer(x).last_hidden_state
        out.float().square().mean().backward()
    finally:
        if how == "step-wide":
            torch.set_flush_denormal(False)
        os.environ["RETROFIT_FLUSH_DENORMAL"] = "1"
    seconds = time.perf_counter() - t
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, seconds


def kernel_ab(rounds: int) -> dict:
    """One attention call alone (12 heads of 64, 2,048 tokens, forward and backward), flushed and not,
    alternately: the median, min and max of the per-round ratio flushed / not (the first round untimed)."""
    from retrofit import kernel
    from retrofit.kernels import denormal
    from retrofit.scheme.alibi import alibi_slopes

    torch.manual_seed(0)
    H, T, D = 12, 2048, 64
    slopes = torch.tensor(alibi_slopes(H))
    band = torch.zeros(H, 129)
    band[:, :128] = torch.linspace(0, -40, 128)  # a steep distance table flat past 128 (the band kernel)
    q, k, v = (torch.randn(1, H, T, D, requires_grad=True) for _ in range(3))
    calls = {
        "alibi (fused-alibi)": dict(slopes=slopes, bias=lambda h, i, j: -slopes[h] * (i - j)),
        "steep band (fused-band)": dict(band=band, bias=lambda h, i, j: band[h, (i - j).clamp(max=128)]),
    }
    out = {}
    for name, kw in calls.items():
        ratios = []
        for r in range(rounds + 1):
            t = {}
            for flag in ("1", "0"):
                os.environ["RETROFIT_FLUSH_DENORMAL"] = flag
                t0 = time.perf_counter()
                o, _ = denormal.attend(kernel.attend, q, k, v, scaling=D**-0.5, kernel="auto", **kw)
                o.square().sum().backward()
                t[flag] = time.perf_counter() - t0
            os.environ["RETROFIT_FLUSH_DENORMAL"] = "1"
            if r:
                ratios.append(t["1"] / t["0"])
        out[name] = {
            "flushed_over_not_median": round(statistics.median(ratios), 3),
            "min": round(min(ratios), 3),
            "max": round(max(ratios), 3),
            "rounds": rounds,
        }
        print(name, json.dumps(out[name]), file=sys.stderr, flush=True)
    return out


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default="alibi,t5,fire")
    ap.add_argument("--lengths", default="2048,4096,8192")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="timed repeats per way (after one untimed warm-up; 0: the differences only)",
    )
    ap.add_argument("--append", action="store_true", help="add the rows to --out's")
    ap.add_argument(
        "--kernel-rounds",
        type=int,
        default=0,
        help="also time one attention call alone, flushed and not, this many rounds ('kernel_ab')",
    )
    ap.add_argument("--out", default="benchmarks/measure_denormal.json")
    args = ap.parse_args(argv)
    old = json.loads(Path(args.out).read_text()) if args.append and Path(args.out).exists() else {}
    rows, args.kernel_ab = old.get("rows", []), old.get("kernel_ab")
    if args.kernel_rounds:
        args.kernel_ab = kernel_ab(args.kernel_rounds)
        write(args, rows)
    for length in [int(n) for n in args.lengths.split(",") if n]:
        x = torch.randint(0, 50257, (1, length))
        stock = build("stock", args.layers, length) if args.repeats else None
        for scheme in args.schemes.split(","):
            model = build(scheme, args.layers, length)
            ways = ("scoped", "off", "step-wide")
            first = {how: step(model, x, how) for how in ways}  # warm-up, and the outputs compared
            if args.repeats:
                step(stock, x, "off")
            times = {how: [] for how in (*ways, "stock")}
            for _ in range(args.repeats):
                for how in ways:
                    times[how].append(step(model, x, how)[2])
                times["stock"].append(step(stock, x, "off")[2])
            on, off = first["scoped"], first["off"]
            row = {
                "scheme": scheme,
                "length": length,
                "kernel": retrofit.describe(model)["last_kernel"],
                "output_max_rel_diff_flush_vs_not": rel_diff(on[0], off[0]),
                "grad_max_rel_diff_flush_vs_not": max(rel_diff(on[1][n], off[1][n]) for n in off[1]),
                "layers": args.layers,
            }
            if args.repeats:
                row["seconds"] = {how: round(statistics.median(t), 3) for how, t in times.items()}
                row["x_stock"] = {
                    how: round(statistics.median([a / b for a, b in zip(t, times["stock"])]), 3)
                    for how, t in times.items()
                    if how != "stock"
                }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            write(args, rows)
    return 0


def write(args, rows):
    result = {
        "benchmark": "measure_denormal",
        "command": command(__file__),
        "setup": f"GPT-2-small shape, {args.layers} layers, random weights, batch 1, fp32, one train step "
        "(body output, mean square loss, backward); ways timed alternately with stock, "
        f"median of {args.repeats} repeats; diffs from the warm-up step of each way",
        **stamp(),
        "rows": rows,
        "kernel_ab": args.kernel_ab,
    }
    write_record(args.out, result)


if __name__ == "__main__":
    raise SystemExit(main())
