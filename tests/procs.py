"""What the multi-process and kill-and-resume tests share: recipe overrides, a free port, a spawned
fine-tune (a forked child can deadlock in the parent's OpenMP pool), DDP ranks over gloo, a SIGKILL
once the first checkpoint is written (or, in-process, a run stopped dead there), the final weights, and
the warnings a command printed."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from safetensors.torch import load_file

# The suite converts onto the chunked kernel (the reference) unless a test names a kernel or asks for the
# user's default (conftest's ``user_kernel``); the kernel tests check the other kernels. A spawned child
# takes it with ``as_in_tests()``.
TEST_KERNEL = "chunked"


def as_in_tests() -> None:
    """In a spawned child: convert as the test that spawned it does."""
    from retrofit.patch import conversion

    conversion.DEFAULT_KERNEL = TEST_KERNEL


def override(r: dict, over: dict) -> dict:
    """``{"train__steps": 4}`` sets r["train"]["steps"] (nested keys joined by ``__``); returns r."""
    for key, value in over.items():
        node = r
        *parents, last = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return r


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_child(path: str) -> None:
    """A fine-tune in this (spawned) process."""
    from accelerate.state import AcceleratorState

    from retrofit.training import finetune

    as_in_tests()
    AcceleratorState._reset_state(reset_partial_state=True)
    finetune(path)


def ddp_worker(rank: int, path: str, port: int, world: int = 2) -> None:
    """One rank of a CPU DDP run: the environment torchrun / accelerate launch sets up."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    run_child(path)


def run_ranks(path: str, world: int = 2, timeout: float = 240) -> list[int | None]:
    """Spawn ``world`` DDP ranks of the recipe at ``path``; their exit codes."""
    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=ddp_worker, args=(rank, path, port, world)) for rank in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    return [p.exitcode for p in procs]


def kill_at_first_checkpoint(out: Path, target, args: tuple, timeout: float = 240) -> None:
    """Run ``target(*args)`` in a spawned process and SIGKILL it once ``out/checkpoints/step_*`` exists."""
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args)
    proc.start()
    deadline = time.time() + timeout
    try:
        while not list((out / "checkpoints").glob("step_*")) and time.time() < deadline and proc.is_alive():
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.join()
    assert proc.exitcode == -signal.SIGKILL, "the run ended before it could be killed"


class Crash(BaseException):
    """A run that dies right after its first checkpoint, as a SIGKILL would leave it (``crash_after_first_checkpoint``).
    A BaseException: no ``except Exception`` of the run catches it."""


@contextmanager
def crash_after_first_checkpoint():
    """``with crash_after_first_checkpoint(): finetune(...)`` in this process: the run stops as soon as its first
    checkpoint is written, and nothing after that runs (no final/, no summary). For tests of what a re-run resumes
    (the stream's place, the masks drawn, the pipeline's stages); the SIGKILL itself (a process killed at any
    moment) is ``kill_at_first_checkpoint``'s test (tests/training/test_finetune.py)."""
    from retrofit.training import outputs

    real = outputs.save_checkpoint

    def save_then_die(*args, **kwargs):
        real(*args, **kwargs)
        raise Crash

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(outputs, "save_checkpoint", save_then_die)
        try:
            yield
        except Crash:
            return
    raise AssertionError("the run ended before its first checkpoint")


def assert_resume_is_exact(recipe, tmp_path: Path, steps: int) -> None:
    """``recipe(out)`` (a recipe dict writing to ``out``, with checkpoints) fine-tuned whole, and again stopped dead
    after its first checkpoint and resumed: the resumed run started between 0 and ``steps`` and its final weights
    equal the whole run's."""
    import json

    import torch
    import yaml

    from retrofit.training import finetune

    whole = finetune(recipe(tmp_path / "whole"))
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe(tmp_path / "killed")))
    with crash_after_first_checkpoint():
        finetune(path)
    resumed = finetune(path)
    assert 0 < json.loads((resumed / "summary.json").read_text())["resumed_from_step"] < steps
    a, b = final_weights(whole), final_weights(resumed)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)


def final_weights(out: Path) -> dict:
    return load_file(str(out / "final" / "model.safetensors"))


def warnings_in(stderr: str) -> list[str]:
    """The lines of a command's stderr that a user would read as a warning (ours, transformers', accelerate's)."""
    words = ("warning", "LOAD REPORT", "UNEXPECTED", "Removed shared tensor", "accelerate.", "Traceback")
    return [ln for ln in stderr.splitlines() if any(w.lower() in ln.lower() for w in words)]
