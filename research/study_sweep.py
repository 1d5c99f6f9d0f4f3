"""The recipe sweep that chose the study's defaults: ALiBi at 2% of the stand-in's pretraining tokens.

    python research/study_sweep.py            # writes benchmarks/study_recipe_sweep.{json,md}

Each configuration is a round of the study (``research/study_rounds.py``) on one scheme (alibi) and one budget
(2%), with its continued-training control, scoring native-length ppl only; its cells are read from
``runs/sweep/<config>/`` (it trains nothing). The study then used the batch size and learning rates
that gave the lowest converted ppl (not the lowest ratio to the control: a learning rate that
damages the control flatters that ratio; see docs/study.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness import command, write_record
from retrofit.study.tables import fmt
from study_rounds import Round, rebuild

# name: (method, batch size, learning rate, the distill/fade/offset variants, LoRA also trains the embeddings)
CONFIGS = {
    "b2-lr1e-3": ("full", 2, 1e-3, False, True),
    "b2-lr3e-4": ("full", 2, 3e-4, False, True),
    "b1-lr3e-4": ("full", 1, 3e-4, False, True),
    "b2-lr3e-4-var": ("full", 2, 3e-4, True, True),
    "b2-lr5e-4": ("full", 2, 5e-4, False, True),
    "b4-lr3e-4-var": ("full", 4, 3e-4, True, True),
    "b2-lr1.5e-4-var": ("full", 2, 1.5e-4, True, True),
    "lora-b2-lr1e-3-emb": ("lora", 2, 1e-3, False, True),
    "lora-b2-lr5e-4-emb": ("lora", 2, 5e-4, False, True),
    "lora-b2-lr1e-3": ("lora", 2, 1e-3, False, False),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="runs/sweep")
    p.add_argument("--out", default="benchmarks/study_recipe_sweep.json")
    args = p.parse_args(argv)
    rows = []
    for name, (method, batch, lr, variants, embeddings) in CONFIGS.items():
        out = Path(args.runs) / f"{name}.json"
        rebuild(
            Round(
                out=str(out),
                runs=str(Path(args.runs) / name),
                schemes=["alibi"],
                methods=[method],
                budgets=[0.02],
                multiples=[1],
                eval_budget=8192,
                batch_size=batch,
                variants=variants,
                lora_embeddings=embeddings,
                passkey_trials=0,
                **{f"lr_{method}": lr},
            ),
            command(__file__, []),
        )
        gpt2 = json.loads(out.read_text())["gpt2"]
        table, native = gpt2["table"], gpt2["stand_in"]["native_length"]
        control = next((r for r in table if r["cell"].startswith("control")), {})
        for r in table:
            if r["cell"].startswith(("original", "control")):
                continue
            rows.append(
                {
                    "config": name,
                    "method": method,
                    "batch_size": batch,
                    "learning_rate": lr,
                    "lora_embeddings": method == "lora" and embeddings,
                    "cell": r["cell"],
                    "steps": r.get("extra_tokens", 0) // (native * batch),
                    "objective": r.get("objective"),
                    "fade": r.get("fade"),
                    "extra_tokens": r.get("extra_tokens"),
                    "ppl@1x": r.get("ppl@1x"),
                    "control_ppl@1x": control.get("ppl@1x"),
                    "vs_control@1x": r.get("vs_control@1x"),
                    "vs_original@1x": r.get("vs_original@1x"),
                    "error": r.get("error"),
                }
            )
    original = next(r for r in table if r["cell"].startswith("original"))["ppl@1x"]
    result = {"command": command(__file__, []), "original_ppl@1x": original, "rows": rows}
    write_record(args.out, result, indent=1)
    md = [
        "| config | cell | steps x batch | lr | ppl@1x | control ppl@1x | vs control | vs original |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        md.append(
            f"| {r['config']} | {r['cell']} | {r['steps']} x {r['batch_size']} | "
            f"{r['learning_rate']:g} | {fmt(r['ppl@1x'])} | {fmt(r['control_ppl@1x'])} | "
            f"{fmt(r['vs_control@1x'])} | {fmt(r['vs_original@1x'])} |"
        )
    Path(args.out).with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
