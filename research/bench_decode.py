"""Decoding speed with the KV cache: tokens/s of greedy cached decoding (``generate()``'s inner step) after a long prompt, RoPE through
retrofit against the same body with its native mechanism, side by side in one process.

Variants (random weights; the speed does not depend on them), alternated round after round:

- ``llama``: a LLaMA-style body (SmolLM2-135M's width, heads and GQA; fewer layers), native RoPE;
- ``llama+rope``: the same weights converted by retrofit to ``rope`` with the same frequencies
  (the cost of retrofit's attention kernel alone);
- ``llama+rope(re-rotate)``: the same, with each step re-rotating the whole cache (the behaviour
  before keys were rotated once on entering the cache), for comparison;
- ``llama+rope(no-table)``: the same, computing cos/sin for each step's positions as before they were read
  from a table built once, for comparison;
- ``gpt2`` / ``gpt2+SCHEME``: a GPT-2 body of the same width and depth, learned absolute positions
  (its table enlarged to fit) against the same weights converted to SCHEME (rope, alibi, t5, shaw, fire, xl,
  nezha, ...: every bias scheme's cached decoding step beside stock).

    OMP_NUM_THREADS=2 python research/bench_decode.py --context 4096 --new 32 --rounds 3
    -> benchmarks/bench_decode.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import retrofit
from harness import command, stamp, write_record


def build(variant: str, args):
    import transformers as tf

    import retrofit
    from retrofit.scheme import RotaryScheme

    torch.manual_seed(0)
    family = variant.split("+")[0]
    if family == "llama":
        cfg = tf.LlamaConfig(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=args.layers,
            num_attention_heads=9,
            num_key_value_heads=3,
            vocab_size=49152,
            max_position_embeddings=8192,
            rope_theta=100000.0,
        )
        model = tf.LlamaForCausalLM(cfg)
    else:
        cfg = tf.GPT2Config(
            n_embd=576, n_layer=args.layers, n_head=9, vocab_size=49152, n_positions=args.context + args.new
        )
        model = tf.GPT2LMHeadModel(cfg)
    model.eval()
    if "+" in variant:
        retrofit.convert(model, variant.split("+")[1].split("(")[0])
    rerotate = "re-rotate" in variant
    return model, rerotate or ("no-table" in variant and "no-table"), RotaryScheme


def run(model, rerotate, rotary, ids, new) -> float:
    """Seconds for ``new`` greedy decoding steps with the KV cache after an untimed prefill of ``ids``
    (what ``generate()`` does per token, without its bookkeeping)."""
    from retrofit.scheme import rope

    real, table = rotary.rotate_once, rope.TABLE_POSITIONS
    if rerotate == "no-table":
        rope.TABLE_POSITIONS = 0
    elif rerotate:
        rotary.rotate_once = lambda *a: False
    try:
        with torch.no_grad():
            out = model(ids, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            t0 = time.perf_counter()
            for _ in range(new):
                out = model(token, past_key_values=cache, use_cache=True)
                cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            elapsed = time.perf_counter() - t0
    finally:
        rotary.rotate_once, rope.TABLE_POSITIONS = real, table
    assert cache.get_seq_length() == ids.shape[1] + new
    return elapsed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--new", type=int, default=32, help="tokens generated after the prompt")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--variants",
        default="llama,llama+rope,llama+rope(no-table),llama+rope(re-rotate),gpt2,gpt2+rope,"
        "gpt2+alibi,gpt2+t5,gpt2+shaw,gpt2+fire,gpt2+xl,gpt2+nezha",
    )
    ap.add_argument("--out", default="benchmarks/bench_decode.json")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    models = {v: build(v, args) for v in variants}
    ids = torch.randint(0, 49152, (1, args.context))
    times = {v: [] for v in variants}
    for r in range(args.rounds + 1):  # round 0 warms up
        for v, (model, rerotate, rotary) in models.items():
            t = run(model, rerotate, rotary, ids, args.new)
            if r:
                times[v].append(t)
            print(f"[bench_decode] round {r} {v}: {args.new} steps in {t:.2f}s", file=sys.stderr, flush=True)
    tps = {v: args.new / statistics.median(t) for v, t in times.items()}
    rows = [
        {
            "variant": v,
            "decode_tokens_per_s": round(tps[v], 2),
            "seconds_all": times[v],
            "kernel": retrofit.describe(models[v][0])["last_kernel"] if "+" in v else "stock",
        }
        for v in variants
    ]
    for row in rows:
        base = row["variant"].split("+")[0]
        if base in tps and row["variant"] != base:
            row["vs_" + base] = round(tps[row["variant"]] / tps[base], 3)
    result = {
        "benchmark": "bench_decode",
        "command": command(__file__, argv),
        "setup": f"{args.layers} layers, 576 wide, 9 heads (LLaMA: 3 KV heads), batch 1, greedy, prompt {args.context} "
        f"tokens, then {args.new} greedy steps with the KV cache, timed (prefill untimed), median of {args.rounds} rounds",
        **stamp(),
        "rows": rows,
    }
    write_record(args.out, result)
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "seconds_all"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
