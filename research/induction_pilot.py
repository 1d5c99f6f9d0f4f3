"""Does a stand-in body form induction heads? The pilots of docs/results.md ("Stand-ins that copy").

    # the copy mix through the stand-in trainer (induction_mix.py; its copy curve lands in pretrain_stats.json)
    OMP_NUM_THREADS=1 python research/induction_pilot.py mix --arch gpt2 --steps 800 --copy-fraction 0.75 --batch 8
    # the induction toy on rows of the body, with natural rows beside (--toy-rows of --batch), own loop
    OMP_NUM_THREADS=1 python research/induction_pilot.py toy --arch gpt2 --layers 4 --toy-rows 16 --steps 800 --native 128
    # language first: continue a shipped stand-in with toy rows and natural rows whose second half repeats the first
    OMP_NUM_THREADS=1 python research/induction_pilot.py continue --init standins/study2-llama-736570157b87 \
        --toy-rows 8 --echo-rows 4 --lr 5e-4 --steps 800 --save runs/induction-pilots/llama-continued
    # the same with repeats at many distances (tiled toy, echo spans at uniform distances)
    OMP_NUM_THREADS=1 python research/induction_pilot.py continue --init standins/study2-llama-736570157b87 \
        --toy-rows 6 --copy-toy-min-period 16 --echo-rows 6 --echo-varied --lr 3e-4 --steps 700 --save ...
    # the copying bar on a saved model: natural-text copy at native/4 and native/2, random-token recall at native
    OMP_NUM_THREADS=1 python research/induction_pilot.py check --init runs/induction-pilots/llama-continued

Every 100 steps (toy) it prints the loss on the toy rows' repeats, the natural rows' loss and the copy probe
(``retrofit.scoring.copying``, the trial of ``retrofit.evaluation.retrieval``: a 32-token held-out span at distance 128, repeat NLL / first NLL, exact).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from pathlib import Path

import torch

from induction_mix import InductionConfig, induction_rows
from retrofit.models.standin import StandinConfig, build_model
from retrofit.scoring import copying
from retrofit.training.standin import pack_blocks, pretrain, train_tokenizer, training_plays


def mix(a) -> None:
    cfg = InductionConfig(
        name=f"pilot-{a.arch}",
        arch=a.arch,
        n_positions=a.native,
        n_layer=a.layers,
        n_head=a.heads,
        n_embd=a.width,
        vocab_size=a.vocab,
        steps=a.steps,
        batch_size=a.batch,
        lr=a.lr,
        warmup_steps=a.warmup_steps,
        min_lr_ratio=a.min_lr_ratio,
        eval_max_blocks=64,
        copy_fraction=a.copy_fraction,
        copy_random=a.copy_random,
        copy_max_span=a.copy_max_span,
        copy_warmup=a.copy_warmup,
        copy_toy_share=a.copy_toy_share,
        copy_toy_min_period=a.copy_toy_min_period,
        copy_eval_every=max(1, a.steps // 10),
    )
    out = pretrain(cfg, cache_dir=a.cache)
    stats = json.loads((out / "pretrain_stats.json").read_text())
    print(
        json.dumps(
            {
                "config": dataclasses.asdict(cfg),
                "copy_curve": stats["curve"],
                "copying": stats["copying"],
                "heldout_ppl": stats["heldout_ppl"],
            },
            indent=1,
        )
    )


def toy(a) -> None:
    torch.manual_seed(0)
    cfg = StandinConfig(
        name="toy", arch=a.arch, n_positions=a.native, n_layer=a.layers, n_head=4, n_embd=128, vocab_size=4096
    )
    docs = training_plays(cfg)
    tok = train_tokenizer(docs, cfg.vocab_size)
    blocks = pack_blocks(tok, docs, a.native)
    held, blocks = blocks[-64:], blocks[:-64]
    pool = torch.unique(blocks)
    model = build_model(cfg, len(tok), tok.eos_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    text, t0, L, k = held.reshape(-1).tolist(), time.time(), a.native, a.toy_rows
    for step in range(a.steps + 1):
        x = blocks[torch.randint(0, len(blocks), (a.batch,), generator=g)].clone()  # [B, L]
        x[:k] = induction_rows((k, L), g, pool)  # the second half repeats a random first half
        out = model(input_ids=x, labels=x)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            with torch.no_grad():
                nll = -out.logits[:, :-1].log_softmax(-1).gather(2, x[:, 1:, None])[..., 0]  # [B, L-1]
            model.eval()
            c = copying.copy_cell(model, text, L // 2, 8)
            model.train()
            print(
                step,
                "toy repeats",
                round(nll[:k, min(64, L // 2) :].mean().item(), 3),
                "natural",
                round(nll[k:].mean().item(), 3) if k < a.batch else None,
                "probe repeat/first",
                c["second_over_first"],
                "exact",
                c["exact_rate"],
                f"{time.time() - t0:.0f}s",
                flush=True,
            )


def _echo(x: torch.Tensor, g: torch.Generator | None = None) -> torch.Tensor:
    """Natural rows [k, L] with copying on real text, not random ids. Without ``g`` the second half repeats the
    first (one distance, L/2); with ``g`` each row repeats a span of 16..64 tokens at a distance drawn uniformly
    from span..L-span, so no single offset answers."""
    L = x.shape[1]
    if g is None:
        h = L // 2
        return torch.cat([x[:, :h], x[:, :h], x[:, : L - 2 * h]], 1)  # [k, L]
    x = x.clone()
    for row in x:
        s = int(torch.randint(16, min(64, L // 4) + 1, (), generator=g))
        d = int(torch.randint(s, L - s + 1, (), generator=g))
        p = int(torch.randint(0, L - d - s + 1, (), generator=g))
        row[p + d : p + d + s] = row[p : p + s].clone()
    return x  # [k, L]


def cont(a) -> None:
    """Language first: continue a stand-in folder (model, tokenizer, pretrain_stats.json) with ``--toy-rows``
    rows of the induction toy and ``--echo-rows`` natural rows repeated, the rest plain training text; the
    probe reads held-out plays (never trained on)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from retrofit.models import assets

    torch.manual_seed(0)
    stats = json.loads((Path(a.init) / "pretrain_stats.json").read_text())
    cfg = InductionConfig(**stats["config"])  # a stand-in of before the split records the mix's fields
    tok = AutoTokenizer.from_pretrained(a.init)
    model = AutoModelForCausalLM.from_pretrained(a.init, dtype=torch.float32)
    blocks = pack_blocks(tok, training_plays(cfg), cfg.n_positions)  # [n, L]
    held = pack_blocks(tok, assets.shakespeare_documents("heldout"), cfg.n_positions)[:64]  # [64, L]
    pool = torch.unique(blocks)
    params = _trained(model, a.train)
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / a.warmup_steps))
    g = torch.Generator().manual_seed(1)
    text, t0, L, k, e = held.reshape(-1).tolist(), time.time(), cfg.n_positions, a.toy_rows, a.echo_rows
    T = a.seq or L  # the training rows' length; the probes read at the native length
    if not 0 < T <= L or a.save_every < 1:
        raise SystemExit(f"--seq must be within 1..{L} (native) and --save-every >= 1")
    print(f"training {sum(p.numel() for p in params):,} parameters ({a.train}), rows of {T} tokens", flush=True)

    def report(step):
        model.eval()
        cells = {d: copying.copy_cell(model, text, d, 16) for d in (L // 8, L // 4, L // 2)}
        with torch.no_grad():
            plain = model(input_ids=held[:16], labels=held[:16]).loss.item()
        model.train()
        probes = " ".join(f"d={d} {c['second_over_first']}/{c['exact_rate']}" for d, c in cells.items())
        print(
            step,
            "held-out loss",
            round(plain, 4),
            "copy repeat/first, exact:",
            probes,
            f"{time.time() - t0:.0f}s",
            flush=True,
        )

    report(0)
    model.train()
    for step in range(1, a.steps + 1):
        x = blocks[torch.randint(0, len(blocks), (a.batch,), generator=g)][:, :T].clone()  # [B, T]
        x[:k] = induction_rows((k, T), g, pool, min_period=a.copy_toy_min_period)
        x[k : k + e] = _echo(x[k : k + e], g if a.echo_varied else None)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        warm.step()
        if step % a.every == 0:
            report(step)
        if a.save and (step % a.save_every == 0 or step == a.steps):
            model.save_pretrained(a.save, safe_serialization=True)
            tok.save_pretrained(a.save)


def _trained(model, which: str) -> list:
    """The parameters ``continue`` trains: ``all``, or ``attention`` (q/k/v/o projections only; embeddings,
    MLPs and norms frozen, so the language the stand-in learned stays while a copying circuit forms)."""
    if which == "all":
        return list(model.parameters())
    keep = []
    for name, p in model.named_parameters():
        p.requires_grad_(".self_attn." in name or ".attn." in name)
        if p.requires_grad:
            keep.append(p)
    if not keep:
        raise SystemExit("no attention parameters found (names with .self_attn. or .attn.)")
    return keep


def check(a) -> None:
    """The issue's copying bar on a saved model (``--init``): natural-text copy at native/4 and native/2 (32-token
    held-out spans, 32 trials, repeat/first NLL; bar <= 0.3) and random-token recall at native (16-token spans,
    depths 0.1..0.5, 32 trials, exact; bar >= 80%), plus its held-out loss at native."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from retrofit.evaluation import recall
    from retrofit.models import assets

    tok = AutoTokenizer.from_pretrained(a.init)
    model = AutoModelForCausalLM.from_pretrained(a.init, dtype=torch.float32).eval()
    L = model.config.max_position_embeddings
    held = pack_blocks(tok, assets.shakespeare_documents("heldout"), L)  # [n, L]
    text = held.reshape(-1).tolist()
    out = {"model": a.init, "native": L}
    with torch.no_grad():
        out["heldout_loss"] = round(model(input_ids=held[:32], labels=held[:32]).loss.item(), 4)
    for d in (L // 4, L // 2):
        c = copying.copy_cell(model, text, d, 32)
        out[f"copy_at_{d}"] = {k: c[k] for k in ("second_over_first", "exact_rate")}
    pool = recall.token_pool(text, tok)
    spans = recall.make_spans(0, 32, 16, pool)
    hits = 0
    for j, sp in enumerate(spans):
        prompt = recall.build(text, L, 0.1 + 0.4 * j / 31, sp, j * L, recall.Layout(cue=4))
        hits += recall.score(model, prompt)["exact"]
    out["random_recall_exact_at_native"] = hits / len(spans)
    print(json.dumps(out, indent=1), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["mix", "toy", "continue", "check"])
    p.add_argument("--init", help="continue: a stand-in folder")
    p.add_argument("--echo-rows", type=int, default=4, help="continue: natural rows whose second half repeats")
    p.add_argument("--echo-varied", action="store_true", help="continue: echo spans at distances drawn uniformly")
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--save", help="continue: where to save the model (every --save-every steps and at the end)")
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--train", default="all", choices=["all", "attention"], help="continue: which parameters")
    p.add_argument("--seq", type=int, default=0, help="continue: training rows' length (0: native)")
    p.add_argument("--arch", default="gpt2", choices=["gpt2", "llama"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--native", type=int, default=256)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr-ratio", type=float, default=1.0)
    p.add_argument("--copy-fraction", type=float, default=0.5)
    p.add_argument("--copy-random", type=float, default=0.5)
    p.add_argument("--copy-max-span", type=int, default=64)
    p.add_argument("--copy-warmup", type=int, default=0)
    p.add_argument("--copy-toy-share", type=float, default=0.0)
    p.add_argument("--copy-toy-min-period", type=int, default=0)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--warmup-steps", type=int, default=30, help="linear warm-up steps (mix; continue since round 6)")
    p.add_argument("--toy-rows", type=int, default=4)
    p.add_argument("--cache", default="runs/induction-pilots")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    {"mix": mix, "toy": toy, "continue": cont, "check": check}[a.what](a)


if __name__ == "__main__":
    main()
