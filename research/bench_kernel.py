"""Kernel benchmark: forward time and peak memory of a GPT-2-small-shaped model (random weights),
stock SDPA against each converted scheme, inference and training step, at several lengths.

    python research/bench_kernel.py --out benchmarks/bench_kernel.json
    python research/bench_kernel.py --lengths 1024 --modes train --schemes alibi,alibi+scale_bias --memory-lengths ''
    python research/bench_kernel.py --schemes alibi,t5 --lengths 2048 --memory-lengths '' --flush-denormal both
    python research/bench_kernel.py --body llama --schemes self_extend,string --lengths 8192 --modes infer \
        --memory-lengths '' --out benchmarks/kernel_table/two_view.json   # against the plain RoPE forward

``--body llama``: a LLaMA body of SmolLM2-135M's width (576 wide, 9 heads, 3 KV heads, native 4,096), its
variants SelfExtend or STRING read at twice native (``rope`` with ``extension`` and ``factor 2``), stock the
unconverted model (the plain RoPE forward).

Time: stock and every variant in one process, each variant's step between two stock steps (``bracketed``): the
ratio is the median of the per-repeat ratios to the two stock steps around it, its quartiles recorded beside.
Memory: each variant in its own process so peak-memory readings don't leak between runs. Memory is
the peak over the measured step minus the memory before it: CUDA ``max_memory_allocated`` on a
GPU, else the process's peak RSS (VmHWM, reset through /proc/self/clear_refs; glibc malloc set to
mmap every block over 64 KiB and trim the heap top on every free, so the reading repeats). The measured
forward is the transformer body (no LM head: a 50k-vocab logits tensor would dominate and hide
the attention's cost). Targets (issue 12): ALiBi train <= 1.10x, inference <= 1.05x at 1k/2k/8k,
memory <= 1.1x; T5/Shaw/FIRE inference <= 1.5x, train <= 1.6x at 2k, memory at 8k <= 1.3x.
``--flush-denormal``: ``on`` (retrofit's default: denormals flushed around the biased kernels,
``retrofit.kernels.denormal``), ``off`` (``RETROFIT_FLUSH_DENORMAL=0``), ``both`` (each variant twice, the second
named ``VARIANT/flush-off``). Stock is never flushed. The JSON records the CPU (``retrofit.foundation.versions.cpu_info``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from harness import bracketed, command, stamp, write_record


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


def build(variant: str, args):
    """A GPT-2-small-shaped model, random weights seeded alike for every variant; ``variant`` is
    ``stock`` or ``scheme[+flag...]`` (flags: boolean scheme options set true, e.g. alibi+scale_bias)."""
    import torch
    import transformers as tf

    import retrofit

    torch.manual_seed(0)
    variant = variant.split("/")[0]  # VARIANT/flush-off: the same model, timed without the flush
    if args.body == "llama":
        return build_llama(variant, args)
    drop = args.dropout
    cfg = tf.GPT2Config(
        n_layer=args.layers,
        n_embd=768,
        n_head=12,
        n_positions=max(1024, max(args.lengths)),
        vocab_size=50257,
        attn_pdrop=drop,
        resid_pdrop=drop,
        embd_pdrop=drop,
    )
    model = tf.GPT2LMHeadModel(cfg)
    if variant != "stock":
        scheme, *flags = variant.split("+")
        retrofit.convert(model, scheme, **{f: True for f in flags})
    return model


LLAMA = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3)


def build_llama(variant: str, args):
    """The LLaMA body (``LLAMA``, native 4,096, random weights); ``variant`` stock or a two-view extension
    (self_extend, string) read at twice native."""
    import transformers as tf

    import retrofit

    cfg = tf.LlamaConfig(**LLAMA, num_hidden_layers=args.layers, max_position_embeddings=4096, vocab_size=49152)
    model = tf.LlamaForCausalLM(cfg)
    if variant != "stock":
        retrofit.convert(model, "rope", extension=variant, factor=2.0)
    return model


def make_step(model, mode, x, flush=True):
    import torch

    body = model.base_model
    model.train(mode == "train")

    def step():
        if not flush:
            os.environ["RETROFIT_FLUSH_DENORMAL"] = "0"
            try:
                return unflushed()
            finally:
                os.environ["RETROFIT_FLUSH_DENORMAL"] = "1"
        return unflushed()

    def unflushed():
        if mode == "train":
            body(x).last_hidden_state.float().square().mean().backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                body(x)

    return step


def saved_bytes(step) -> int:
    """Bytes autograd keeps for backward during one training step (unique storages of every tensor saved
    by the forward): the activation memory, free of the allocator noise a peak-RSS reading carries. Graphs
    built inside the backward (a kernel that rebuilds one block's bias under autograd to reach its
    parameters) are transient, one block at a time, and are not counted."""
    import torch

    storages = {}

    def pack(t):
        if torch._C._current_graph_task_id() != -1:  # inside the backward
            return t
        try:
            st = t.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
        except (RuntimeError, NotImplementedError):
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(storages.values())


def kernel_of(model, variant):
    import retrofit

    return retrofit.describe(model)["last_kernel"] if variant != "stock" else "sdpa (stock)"


def worker(args) -> dict:
    """Time: stock and every variant in this one process, each variant between two stock steps, repeat after
    repeat (``bracketed``: a shared machine's load hits them alike); the ratio is the median of the per-repeat
    ratios. Memory (--memory VARIANT): one variant per process, one measured step after the warm-up."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.flush_denormal == "off":
        os.environ["RETROFIT_FLUSH_DENORMAL"] = "0"
    timed = [*args.variants, *(v + "/flush-off" for v in args.variants if args.flush_denormal == "both")]
    variants = [args.memory] if args.memory else ["stock", *timed]
    models = {v: build(v, args).to(device) for v in variants}
    rows = []
    for mode in args.modes:
        for length in args.lengths:
            vocab = models["stock"].config.vocab_size if "stock" in models else 49152
            x = torch.randint(0, vocab, (1, length), device=device)
            steps = {}
            for v, m in models.items():
                flush = not v.endswith("/flush-off")
                steps[v] = make_step(m, mode, x, flush)
                for n in (256, 320):  # warm-up: flex compiles once static, then once dynamic
                    make_step(m, mode, torch.randint(0, vocab, (1, n), device=device), flush)()
                steps[v]()
            repeats = 1 if args.memory else (args.repeats if length <= 2048 else max(2, args.repeats // 2))
            if args.memory:
                peaks = {args.memory: [measure(steps[args.memory], device)[1]]}
            else:
                times, ratios = bracketed(steps, repeats, lambda f: measure(f, device)[0])
            for v, m in models.items():
                row = {
                    "variant": v,
                    "mode": mode,
                    "length": length,
                    "kernel": kernel_of(m, v),
                    "flush_denormal": v != "stock" and not v.endswith("/flush-off") and args.flush_denormal != "off",
                }
                if args.memory:
                    row["peak_bytes"] = max(peaks[v])
                    if mode == "train":
                        row["saved_for_backward_bytes"] = saved_bytes(steps[v])
                else:
                    row.update(seconds=statistics.median(times[v]), seconds_all=times[v])
                    if v != "stock":
                        row["time_vs_stock"] = round(statistics.median(ratios[v]), 3)
                        row["ratios"] = [round(r, 4) for r in ratios[v]]
                        if len(ratios[v]) >= 4:  # the spread of the per-repeat ratios: quartiles
                            q = statistics.quantiles(ratios[v], n=4)
                            row["time_vs_stock_quartiles"] = [round(q[0], 3), round(q[2], 3)]
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return {"rows": rows}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--schemes",
        default="alibi,alibi+scale_bias,t5,shaw,fire",
        help="comma list of variants: scheme or scheme+flag (a boolean option set true)",
    )
    p.add_argument("--lengths", default="1024,2048,8192", help="lengths timed ('' = none: memory only)")
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per model (halved past 2k)")
    p.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="GPT-2's dropouts (0: the fused kernels; >0 sends stock CPU SDPA to its O(N^2) math path)",
    )
    p.add_argument("--memory-lengths", default="8192", help="lengths whose peak memory is measured ('' = none)")
    p.add_argument("--memory-layers", type=int, default=None, help="layers for the memory runs (default --layers)")
    p.add_argument(
        "--flush-denormal",
        choices=("on", "off", "both"),
        default="on",
        help="denormals flushed around the biased kernels (retrofit's default), not, or each variant both ways",
    )
    p.add_argument("--body", choices=("gpt2", "llama"), default="gpt2", help="the model body (see above)")
    p.add_argument(
        "--malloc",
        choices=("default", "steady"),
        default="default",
        help="glibc malloc for the timed steps: its defaults, or STEADY_MALLOC (freed memory kept, no page re-faulted)",
    )
    p.add_argument("--out", default="benchmarks/bench_kernel.json")
    p.add_argument("--memory", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.variants = args.schemes.split(",")
    args.lengths = [int(x) for x in args.lengths.split(",") if x]
    args.modes = args.modes.split(",")
    if args.worker:
        print(json.dumps(worker(args)))
        return
    common = ["--schemes", args.schemes, "--dropout", str(args.dropout), "--flush-denormal", args.flush_denormal]
    common += ["--body", args.body]
    args.load = {"before": [round(x, 2) for x in os.getloadavg()]}
    rows = []
    for mode in args.modes:
        for length in args.lengths:  # one process per (mode, length): an OOM kills only that row
            rows += run_worker(
                args,
                [
                    *common,
                    "--lengths",
                    str(length),
                    "--modes",
                    mode,
                    "--layers",
                    str(args.layers),
                    "--repeats",
                    str(args.repeats),
                ],
                f"time {mode} {length}",
            )
            write(args, rows)
    mem_layers = args.memory_layers or args.layers
    for length in [int(x) for x in args.memory_lengths.split(",") if x]:
        for mode in args.modes:
            for v in ["stock", *args.variants]:
                rows += run_worker(
                    args,
                    [*common, "--lengths", str(length), "--modes", mode, "--layers", str(mem_layers), "--memory", v],
                    f"memory {v} {mode} {length}",
                )
                write(args, rows)
    print(markdown(write(args, rows)))


# glibc's defaults hand large freed blocks back to the OS or keep them by heuristics that shift between
# runs: the same stock step read 431-855 MB peak RSS. Every allocation above 64 KiB through mmap and
# a trim on every free (MALLOC_TRIM_THRESHOLD_=0) make the reading repeat to within 1 MB.
MEMORY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
# Timing (--malloc steady): by default the same step re-faulted 0-50k pages (up to 200 MB) from one repeat to the
# next, as glibc's shifting threshold sent its large buffers to fresh mmaps or trimmed them; the steps' spread
# followed, and a kernel that frees differently moved the faults of the layers around it. Every block from the
# heap (no mmap at all: a threshold caps at 32 MiB, under an 8k step's MLP buffers), never trimmed: after the
# warm-up each step reuses the same pages (docs/results.md, "Round 12").
STEADY_MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def run_worker(args, argv, what) -> list[dict]:
    print(f"[bench_kernel] {what} ...", file=sys.stderr, flush=True)
    timing = STEADY_MALLOC if args.malloc == "steady" else {}
    env = {**os.environ, **(MEMORY_MALLOC if "--memory" in argv else timing)}
    r = subprocess.run([sys.executable, __file__, "--worker", *argv], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        why = "killed (out of memory)" if r.returncode in (-9, 137) else r.stderr.strip().splitlines()[-1:]
        return [{"what": what, "error": str(why)}]
    return json.loads(r.stdout.strip().splitlines()[-1])["rows"]


def write(args, rows) -> dict:
    import torch

    rows = [dict(r) for r in rows]
    mem_stock = {
        (r["mode"], r["length"]): r["peak_bytes"] for r in rows if r.get("variant") == "stock" and "peak_bytes" in r
    }
    saved_stock = {
        (r["mode"], r["length"]): r["saved_for_backward_bytes"]
        for r in rows
        if r.get("variant") == "stock" and "saved_for_backward_bytes" in r
    }
    for r in rows:
        s = mem_stock.get((r.get("mode"), r.get("length")))
        if "peak_bytes" in r and s:
            r["memory_vs_stock"] = round(r["peak_bytes"] / s, 3)
        s = saved_stock.get((r.get("mode"), r.get("length")))
        if "saved_for_backward_bytes" in r and s:
            r["saved_vs_stock"] = round(r["saved_for_backward_bytes"] / s, 3)
    gpt2 = (
        f"GPT-2-small shape ({args.layers} layers for time, {args.memory_layers or args.layers} for memory; 768 wide, "
    )
    llama = f"LLaMA shape ({args.layers} layers; 576 wide, 9 heads, 3 KV heads, native 4,096; SmolLM2-135M's width, "
    result = {
        "benchmark": "bench_kernel",
        "command": command(__file__),
        "model": (llama if args.body == "llama" else gpt2 + "12 heads), ")
        + f"random weights, batch 1, body only, dropout {args.dropout}",
        # 1, 5 and 15 minute load averages when the run started and as this record was written: a shared machine
        "load_average": {**getattr(args, "load", {}), "now": [round(x, 2) for x in os.getloadavg()]},
        "method": "time: each variant's step between two stock steps in one process (variants' order reversed every "
        "other repeat), ratio = median over repeats of its time / the mean of the two stock steps around it; "
        "memory: one variant per process, peak over one step minus the memory before it",
        "time_malloc": "glibc malloc with " + " ".join(f"{k}={v}" for k, v in STEADY_MALLOC.items())
        if args.malloc == "steady"
        else "glibc malloc's defaults",
        **stamp(),
        "memory_measure": "cuda max_memory_allocated"
        if torch.cuda.is_available()
        else "peak RSS (VmHWM) delta, glibc malloc with " + " ".join(f"{k}={v}" for k, v in MEMORY_MALLOC.items()),
        "rows": rows,
    }
    result["hardware"].update(
        device="cuda" if torch.cuda.is_available() else "cpu",
        gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        flush_denormal_option=args.flush_denormal,
    )
    write_record(args.out, result)
    return result


def markdown(result) -> str:
    lines = [
        "| variant | mode | length | seconds | x stock | peak MiB | x stock | kernel |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['what']} | | | {r['error']} | | | | |")
        elif "peak_bytes" in r:
            saved = f" (saved for backward x{r['saved_vs_stock']})" if "saved_vs_stock" in r else ""
            lines.append(
                f"| {r['variant']} | {r['mode']} | {r['length']} | | | {r['peak_bytes'] / 2**20:.0f} "
                f"| {r.get('memory_vs_stock', '')}{saved} | {r['kernel']} |"
            )
        else:
            lines.append(
                f"| {r['variant']} | {r['mode']} | {r['length']} | {r['seconds']:.3f} "
                f"| {r.get('time_vs_stock', 1.0)} | | | {r['kernel']} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
