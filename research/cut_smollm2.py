#!/usr/bin/env python
"""Does a cut-down SmolLM2 copy? The seventh round of docs/results.md ("Stand-ins that copy"): the first k
layers of the ``smollm2`` built-in (its final norm and tied head kept) at 256 tokens, their held-out loss and the
copy probe (32-token held-out Shakespeare spans at distance 64 and 128, 16 trials: repeat NLL / first NLL, and the
exact-continuation rate); then, with ``--heal-layers K --heal-steps N``, the K-layer prefix's last layer and
final norm trained N steps of 4 x 256 training tokens (AdamW 3e-4), probed every 50 steps.

    OMP_NUM_THREADS=1 python research/cut_smollm2.py --layers 30,4,6,8,12,16 --heal-layers 12 --heal-steps 150
"""

from __future__ import annotations

import argparse
import time

import torch

from harness import BENCHMARKS, command, stamp, write_record
from retrofit.models import assets
from retrofit.models.io import load_model
from retrofit.scoring import copying
from retrofit.training.standin import pack_blocks

NATIVE = 256


def probe(model, held: torch.Tensor, text: list[int]) -> dict:
    """Held-out loss on 8 blocks of 256 and the copy probe at distance 64 and 128."""
    model.eval()
    with torch.no_grad():
        out = {"heldout_loss": round(model(input_ids=held[:8], labels=held[:8]).loss.item(), 3)}
    for d in (NATIVE // 4, NATIVE // 2):
        c = copying.copy_cell(model, text, d, 16)
        out[f"copy_at_{d}"] = {"second_over_first": round(c["second_over_first"], 3), "exact_rate": c["exact_rate"]}
    return out


def cut(model, k: int, layers) -> None:
    model.model.layers = layers[:k]
    model.config.num_hidden_layers = k


def heal(model, k: int, steps: int, train: torch.Tensor, held, text) -> list[dict]:
    """Train the last kept layer and the final norm; the curve of the probe every 50 steps."""
    for p in model.parameters():
        p.requires_grad_(False)
    params = [*model.model.norm.parameters(), *model.model.layers[k - 1].parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    curve = []
    for s in range(steps + 1):
        if s % 50 == 0 or s == steps:
            curve.append({"step": s, **probe(model, held, text)})
            print(curve[-1], flush=True)
        if s == steps:
            break
        model.train()
        idx = torch.randint(0, train.shape[0], (4,), generator=g)  # (4,) rows of (4, 256)
        model(input_ids=train[idx], labels=train[idx]).loss.backward()
        opt.step()
        opt.zero_grad()
    return curve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="30,4,6,8,12,16", help="prefix sizes to probe, comma-separated")
    parser.add_argument("--heal-layers", type=int, default=0, help="the prefix to heal (0: none)")
    parser.add_argument("--heal-steps", type=int, default=150)
    parser.add_argument("--out", default=str(BENCHMARKS / "cut_smollm2.json"))
    a = parser.parse_args(argv)
    t0 = time.time()
    model, tok = load_model("smollm2")
    model = model.float()
    held = pack_blocks(tok, assets.shakespeare_documents("heldout"), NATIVE)  # (n, 256)
    train = pack_blocks(tok, assets.shakespeare_documents("train"), NATIVE)  # (m, 256)
    text = held.reshape(-1).tolist()
    layers = model.model.layers
    rows = []
    for k in (int(x) for x in a.layers.split(",")):
        cut(model, k, layers)
        rows.append({"layers": k, **probe(model, held, text)})
        print(rows[-1], flush=True)
    curve = []
    if a.heal_layers:
        cut(model, a.heal_layers, layers)
        curve = heal(model, a.heal_layers, a.heal_steps, train, held, text)
    write_record(
        a.out,
        {
            "benchmark": "cut_smollm2",
            "command": command(__file__, argv),
            **stamp(),
            "seconds": round(time.time() - t0, 1),
            "prefixes": rows,
            "heal": {"layers": a.heal_layers, "steps": a.heal_steps, "curve": curve},
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
