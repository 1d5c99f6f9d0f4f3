"""A sharded fine-tune against one process over the same global batch: the tiny models, the recipe, the launch
(``accelerate launch --config_file CONFIG -m retrofit finetune RECIPE``, as a user types it) and the readings
compared. ``research/test_sharded.py`` bounds the differences; ``research/check_sharded.py`` writes them out
(``benchmarks/sharded.json``). Both take their cases from ``CASES``. Shared by the two, run by neither as a script
(research's, not the package's: no user launches it)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

from retrofit.foundation import run_folder
from retrofit.foundation.atomic import write_text
from retrofit.kernels import KERNELS
from retrofit.models.builtin import TINY_LLAMA

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = [str(STDLIB / f) for f in ("textwrap.py", "shlex.py", "string.py", "heapq.py", "bisect.py", "fnmatch.py")]
STEPS, EVERY = 8, 2
CHUNKED = KERNELS[-1].name  # the table's last row: the kernel that serves every call (its name said once, in kernels/)
CASES = {  # id: (model, scheme, options, method, accelerate config under recipes/accelerate/)
    "gpt2-alibi-lora": ("gpt2", "alibi", {"kernel": CHUNKED}, "lora", "fsdp.yaml"),
    "gpt2-alibi-full": ("gpt2", "alibi", {"kernel": CHUNKED}, "full", "fsdp.yaml"),
    "gpt2-t5-lora": ("gpt2", "t5", {}, "lora", "fsdp.yaml"),
    "llama-yarn-lora": ("llama", "rope", {"scaling": "yarn", "factor": 4.0}, "lora", "fsdp.yaml"),
    "llama-yarn-full": ("llama", "rope", {"scaling": "yarn", "factor": 4.0}, "full", "fsdp-offload.yaml"),
    "gpt2-alibi-lora-ddp": ("gpt2", "alibi", {"kernel": CHUNKED}, "lora", "ddp.yaml"),
}
TIMEOUT_S = 400  # one launch, all its processes


def build_models(root: Path) -> Path:
    """A tiny GPT-2 without dropout (ranks draw different dropout masks) and a tiny LLaMA, each with
    the byte tokenizer, saved like any local model folder under ``root``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from retrofit.models.builtin import TINY_GPT2, byte_tokenizer

    torch.manual_seed(0)
    built = {
        "gpt2": GPT2LMHeadModel(GPT2Config(**TINY_GPT2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
        "llama": LlamaForCausalLM(
            LlamaConfig(
                vocab_size=257,
                **TINY_LLAMA,
                max_position_embeddings=64,
                bos_token_id=256,
                eos_token_id=256,
                tie_word_embeddings=False,
            )
        ),
    }
    for name, model in built.items():
        # raw write: the check's tiny models, in the scratch folder it is given
        model.save_pretrained(root / name)
        byte_tokenizer().save_pretrained(root / name)
    return root


def recipe(model: Path, scheme: str, options: dict, method: str, out: Path, **train) -> dict:
    """The fine-tune of one case; ``train`` keys over the case's (the sharded run takes ``batch_size=1`` per process,
    one process 2)."""
    return {
        "model": {"name_or_path": str(model)},
        "convert": {"scheme": scheme, "options": options},
        "data": {"files": FILES, "block_length": 128, "validation_fraction": 0.25, "max_validation_blocks": 4},
        "train": {
            "method": method,
            "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
            "train_norms": True,
            "steps": STEPS,
            "batch_size": 1,
            "learning_rate": 3e-3,
            "warmup_steps": 1,
            "seed": 3,
            "log_every": 1,
            **train,
        },
        "checkpoint": {"every": EVERY, "keep_last": 2},
        "output_dir": str(out),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_command(config: Path, recipe_path: Path) -> list[str]:
    """``accelerate launch --config_file CONFIG --main_process_port PORT -m retrofit finetune RECIPE``: the
    console script a user types where it is installed beside this Python, else its module."""
    accelerate = Path(sys.executable).parent / "accelerate"
    head = [str(accelerate), "launch"] if accelerate.is_file() else [sys.executable, "-m", "accelerate.commands.launch"]
    cmd = [*head, "--config_file", str(config), "--main_process_port", str(free_port())]
    return [*cmd, "-m", "retrofit", "finetune", str(recipe_path)]


def launch_env() -> dict:
    """The environment of a launch: each rank at one thread."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def kill_group(proc: subprocess.Popen) -> None:
    """The launcher and every rank it started, killed; then reaped."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def launch(config: Path, r: dict, where: Path) -> subprocess.CompletedProcess:
    """The recipe ``r`` written under ``where`` and launched with ``config``, in its own process group: on a
    timeout (or an interrupt) no rank is left behind waiting on gloo for a peer."""
    import yaml

    path = where / f"{Path(r['output_dir']).name}.yaml"
    write_text(path, yaml.safe_dump(r))
    cmd = launch_command(config, path)
    proc = subprocess.Popen(
        cmd, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        kill_group(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def losses(out: Path) -> list[float]:
    """The per-step training losses of a run folder's ``log.jsonl``."""
    return [x["loss"] for x in map(json.loads, (out / run_folder.LOG).read_text().splitlines()) if "loss" in x]


def logits(folder: Path):
    """The logits of a saved checkpoint on two fixed random sequences of 100 bytes."""
    import torch

    from retrofit.models.io import load

    model = load(folder).eval()
    ids = torch.randint(0, 256, (2, 100), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(input_ids=ids).logits
