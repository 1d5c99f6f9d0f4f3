"""Kernel benchmark: forward time and peak memory of a GPT-2-small-shaped model (random weights),
stock SDPA against each converted scheme, inference and training step, at several lengths.

    python scripts/bench_kernel.py --out benchmarks/bench_kernel.json
    python scripts/bench_kernel.py --lengths 1024 --modes train --schemes alibi,rope

Each scheme runs in its own process so peak-memory readings don't leak between runs. Memory is
the peak over the measured step minus the memory before it: CUDA ``max_memory_allocated`` on a
GPU, else the process's peak RSS (VmHWM, reset through /proc/self/clear_refs). The measured
forward is the transformer body (no LM head: a 50k-vocab logits tensor would dominate and hide
the attention's cost). Targets (issue 2/3): time <= 1.15x stock at 1k, peak memory <= 1.3x stock at 8k.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path


def rss_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def rss_peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(fn, device) -> tuple[float, int]:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        reset_peak()
        base = rss_now()
    t = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t
    peak = (torch.cuda.max_memory_allocated() if device == "cuda" else rss_peak()) - base
    return elapsed, max(peak, 0)


def worker(args) -> dict:
    import torch
    import transformers as tf

    import retrofit

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = tf.GPT2Config(n_layer=args.layers, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
    model = tf.GPT2LMHeadModel(cfg).to(device)
    if args.scheme != "stock":
        retrofit.convert(model, args.scheme)
    body = model.transformer
    rows = []
    # two warm-up lengths: flex compiles once static, then once dynamic (no recompiles after that)
    warms = [torch.randint(0, 50257, (1, n), device=device) for n in (256, 320)]
    for mode in args.modes:
        model.train(mode == "train")
        for length in args.lengths:
            if args.scheme == "stock" and length > cfg.n_positions:
                # stock GPT-2 cannot index past its table: measure the stock attention with a table this long
                body.wpe = torch.nn.Embedding(length, 768).to(device)
            x = torch.randint(0, 50257, (1, length), device=device)

            def step():
                if mode == "train":
                    body(x).last_hidden_state.float().square().mean().backward()
                    model.zero_grad(set_to_none=True)
                else:
                    with torch.no_grad():
                        body(x)

            with torch.no_grad() if mode == "infer" else torch.enable_grad():
                for warm in warms:
                    body(warm)
            model.zero_grad(set_to_none=True)
            repeats = args.repeats if length <= 1024 else max(1, args.repeats // 3)
            times, peaks = [], []
            for _ in range(repeats):
                t, m = measure(step, device)
                times.append(t)
                peaks.append(m)
            path = retrofit.describe(model)["attention_path"] if args.scheme != "stock" else "sdpa-causal (stock)"
            rows.append({"scheme": args.scheme, "mode": mode, "length": length, "seconds": statistics.median(times),
                         "seconds_all": times, "peak_bytes": max(peaks), "attention_path": path})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"rows": rows}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schemes", default=None, help="comma list (default: stock + every registered scheme)")
    p.add_argument("--lengths", default="1024,4096,8192")
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="benchmarks/bench_kernel.json")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.modes = args.modes.split(",")
    if args.worker:
        args.scheme = args.worker
        print(json.dumps(worker(args)))
        return
    import retrofit

    schemes = args.schemes.split(",") if args.schemes else ["stock", *retrofit.schemes()]
    rows = []
    for scheme in schemes:
        for mode in args.modes:
            for length in args.lengths:  # one process per measurement: an OOM kills only that row
                cmd = [sys.executable, __file__, "--worker", scheme, "--lengths", str(length), "--modes", mode,
                       "--layers", str(args.layers), "--repeats", str(args.repeats)]
                print(f"[bench_kernel] {scheme} {mode} {length} ...", file=sys.stderr, flush=True)
                r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "RETROFIT_ATTENTION_PATH": "auto"})
                if r.returncode != 0:
                    why = "killed (out of memory)" if r.returncode in (-9, 137) else r.stderr.strip().splitlines()[-1:]
                    rows.append({"scheme": scheme, "mode": mode, "length": length, "error": str(why)})
                else:
                    rows += json.loads(r.stdout.strip().splitlines()[-1])["rows"]
                write(args, rows)
    print(markdown(write(args, rows)))


def write(args, rows) -> dict:
    import torch

    import retrofit

    rows = [dict(r) for r in rows]
    stock = {(r["mode"], r["length"]): r for r in rows if r["scheme"] == "stock" and "error" not in r}
    for r in rows:
        s = stock.get((r["mode"], r["length"]))
        if s and "error" not in r:
            r["time_vs_stock"] = round(r["seconds"] / s["seconds"], 3)
            r["memory_vs_stock"] = round(r["peak_bytes"] / s["peak_bytes"], 3) if s["peak_bytes"] else None
    result = {
        "benchmark": "bench_kernel",
        "model": f"GPT-2-small shape ({args.layers} layers, 768 dim, 12 heads), random weights, batch 1, body only",
        "hardware": {"device": "cuda" if torch.cuda.is_available() else "cpu", "cpu_count": os.cpu_count(),
                     "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
                     "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None},
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                     "retrofit": retrofit.__version__},
        "memory_measure": "cuda max_memory_allocated" if torch.cuda.is_available() else "peak RSS (VmHWM) delta",
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return result


def markdown(result) -> str:
    lines = ["| scheme | mode | length | seconds | x stock | peak MiB | x stock | path |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['scheme']} | {r['mode']} | {r['length']} | {r['error']} | | | | |")
            continue
        lines.append(f"| {r['scheme']} | {r['mode']} | {r['length']} | {r['seconds']:.2f} | {r.get('time_vs_stock', '')} "
                     f"| {r['peak_bytes'] / 2**20:.0f} | {r.get('memory_vs_stock', '')} | {r['attention_path']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
