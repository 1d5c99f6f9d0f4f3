"""The grids of the committed study reports (``benchmarks/study*.json/.md/.png``), rebuilt from their caches.

    python research/study.py                  # every report below
    python research/study.py study3_gpt2      # one report: benchmarks/study3_gpt2.{json,md} and its plot

Each report is a round of the study (method and findings: docs/study.md): a grid on a stand-in (budgets as
fractions of its pretraining tokens) against the original and the continued-training control, or the
SmolLM2 runs. This file holds only what each report holds and the settings its cells ran with; the cells
come from the round's cache (``runs``; where it is empty, the report's own cells go back into it first, when
it was measured on the same stand-in with the same settings), and the tables, markdown and plot are
``study_rounds``'s (``research/study_rounds.py``). Nothing is trained here: a new study is ``retrofit study GRID.yaml``.
"""

from __future__ import annotations

import argparse
import logging

from harness import STANDINS, command
from study_rounds import Round, rebuild

# rounds 2 and 3: the 10M stand-ins, 16 blocks a step
ROUND2 = dict(batch_size=16, lr_full=3e-4, lr_lora=1e-3, variants=False)
BUDGETS2 = [0, 0.005, 0.02, 0.1]
YARN16_LONG = "rope:scaling=yarn;factor=16;block=4096"

ROUNDS = {
    # round 1: SmolLM2-135M (RoPE, native 8k), rebuilt: (label in the report, cache file under runs/study/smollm2/);
    # and the first stand-in's grid (every scheme, 2 blocks a step, the variants), kept as it was measured (from before
    # the reports recorded their stand-in's hash and settings and the passkey test: rebuilt, it would gain them)
    "study": Round(
        out="benchmarks/study.json",
        part="smollm2",
        passkey_trials=0,
        schemes=["alibi", "rope", "t5", "shaw", "nope", "fire", "sinusoidal"],
        smollm2=[
            ("original", "original"),
            ("rope-yarnx4-no-finetune", "rope-yarnx4"),
            ("rope-ntkx4-no-finetune", "rope-ntkx4"),
            ("alibi-no-finetune", "alibi-no-finetune"),
            ("alibi-lora-100", "alibi-lora-100"),
            ("rope-yarn-native1024-lora-100", "rope-yarn-native1024-lora-100"),
            ("rope-yarnx4-lora-30", "rope-yarnx4-lora-30"),
            ("control-lora-100", "control-lora-100"),
            ("control-lora-30-long", "control-lora-30-long"),
            ("nope-no-finetune", "nope"),
            ("nope-temperature0.1-no-finetune", "nope-temperature0.1"),
            ("rope-yarnx4-temperature0.1-no-finetune", "rope-yarnx4-temperature0.1"),
            ("rope-temperature0.1-no-finetune", "rope-temperature0.1"),
        ],
    ),
    # round 1, part 1, first grid: the first GPT-2 stand-in, 8 blocks a step, no passkey test yet; its plot's name is
    # the one of study.json's stand-in part (benchmarks/study_gpt2_ppl_vs_length.png), so it draws none
    "study_gpt2": Round(
        out="benchmarks/study_gpt2.json",
        schemes=["alibi", "rope", "t5", "nope"],
        methods=["full"],
        budgets=[0, 0.1],
        multiples=[1, 4, 16],
        eval_budget=8192,
        variants=False,
        batch_size=8,
        lr_full=3e-4,
        lora_embeddings=False,
        passkey_trials=0,
        plot=False,
    ),
    # round 2: every scheme on the GPT-2 and the LLaMA stand-in of the same size and data
    "study2_gpt2": Round(
        out="benchmarks/study2_gpt2.json",
        preset="study2-gpt2",
        runs="runs/study2-gpt2",
        budgets=BUDGETS2,
        schemes=[
            "alibi",
            "rope",
            "t5",
            "shaw",
            "nope",
            "fire",
            "sinusoidal",
            "xl",
            "rope-pose=rope:pose=8192",
            "fire-pose=fire:pose=8192",
            "sinusoidal-pose=sinusoidal:pose=8192",
        ],
        seeds=[1, 2],
        seed_labels=["alibi", "t5", "rope"],
        seed_methods=["full"],
        passkey_trials=5,
        **ROUND2,
    ),
    "study_llama": Round(
        out="benchmarks/study_llama.json",
        preset="study2-llama",
        runs="runs/study2-llama",
        budgets=BUDGETS2,
        zero_shot_only=["dynamic"],
        schemes=[
            "pi=rope:scaling=linear;factor=32",
            "ntk=rope:scaling=ntk;factor=32",
            "yarn=rope:scaling=yarn;factor=32",
            "dynamic=rope:scaling=dynamic;factor=32",
            "nope",
            "nope-temp-qk=nope:temperature=0.1;qk_norm=true",
            "alibi",
            "yarn-pose=rope:scaling=yarn;factor=32;pose=8192",
        ],
        seeds=[1, 2],
        seed_labels=["yarn", "alibi", "yarn-pose"],
        seed_methods=["full"],
        passkey_trials=5,
        **ROUND2,
    ),
    # round 3: long blocks, calibration, a teacher, the extended table. Each report began as a copy of the round-2
    # report of its stand-in and grew over several grids: the cells this grid lacks come back from the report itself
    "study3_gpt2": Round(
        out="benchmarks/study3_gpt2.json",
        preset="study2-gpt2",
        runs="runs/study3-gpt2",
        budgets=[0, 0.02],
        methods=["full"],
        passkey_budgets="none",
        zero_shot_only=["extend-copy0", "extend-interp"],
        schemes=[
            "alibi",
            "t5",
            "extend-copy=extend:length=8192;init=copy",
            "extend-copy0=extend:length=8192;init=copy;copy_from=0",
            "extend-interp=extend:length=8192;init=interpolate",
            "extend-copy-long=extend:length=8192;init=copy;block=4096",
            "alibi-long=alibi:block=4096",
            "alibi-cal=alibi:learn_slopes=true;calibrate=200",
            "t5-cal=t5:calibrate=200",
        ],
        seeds=[1, 2],
        seed_labels=["t5-cal"],
        seed_budgets=[0.02],
        seed_methods=["full"],
        **ROUND2,
    ),
    "study3_llama": Round(
        out="benchmarks/study3_llama.json",
        preset="study2-llama",
        runs="runs/study3-llama",
        budgets=[0, 0.02],
        methods=["full"],
        passkey_budgets="none",
        schemes=[
            "yarn=rope:scaling=yarn;factor=32",
            "yarn-pose=rope:scaling=yarn;factor=32;pose=8192",
            "alibi",
            "yarn-long=rope:scaling=yarn;factor=32;block=4096",
            f"yarn16-long={YARN16_LONG}",
            f"yarn16-long-kd={YARN16_LONG};objective=both",
            f"yarn16-long-distill={YARN16_LONG};objective=distill",
            "alibi-cal=alibi:learn_slopes=true;calibrate=200",
        ],
        **ROUND2,
    ),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME", help=f"reports to rebuild (default: all): {', '.join(ROUNDS)}")
    names = p.parse_args(argv).names or list(ROUNDS)
    if set(names) - set(ROUNDS):
        p.error(f"no such report: {', '.join(sorted(set(names) - set(ROUNDS)))}; the reports: {', '.join(ROUNDS)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for name in names:
        print("wrote", ", ".join(rebuild(ROUNDS[name], command(__file__, [name]), STANDINS)))


if __name__ == "__main__":
    main()
