"""The recipe sweep that chose the study's defaults: ALiBi at 2% of the stand-in's pretraining tokens.

    python scripts/study_sweep.py            # writes benchmarks/study_recipe_sweep.{json,md}

Each configuration runs ``scripts/study.py`` on one scheme (alibi) and one budget (2%), with its
continued-training control, scoring native-length ppl only; cells are cached under
``runs/sweep/<config>/`` like the study's. The study then uses the batch size and learning rates
that gave the lowest converted ppl (not the lowest ratio to the control: a learning rate that
damages the control flatters that ratio; see docs/study.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from retrofit.study.tables import fmt

HERE = Path(__file__).resolve().parent
# name: (method, batch size, learning rate, extra study.py flags)
CONFIGS = {
    "b2-lr1e-3": ("full", 2, 1e-3, ["--no-variants"]),
    "b2-lr3e-4": ("full", 2, 3e-4, ["--no-variants"]),
    "b1-lr3e-4": ("full", 1, 3e-4, ["--no-variants"]),
    "b2-lr3e-4-var": ("full", 2, 3e-4, []),
    "b2-lr5e-4": ("full", 2, 5e-4, ["--no-variants"]),
    "b4-lr3e-4-var": ("full", 4, 3e-4, []),
    "b2-lr1.5e-4-var": ("full", 2, 1.5e-4, []),
    "lora-b2-lr1e-3-emb": ("lora", 2, 1e-3, ["--no-variants", "--lora-embeddings"]),
    "lora-b2-lr5e-4-emb": ("lora", 2, 5e-4, ["--no-variants", "--lora-embeddings"]),
    "lora-b2-lr1e-3": ("lora", 2, 1e-3, ["--no-variants", "--no-lora-embeddings"]),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="runs/sweep")
    p.add_argument("--out", default="benchmarks/study_recipe_sweep.json")
    p.add_argument("--cached-only", action="store_true")
    args = p.parse_args(argv)
    spec = importlib.util.spec_from_file_location("study", HERE / "study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    rows = []
    for name, (method, batch, lr, extra) in CONFIGS.items():
        out = Path(args.runs) / f"{name}.json"
        flags = ["--part", "gpt2", "--schemes", "alibi", "--methods", method, "--budgets", "0.02", "--multiples", "1",
                 "--eval-budget", "8192", "--batch-size", str(batch), f"--lr-{method}", str(lr),
                 "--runs", str(Path(args.runs) / name), "--out", str(out), *extra]
        study.main(flags + (["--cached-only"] if args.cached_only else []))
        gpt2 = json.loads(out.read_text())["gpt2"]
        table, native = gpt2["table"], gpt2["stand_in"]["native_length"]
        control = next((r for r in table if r["cell"].startswith("control")), {})
        for r in table:
            if r["cell"].startswith(("original", "control")):
                continue
            rows.append({"config": name, "method": method, "batch_size": batch, "learning_rate": lr,
                         "lora_embeddings": "--lora-embeddings" in extra, "cell": r["cell"],
                         "steps": r.get("extra_tokens", 0) // (native * batch),
                         "objective": r.get("objective"), "fade": r.get("fade"), "extra_tokens": r.get("extra_tokens"),
                         "ppl@1x": r.get("ppl@1x"), "control_ppl@1x": control.get("ppl@1x"),
                         "vs_control@1x": r.get("vs_control@1x"), "vs_original@1x": r.get("vs_original@1x"),
                         "error": r.get("error")})
    original = next(r for r in table if r["cell"].startswith("original"))["ppl@1x"]
    result = {"command": "python scripts/study_sweep.py", "original_ppl@1x": original, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1))
    md = ["| config | cell | steps x batch | lr | ppl@1x | control ppl@1x | vs control | vs original |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['config']} | {r['cell']} | {r['steps']} x {r['batch_size']} | "
                  f"{r['learning_rate']:g} | {fmt(r['ppl@1x'])} | {fmt(r['control_ppl@1x'])} | "
                  f"{fmt(r['vs_control@1x'])} | {fmt(r['vs_original@1x'])} |")
    Path(args.out).with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
