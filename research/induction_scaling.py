"""Stand-ins that copy, by the known scaling of induction: a small body trained with small batches for as many
steps as the fit predicts, on bursty data, with the copy probe every ``--probe-every`` steps.

Induction heads appear after about 10^5.7 * sqrt(B * C) training tokens, independent of model size (B rows of C
tokens a step; Aoyama et al., arXiv 2511.16893); repetition in the data brings them sooner (Zucchet et al.,
arXiv 2505.17863). Every earlier CPU round (docs/results.md, "Stand-ins that copy") stopped at a tenth to a
third of that. This run follows the fit instead: the quickstart's body (GPT-2, 4 layers, 128 wide, 4 heads,
vocab 2,048) at native ``--native`` (128), ``--batch`` (8) rows a step, for ``--steps`` steps, on Shakespeare's
training plays where every row, with probability ``--copy-fraction``, repeats spans of itself at uniform random
distances (``induction_mix.add_repeats``, the stand-in trainer's copy mix: no fixed offset; half of the spans random tokens).

The probe (``retrofit.scoring.copying``, the trial of ``retrofit.evaluation.retrieval``; held-out plays): second/first NLL of a 32-token natural span
(16 at native 128) repeated at native/8 and native/2 (16 paired trials each; the bar is <= 0.3), random-token
recall at native (the share of a repeated random span's tokens predicted greedy-right, distance native - span;
the bar is >= 80%), and the held-out loss (the bar: no worse than 1.1x the shipped quickstart stand-in's).

Resumable: a checkpoint (weights, optimizer, schedule, data generator, curve) every ``--probe-every`` steps in
``--run``; the same command goes on from it.

    OMP_NUM_THREADS=1 python research/induction_scaling.py     # -> benchmarks/induction_scaling.json
    python research/induction_scaling.py --table benchmarks/induction_scaling.json   # the curve in docs/results.md
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time
from pathlib import Path

import torch

from harness import stamp, write_record
from induction_mix import InductionConfig, add_repeats
from retrofit.models import assets
from retrofit.models.standin import build_model
from retrofit.scoring import copying
from retrofit.training.standin import heldout_loss, pack_blocks, train_tokenizer

QUICKSTART_HELDOUT_LOSS = 4.571087454247662  # standins/quickstart-*/pretrain_stats.json, read again in main()


def predicted_tokens(batch: int, native: int) -> float:
    """Aoyama et al.'s fit: training tokens before induction heads appear, 10^5.7 * sqrt(B * C)."""
    return 10**5.7 * math.sqrt(batch * native)


