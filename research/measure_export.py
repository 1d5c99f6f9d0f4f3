"""Measure native exports on a trained model: max |logit| difference on random ids and the perplexity of
the patched vs the exported model on real text (default: the held-out Shakespeare plays), at lengths past the native one.

    OMP_NUM_THREADS=1 python research/measure_export.py [--preset quickstart] [--lengths 256 512 1024] [--out m.json]

The model is the offline GPT-2 stand-in (``retrofit.models.standin``; native length 128 for "quickstart"),
converted without fine-tuning (the export maps whatever weights it has; fine-tuning changes nothing
in the mapping). Also reports what the refused ``alibi scale_bias=False`` -> Falcon export would cost:
the same weights evaluated with the bias added before the scaling.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile

import torch

from harness import write_record


def nll(model, ids: torch.Tensor) -> float:
    """Mean next-token NLL over windows ``ids`` (N, L)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for row in ids:
            logits = model(input_ids=row[None], use_cache=False).logits[0, :-1].float()
            total += float(torch.nn.functional.cross_entropy(logits, row[1:], reduction="sum"))
            count += row.numel() - 1
    return total / count


def windows(tokens: list[int], length: int, count: int) -> torch.Tensor:
    n = min(count, len(tokens) // length)
    return torch.tensor(tokens[: n * length]).view(n, length)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="quickstart")
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--out", default=None)
    p.add_argument("--text", default="shakespeare:heldout", help="retrofit data spec of the text")
    args = p.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    import retrofit
    from retrofit.data.specs import load_documents, tokenize_documents
    from retrofit.training.standin import pretrain

    path = pretrain(args.preset)
    tok = AutoTokenizer.from_pretrained(path)
    tokens = [t for doc in tokenize_documents(tok, load_documents(args.text)) for t in doc]
    rows = []
    cases = [
        ("alibi", {"scale_bias": True}),
        ("rope", {}),
        ("rope", {"scaling": "yarn", "factor": 4.0}),
        ("nope", {}),
        ("sinusoidal", {}),
    ]
    for scheme, options in cases:
        model = retrofit.convert(AutoModelForCausalLM.from_pretrained(path).eval(), scheme, kernel="chunked", **options)
        with tempfile.TemporaryDirectory() as tmp:
            for length in args.lengths:
                res = retrofit.export(model, f"{tmp}/x", check_length=length, max_length=max(args.lengths))
                plain = AutoModelForCausalLM.from_pretrained(f"{tmp}/x").eval()
                ids = windows(tokens, length, args.windows)
                a, b = nll(model, ids), nll(plain, ids)
                rows.append(
                    {
                        "scheme": scheme,
                        "options": options,
                        "target": res["target"],
                        "length": length,
                        "exact": res["exact"],
                        "max_abs_logit_diff": res["max_abs_logit_diff"],
                        "ppl_patched": math.exp(a),
                        "ppl_exported": math.exp(b),
                        "ppl_rel_diff": math.exp(b - a) - 1,
                    }
                )
                print(json.dumps(rows[-1]))
    # the refused pair: alibi added after the scaling, exported as Falcon (bias before the scaling) anyway
    for length in args.lengths:
        ids = windows(tokens, length, args.windows)
        after = retrofit.convert(AutoModelForCausalLM.from_pretrained(path).eval(), "alibi", kernel="chunked")
        before = retrofit.convert(
            AutoModelForCausalLM.from_pretrained(path).eval(), "alibi", kernel="chunked", scale_bias=True
        )
        a, b = nll(after, ids), nll(before, ids)
        rows.append(
            {
                "scheme": "alibi",
                "options": {"scale_bias": False},
                "target": "FalconForCausalLM (refused)",
                "length": length,
                "ppl_patched": math.exp(a),
                "ppl_exported": math.exp(b),
                "ppl_rel_diff": math.exp(b - a) - 1,
            }
        )
        print(json.dumps(rows[-1]))
    if args.out:
        write_record(args.out, rows)


if __name__ == "__main__":
    main()
