"""Transformer-XL's causal square, forward alone: the CPU flash op with v zero-padded to the score width (what
``sdpa-relative-dims`` ran before kernel round 10) against the kernel's own blocks at v's width
(``_CausalSquare``), paired in one process (each route between two readings of the other), one thread, the
GPT-2-small head shape (12 heads of 64, the XL dims 64 wide: q and k 128 wide).

    OMP_NUM_THREADS=1 python research/bench_xl_forward.py --out benchmarks/bench_xl_forward.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness import bracketed, command, stamp, write_record
from retrofit.kernels import cpu_flash
from retrofit.kernels.sdpa_alibi_dims import pad_to
from retrofit.kernels.sdpa_relative_dims import _CausalSquare


def routes(N: int, H: int = 12, D: int = 64) -> tuple[dict, float]:
    """({"stock": the flash op, v padded; "blocked": the kernel's forward}, their largest difference): each a step
    of one square of N tokens."""
    torch.manual_seed(0)
    qx, k, angles, v = torch.randn(1, H, N, 2 * D), torch.randn(1, H, N, D), torch.randn(N, D), torch.randn(1, H, N, D)

    def padded():
        kx = torch.cat([k, angles.expand(1, H, N, -1)], -1)
        return cpu_flash.forward(qx, kx, pad_to(v, 2 * D), 0.125)[0][..., :D]

    def blocked():
        with torch.no_grad():
            return _CausalSquare.apply(qx, k, angles, v, 0.125)

    diff = (padded() - blocked()).abs().max().item()
    return {"stock": padded, "blocked": blocked}, diff


def timer(step) -> float:
    t = time.perf_counter()
    step()
    return time.perf_counter() - t


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="2048,8192")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default="benchmarks/bench_xl_forward.json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for N in [int(x) for x in args.lengths.split(",")]:
        steps, diff = routes(N)
        for f in steps.values():
            f()  # warm-up
        times, ratios = bracketed(steps, args.repeats, timer)
        rows.append({"length": N, "padded_flash_seconds": statistics.median(times["stock"]),
                     "blocked_seconds": statistics.median(times["blocked"]),
                     "blocked_vs_padded": round(statistics.median(ratios["blocked"]), 3),
                     "ratios": [round(r, 4) for r in ratios["blocked"]], "max_abs_difference": diff})  # fmt: skip
        print(rows[-1], flush=True)
    write_record(args.out, {"benchmark": "bench_xl_forward", "command": command(__file__, argv), **stamp(),
                            "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