def probe(model, held: list[int], vocab: int, native: int, seed: int = 0) -> dict:
    """Copy of natural text at native/8 and native/2 (second/first NLL), random-token recall at native."""
    model.eval()
    span = min(32, native // 8)
    cue = max(1, span // 4)
    out = {}
    for d in (native // 8, native // 2):
        cell = copying.copy_cell(model, held, d, 16, copying.Probe(span, cue, seed=seed))
        out[f"second_over_first_d{d}"] = cell["second_over_first"]
    rng = random.Random(seed)
    rand = [rng.randrange(3, vocab) for _ in range(20000)]
    right = total = 0
    for j in range(16):
        trial = copying.build(rand, native - span, copying.Probe(span, cue, seed=seed), j, length=native)
        s = copying.score(model, trial)
        right, total = right + s["tokens_right"], total + s["tokens"]
    out["random_recall_at_native"] = round(right / total, 4)
    model.train()
    return out


def data(native: int, vocab: int):
    docs = assets.shakespeare_documents("train")
    tok = train_tokenizer(docs, vocab)
    train = pack_blocks(tok, docs, native)  # [n, native]
    held_docs = assets.shakespeare_documents("heldout")
    held = pack_blocks(tok, held_docs, native)
    return tok, train, held


def save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def table(data: dict) -> str:
    """docs/results.md's copy curve: every probe of the record, the predicted emergence step marked."""
    out = [
        "| step | tokens | held-out loss | second/first at native/8 | at native/2 | random-token recall at native |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    native = data["config"]["native"]
    for p in data["curve"]:
        mark = (
            " (predicted)" if p["step"] >= data["predicted_steps"] > p["step"] - data["config"]["probe_every"] else ""
        )
        out.append(
            f"| {p['step']:,}{mark} | {p['tokens']:,} | {p['heldout_loss']:.3f} | "
            f"{p[f'second_over_first_d{native // 8}']:.3f} | {p[f'second_over_first_d{native // 2}']:.3f} | "
            f"{p['random_recall_at_native']:.0%} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--native", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=24000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--copy-fraction", type=float, default=0.5)
    ap.add_argument("--probe-every", type=int, default=1000)
    ap.add_argument("--run", default="runs/induction_scaling")
    ap.add_argument("--out", default="benchmarks/induction_scaling.json")
    ap.add_argument("--table", metavar="JSON", help="print the copy curve of a record as markdown and exit")
    a = ap.parse_args(argv)
    if a.table:
        import json

        print(table(json.loads(Path(a.table).read_text())))
        return 0
    cfg = InductionConfig(
        name="induction-scaling",
        n_positions=a.native,
        n_layer=4,
        n_head=4,
        n_embd=128,
        vocab_size=2048,
        steps=a.steps,
        batch_size=a.batch,
        lr=a.lr,
        warmup_steps=200,
        min_lr_ratio=0.1,
        copy_fraction=a.copy_fraction,
        copy_random=0.5,
        copy_max_span=32,
    )
    torch.manual_seed(0)
    tok, train, held = data(a.native, cfg.vocab_size)
    model = build_model(cfg, len(tok), tok.eos_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = cfg.warmup_steps

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        t = min(1.0, (step - warm) / max(1, a.steps - warm))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    gen = torch.Generator().manual_seed(1)
    run = Path(a.run)
    run.mkdir(parents=True, exist_ok=True)
    ckpt, step, curve, seconds = run / "state.pt", 0, [], 0.0
    if ckpt.exists():
        s = torch.load(ckpt, weights_only=False)
        model.load_state_dict(s["model"]), opt.load_state_dict(s["opt"]), sched.load_state_dict(s["sched"])
        gen.set_state(s["gen"])
        step, curve, seconds = s["step"], s["curve"], s["seconds"]
        print(f"resumed at step {step}")
    pool = torch.unique(train)
    held_ids = held.reshape(-1).tolist()
    predicted = predicted_tokens(a.batch, a.native)
    print(
        f"fit: induction after ~{predicted:.3g} tokens = {predicted / (a.batch * a.native):,.0f} steps; running {a.steps}"
    )
    model.train()
    t0 = time.time()
    while step < a.steps:
        idx = torch.randint(0, train.shape[0], (a.batch,), generator=gen)
        x = add_repeats(train[idx], cfg, gen, pool)  # [B, native]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % a.probe_every == 0 or step == a.steps:
            seconds += time.time() - t0
            t0 = time.time()
            point = {
                "step": step,
                "tokens": step * a.batch * a.native,
                "train_loss": round(loss.item(), 4),
                "heldout_loss": round(heldout_loss(model, held[:256]), 4),
                **probe(model, held_ids, cfg.vocab_size, a.native),
                "seconds": round(seconds, 1),
            }
            model.train()
            curve.append(point)
            print(point, flush=True)
            state = {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
            save(ckpt, {**state, "gen": gen.get_state(), "step": step, "curve": curve, "seconds": seconds})
            write_record(
                a.out,
                {
                    "benchmark": "induction_scaling",
                    "command": "OMP_NUM_THREADS=1 python research/induction_scaling.py",
                    "config": vars(a),
                    "predicted_tokens": round(predicted),
                    "predicted_steps": round(predicted / (a.batch * a.native)),
                    "quickstart_heldout_loss": QUICKSTART_HELDOUT_LOSS,
                    **stamp(),
                    "curve": curve,
                },
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
