"""Print docs/finetune.md's memory-on-paper table from retrofit.training.plan (the formula `--plan` uses).

python research/memory_table.py            # the Markdown table
python research/memory_table.py --check    # exit 1 if docs/finetune.md holds another table
"""

from __future__ import annotations

import argparse
import sys

from harness import DOCS
from retrofit.training.plan import GiB, Run, Shape, estimate


def llama_shape(name, layers, hidden, intermediate, heads, kv_heads, vocab, tied=False) -> Shape:
    """A LLaMA-architecture model's shape from its config numbers (no weights needed)."""
    hd = hidden // heads
    attn = 2 * hidden * hidden + 2 * hidden * hd * kv_heads
    block = attn + 3 * hidden * intermediate + 2 * hidden
    emb = vocab * hidden
    params = layers * block + emb * (1 if tied else 2) + hidden
    lora = layers * (4 * hidden + 2 * (hidden + hd * kv_heads))  # q, k, v, o: in + out
    return Shape(
        name,
        layers,
        hidden,
        intermediate,
        heads,
        kv_heads,
        vocab,
        params,
        block,
        True,
        5.0,
        0.0,
        lora,
        layers * 2 * hidden + hidden,
        emb,
    )


DOC = DOCS / "finetune.md"
BEGIN, END = "<!-- memory-table:begin -->", "<!-- memory-table:end -->"
PROCESSES = 8
SHAPES = {  # public config numbers (the table's rows)
    "llama-1b": llama_shape("Llama-3.2-1B", 16, 2048, 8192, 32, 8, 128256, tied=True),
    "llama-7b": llama_shape("Llama-2-7B", 32, 4096, 11008, 32, 32, 32000),
    "llama-70b": llama_shape("Llama-2-70B", 80, 8192, 28672, 64, 8, 32000),
}


def table() -> str:
    lines = [
        f"Peak memory per device, GiB, {PROCESSES} devices, batch 1 per device, bf16 weights and compute, "
        "gradient checkpointing on, AdamW; LoRA r 16 on q, k, v, o with norms trained. "
        "FSDP + offload: device / host memory per process.",
        "",
        "| model | method | tokens | DDP | FSDP | FSDP + offload |",
        "|---|---|---|---|---|---|",
    ]
    for shape in SHAPES.values():
        for method in ("lora", "full"):
            for tokens in (4096, 16384):
                run = Run(method=method, block_length=tokens)
                e = {route: estimate(shape, run, route, PROCESSES) for route in ("ddp", "fsdp", "fsdp+offload")}
                off = e["fsdp+offload"]
                lines.append(
                    f"| {shape.name} ({shape.params / 1e9:.2f}B) | {method} | {tokens // 1024}k | "
                    f"{e['ddp']['device_total'] / GiB:.1f} | {e['fsdp']['device_total'] / GiB:.1f} | "
                    f"{off['device_total'] / GiB:.1f} / {off['host_per_process'] / GiB:.1f} |"
                )
    return "\n".join(lines)


def documented() -> str:
    text = DOC.read_text()
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if args.check:
        ok = documented() == table()
        print("docs/finetune.md table is current" if ok else "docs/finetune.md table differs: rerun and paste")
        return 0 if ok else 1
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
