"""Figures for sharded fine-tunes: the cases of tests/training/test_sharded.py (the same tiny models, recipes and
`accelerate launch --config_file recipes/accelerate/X.yaml -m retrofit finetune` commands) against one
process over the same global batch, with the differences the tests bound written out as numbers.

    python research/check_sharded.py --out benchmarks/sharded.json

The cases, models and recipe are written here as in the test (a script imports no test);
``tests/test_research.py`` holds the two to the same definitions.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
import yaml

import retrofit
from harness import RECIPES, command, stamp, write_record
from retrofit.models.builtin import TINY_GPT2, byte_tokenizer

CONFIGS = RECIPES / "accelerate"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = [str(STDLIB / f) for f in ("textwrap.py", "shlex.py", "string.py", "heapq.py", "bisect.py", "fnmatch.py")]
STEPS, EVERY = 8, 2
CASES = {  # id: (model, scheme, options, method, accelerate config)
    "gpt2-alibi-lora": ("gpt2", "alibi", {"kernel": "chunked"}, "lora", "fsdp.yaml"),
    "gpt2-alibi-full": ("gpt2", "alibi", {"kernel": "chunked"}, "full", "fsdp.yaml"),
    "gpt2-t5-lora": ("gpt2", "t5", {}, "lora", "fsdp.yaml"),
    "llama-yarn-lora": ("llama", "rope", {"scaling": "yarn", "factor": 4.0}, "lora", "fsdp.yaml"),
    "llama-yarn-full": ("llama", "rope", {"scaling": "yarn", "factor": 4.0}, "full", "fsdp-offload.yaml"),
    "gpt2-alibi-lora-ddp": ("gpt2", "alibi", {"kernel": "chunked"}, "lora", "ddp.yaml"),
}


def build_models(root: Path) -> Path:
    """A tiny GPT-2 without dropout (ranks draw different dropout masks) and a tiny LLaMA, each with
    the byte tokenizer, saved like any local model folder under ``root``."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    built = {
        "gpt2": GPT2LMHeadModel(GPT2Config(**TINY_GPT2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
        "llama": LlamaForCausalLM(
            LlamaConfig(
                vocab_size=257,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
                bos_token_id=256,
                eos_token_id=256,
                tie_word_embeddings=False,
            )
        ),
    }
    for name, model in built.items():
        model.save_pretrained(root / name)
        byte_tokenizer().save_pretrained(root / name)
    return root


def recipe(model: Path, scheme: str, options: dict, method: str, out: Path, batch_size: int, **train) -> dict:
    return {
        "model": {"name_or_path": str(model)},
        "convert": {"scheme": scheme, "options": options},
        "data": {"files": FILES, "block_length": 128, "validation_fraction": 0.25, "max_validation_blocks": 4},
        "train": {
            "method": method,
            "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
            "train_norms": True,
            "steps": STEPS,
            "batch_size": batch_size,
            "learning_rate": 3e-3,
            "warmup_steps": 1,
            "seed": 3,
            "log_every": 1,
            **train,
        },
        "checkpoint": {"every": EVERY, "keep_last": 2},
        "output_dir": str(out),
    }


def launch(config: str, r: dict, where: Path) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file recipes/accelerate/CONFIG -m retrofit finetune RECIPE`, as a user types it,
    in its own process group: on a timeout no rank is left behind waiting on gloo for a peer."""
    path = where / f"{Path(r['output_dir']).name}.yaml"
    path.write_text(yaml.safe_dump(r))
    accelerate = Path(sys.executable).parent / "accelerate"  # the console script a user types
    head = [str(accelerate), "launch"] if accelerate.is_file() else [sys.executable, "-m", "accelerate.commands.launch"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [*head, "--config_file", str(CONFIGS / config), "--main_process_port", str(port)]
    cmd += ["-m", "retrofit", "finetune", str(path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=400)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank it started
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _losses(out: Path) -> list[float]:
    return [x["loss"] for x in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in x]


def _logits(folder: Path) -> torch.Tensor:
    model = retrofit.load(folder).eval()
    ids = torch.randint(0, 256, (2, 100), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(input_ids=ids).logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/sharded.json")
    args = ap.parse_args()
    from retrofit.training import finetune

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        models = build_models(tmp)
        for case, (model, scheme, options, method, config) in CASES.items():
            where = tmp / case
            where.mkdir()
            t0 = time.perf_counter()
            res = launch(
                config, recipe(models / model, scheme, options, method, where / "sharded", batch_size=1), where
            )
            if res.returncode:
                raise SystemExit(f"{case} failed:\n{res.stderr[-3000:]}")
            seconds = time.perf_counter() - t0
            single = finetune(recipe(models / model, scheme, options, method, where / "single", batch_size=2))
            s = json.loads((where / "sharded" / "summary.json").read_text())
            one = json.loads((single / "summary.json").read_text())
            a, b = torch.tensor(_losses(where / "sharded")), torch.tensor(_losses(single))
            peak = s["peak_memory_mib"]
            rows.append(
                {
                    "case": case,
                    "accelerate_config": f"recipes/accelerate/{config}",
                    "route": s["route"],
                    "steps": len(a),
                    "max_step_loss_diff": float((a - b).abs().max()),
                    "val_loss_after": [s["val_loss_after"], one["val_loss_after"]],
                    "final_logits_max_diff": float(
                        (_logits(where / "sharded" / "final") - _logits(single / "final")).abs().max()
                    ),
                    "peak_rss_minus_baseline_mib_per_rank": [
                        round(x - y, 1) for x, y in zip(peak["rss"], peak["rss_before_model"])
                    ],
                    "sharded_seconds": round(seconds, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    write_record(
        args.out,
        {"command": command(__file__, ["--out", args.out]), "torch": torch.__version__, **stamp(), "rows": rows},
    )


if __name__ == "__main__":
    main()
