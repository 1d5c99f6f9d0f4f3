"""The kernel table of ``docs/results.md`` from the per-scheme JSONs of ``research/bench_kernel.py``.

    for s in alibi t5 shaw fire rope nope sinusoidal; do   # xl and nezha: benchmarks/bench_kernel_relative.json
        OMP_NUM_THREADS=1 python research/bench_kernel.py --schemes $s --lengths 1024,2048,8192 \\
            --modes infer,train --memory-lengths 8192 --out benchmarks/kernel_table/$s.json
    done
    python research/kernel_table.py benchmarks/kernel_table benchmarks/bench_kernel_relative.json
    python research/kernel_table.py benchmarks/kernel_round5   # issue #71's kernels (docs/results.md says why apart)

One scheme (or a few) per JSON, so that each is a cache of its own (a scheme re-measured after a change reruns
alone); a folder means every JSON in it. A later file's figure replaces an earlier one's for the same variant, mode
and length (a re-measured cell). A LLaMA body's variants
(``bench_kernel.py --body llama``: SelfExtend, STRING against the plain RoPE forward) are named "(LLaMA body)".
Rows in ``ORDER``, then any other variant by name.
Time: x stock, the median of per-repeat ratios against stock in the same process (from kernel round 10 each step
between two stock steps, the quartiles of the ratios in brackets); memory at
the longest memory length: peak RSS and bytes saved for backward, x stock, one process per variant. Prints
Markdown: the CPU line, then the table (``research/test_records.py`` checks ``docs/results.md`` holds it verbatim).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MODES = {"infer": "inference", "train": "train step"}
ORDER = ["alibi", "alibi+scale_bias", "t5", "shaw", "fire", "xl", "nezha", "rope", "nope", "sinusoidal"]


def cpu_line(results: list[dict]) -> str:
    cpus = {
        (h.get("processor"), ", ".join(h.get("flags") or []) or "no AVX-512/AMX flag", h.get("torch_threads"))
        for h in (r["hardware"] for r in results)
    }
    return "; ".join(f"CPU: {p} ({f}), {t} torch thread(s)" for p, f, t in sorted(cpus, key=str))


def table(results: list[dict]) -> str:
    every = [
        {**r, "variant": r["variant"] + (" (LLaMA body)" if res.get("model", "").startswith("LLaMA") else "")}
        for res in results
        for r in res["rows"]
        if r.get("variant") not in (None, "stock")
    ]
    lengths = sorted({r["length"] for r in every if "time_vs_stock" in r})
    mem = sorted({r["length"] for r in every if "memory_vs_stock" in r})
    head = ["variant", "mode", *(f"{L:,}" for L in lengths), "kernel"]
    if mem:
        head += [f"peak RSS at {mem[-1]:,} x stock", f"saved for backward at {mem[-1]:,} x stock"]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * 2 + "---:|" * len(lengths) + "---|" + "---:|" * (2 * bool(mem)),
    ]
    names = set(r["variant"] for r in every)
    for v in [n for n in ORDER if n in names] + sorted(names - set(ORDER)):
        for mode, label in MODES.items():
            rows = [r for r in every if r["variant"] == v and r.get("mode") == mode]
            timed = {r["length"]: r for r in rows if "time_vs_stock" in r}
            if not timed:
                continue
            cells = [ratio(timed[L]) if L in timed else "—" for L in lengths]
            line = [v, label, *cells, ", ".join(sorted({r["kernel"] for r in timed.values()}))]
            if mem:
                m = next((r for r in rows if r.get("length") == mem[-1] and "memory_vs_stock" in r), {})
                line += [
                    f"{m['memory_vs_stock']:.2f}" if m else "—",
                    f"{m['saved_vs_stock']:.2f}" if "saved_vs_stock" in m else "—",
                ]
            lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


def ratio(row: dict) -> str:
    """x stock, and the quartiles of its per-repeat ratios where the record has them (bench_kernel's bracketed
    protocol): the spread a reading of one kernel moves within."""
    q = row.get("time_vs_stock_quartiles")
    return f"{row['time_vs_stock']:.2f}" + (f" ({q[0]:.2f}-{q[1]:.2f})" if q else "")


def files(paths) -> list[Path]:
    """The JSONs named, a folder meaning each JSON in it (by name)."""
    return [f for p in map(Path, paths) for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]


def render(paths) -> str:
    results = [json.loads(f.read_text()) for f in files(paths)]
    return cpu_line(results) + "\n\n" + table(results)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="bench_kernel JSONs, or folders of them")
    print(render(p.parse_args(argv).files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
