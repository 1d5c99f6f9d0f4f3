"""research/memory_table.py's public shapes (``llama_shape``: a LLaMA-architecture shape from its config numbers, the
table's rows) against their published sizes, and the per-parameter bytes ``retrofit.training.plan.estimate`` gives
them. Moved from tests/training/test_plan.py with ``llama_shape`` (#69: research-only code out of the package)."""

import pytest

from memory_table import llama_shape
from retrofit.training.plan import Run, estimate


def test_public_shapes_and_routes():
    """Llama-2-7B as published (6.74B parameters), and the per-parameter bytes the formula implies:
    full fine-tune under DDP holds fp32 weights 4 + gradients 4 + DDP's bucket 4 + AdamW 8 = 20 bytes per
    parameter on every device; FSDP divides the parameter-sized parts by the process count."""
    shape = llama_shape("Llama-2-7B", 32, 4096, 11008, 32, 32, 32000)  # its config.json
    assert shape.params == pytest.approx(6.74e9, rel=0.005)
    run = Run(method="full", block_length=16, batch_size=1)
    ddp = estimate(shape, run, "ddp", 8)
    assert (ddp["weights"] + ddp["gradients"] + ddp["optimizer"]) / shape.params == pytest.approx(20, rel=1e-6)
    fsdp = estimate(shape, run, "fsdp", 8)
    per_param = (fsdp["weights"] + fsdp["gradients"] + fsdp["optimizer"]) / shape.params
    assert 16 / 8 < per_param < 16 / 8 + 2  # the 1/8 shard plus the gathered blocks
    off = estimate(shape, run, "fsdp+offload", 8)
    assert off["optimizer"] == 0 and off["host_per_process"] == pytest.approx(16 * shape.params / 8, rel=1e-6)
    lora = estimate(shape, Run(method="lora"), "ddp", 8)
    assert lora["trainable"] == 16 * 32 * (4 * 4096 + 2 * 8192) + 32 * 2 * 4096 + 4096  # r x sum(in+out) + norms
    with pytest.raises(ValueError, match="route"):
        estimate(shape, run, "zero9", 8)
