"""Hold `retrofit finetune --plan`'s memory formula against measured peaks on small models here.

Two ~13M-parameter models (a GPT-2 converted to ALiBi, a LLaMA with YaRN x4), LoRA and full, run as a user
runs them: `retrofit finetune` (one process) and `accelerate launch --config_file recipes/accelerate/X.yaml`
(two CPU processes: DDP, FSDP2, FSDP2 + offload). Measured: each rank's peak RSS minus its RSS before the
model was loaded (summary.json's peak_memory_mib); on a CPU machine device and host memory are the same
RSS, so the prediction compared is device_total + host_per_process. What the formula does not count, the
runtime's own growth after the baseline (lazy imports, thread pools, allocator), is measured by the same
route with the 0.1M-parameter tiny-gpt2 (the floor) and subtracted.

    python research/check_plan.py --out benchmarks/plan_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
import yaml

from harness import RECIPES, command, stamp, write_record

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = [str(STDLIB / f) for f in ("textwrap.py", "shlex.py", "string.py", "heapq.py", "argparse.py", "inspect.py")]
ROUTE_CONFIG = {"single": None, "ddp": "ddp.yaml", "fsdp": "fsdp.yaml", "fsdp+offload": "fsdp-offload.yaml"}


def build_models(root: Path) -> dict[str, Path]:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from retrofit.models.builtin import byte_tokenizer

    torch.manual_seed(0)
    made = {
        "gpt2": GPT2LMHeadModel(
            GPT2Config(
                n_layer=4, n_embd=512, n_head=8, n_positions=1024, vocab_size=257, bos_token_id=256, eos_token_id=256
            )
        ),
        "llama": LlamaForCausalLM(
            LlamaConfig(
                vocab_size=257,
                hidden_size=512,
                intermediate_size=1376,
                num_hidden_layers=4,
                num_attention_heads=8,
                num_key_value_heads=4,
                max_position_embeddings=256,
                bos_token_id=256,
                eos_token_id=256,
            )
        ),
    }
    out = {}
    for name, model in made.items():
        model.save_pretrained(root / name)
        byte_tokenizer().save_pretrained(root / name)
        out[name] = root / name
    return out


CONVERT = {
    "gpt2": {"scheme": "alibi", "options": {}},
    "llama": {"scheme": "rope", "options": {"scaling": "yarn", "factor": 4.0}},
}


def recipe(model: Path, kind: str, method: str, out: Path, batch: int, block: int) -> dict:
    return {
        "model": {"name_or_path": str(model)},
        "convert": CONVERT[kind],
        "data": {"files": FILES, "block_length": block, "validation_fraction": 0.2, "max_validation_blocks": 2},
        "train": {
            "method": method,
            "lora": {"r": 16, "alpha": 32, "dropout": 0.0},
            "train_norms": True,
            "steps": 3,
            "batch_size": batch,
            "learning_rate": 1e-4,
            "warmup_steps": 0,
            "seed": 0,
        },
        "checkpoint": {"every": 0},
        "output_dir": str(out),
    }


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(route: str, r: dict, where: Path) -> dict:
    path = where / f"{Path(r['output_dir']).name}.yaml"
    path.write_text(yaml.safe_dump(r))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if ROUTE_CONFIG[route] is None:
        cmd = [sys.executable, "-m", "retrofit", "finetune", str(path)]
    else:
        cmd = [
            str(Path(sys.executable).parent / "accelerate"),
            "launch",
            "--config_file",
            str(RECIPES / "accelerate" / ROUTE_CONFIG[route]),
            "--main_process_port",
            str(_port()),
            "-m",
            "retrofit",
            "finetune",
            str(path),
        ]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if res.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
    s = json.loads((Path(r["output_dir"]) / "summary.json").read_text())
    peak = s["peak_memory_mib"]
    used = [a - b for a, b in zip(peak["rss"], peak["rss_before_model"])]
    return {
        "route": s["route"],
        "measured_mib": round(max(used), 1),
        "per_rank_mib": [round(u, 1) for u in used],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/plan_check.json")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--block", type=int, default=512)
    args = ap.parse_args()
    from retrofit.training.plan import Run, estimate, shape_of_recipe
    from retrofit.training.recipe import Recipe

    rows, floors = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        models = build_models(tmp)
        for route in ROUTE_CONFIG:
            r = recipe(Path("tiny-gpt2"), "gpt2", "lora", tmp / f"floor-{route.replace('+', '-')}", args.batch, 128)
            r["model"]["name_or_path"] = "tiny-gpt2"
            floors[route] = run(route, r, tmp)["measured_mib"]
            print(f"floor {route}: {floors[route]} MiB", flush=True)
        for kind, model in models.items():
            for method in ("lora", "full"):
                for route in ROUTE_CONFIG:
                    r = recipe(
                        model, kind, method, tmp / f"{kind}-{method}-{route.replace('+', '-')}", args.batch, args.block
                    )
                    rec = Recipe.coerce(r)
                    processes = 1 if route == "single" else 2
                    e = estimate(shape_of_recipe(rec), Run.of(rec), route, processes)
                    predicted = (e["device_total"] + e["host_per_process"]) / 2**20
                    got = run(route, r, tmp)
                    net = got["measured_mib"] - floors[route]
                    row = {
                        "model": kind,
                        "method": method,
                        "processes": processes,
                        **got,
                        "floor_mib": floors[route],
                        "measured_minus_floor_mib": round(net, 1),
                        "predicted_mib": round(predicted, 1),
                        "ratio": round(net / predicted, 3),
                        "parts_mib": {
                            k: round(e[k] / 2**20, 1)
                            for k in ("weights", "gradients", "optimizer", "activations", "logits", "host_per_process")
                        },
                    }
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    out = {
        "command": command(__file__, ["--out", args.out]),
        "floors_mib": floors,
        "setup": f"2-core CPU, batch {args.batch} x {args.block} tokens per process, 3 steps, fp32, no gradient "
        "checkpointing; measured = peak RSS - RSS before the model load (max over ranks)",
        "torch": torch.__version__,
        **stamp(),
        "rows": rows,
    }
    write_record(args.out, out)


if __name__ == "__main__":
    main()
