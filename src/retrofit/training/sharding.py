"""Sharded fine-tunes: which route a run takes under ``accelerate launch``, and the CPU FSDP2 route.

Accelerate turns FSDP on only for accelerator devices: launched with an FSDP config on CPU processes
(gloo), it silently runs plain DDP. ``cpu_route`` makes such a run what its config asks for:
the Accelerator's state is switched to FSDP with the plugin Accelerate reads from the launch
environment (``FSDP_*`` variables), so ``prepare`` shards the model with ``fully_shard`` (FSDP2),
``save_state`` writes sharded checkpoints and ``get_state_dict`` gathers the full weights. FSDP
version 1 is refused on CPU (use version 2). On GPUs Accelerate's own route runs unchanged.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager

from ..foundation.errors import RecipeError

log = logging.getLogger(__name__)


def fsdp_requested() -> bool:
    """An FSDP config was launched (``accelerate launch`` sets ACCELERATE_USE_FSDP from it)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def deepspeed_requested() -> bool:
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


@contextmanager
def whole_models():
    """Under DeepSpeed ZeRO-3, load models whole on every rank: each rank converts its own instance
    (weight surgery reads full shapes) before ``prepare`` partitions it. Accelerate registers a
    transformers DeepSpeed config that makes ``from_pretrained`` partition at load (zero.Init) even when
    the launch config says ``zero3_init_flag: false``; it is set aside here and put back after."""
    if not deepspeed_requested():
        yield
        return
    from transformers.integrations import deepspeed as hf_ds

    kept = hf_ds._hf_deepspeed_config_weak_ref
    hf_ds.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = kept


def cpu_route(acc, mixed_precision: str) -> None:
    """CPU processes launched with a sharding config: FSDP switches ``acc`` from DDP to FSDP2 (see the
    module doc); DeepSpeed is refused (Accelerate runs it on accelerator devices only: with ``cpu=True``
    it would silently run DDP, without it a single process while DeepSpeed counts two)."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if acc.distributed_type != DistributedType.MULTI_CPU:
        return
    if deepspeed_requested():
        raise RecipeError(
            "the accelerate config asks for DeepSpeed, which Accelerate runs on GPUs only; on CPU processes "
            "use recipes/accelerate/fsdp.yaml (FSDP2 over gloo) or recipes/accelerate/ddp.yaml"
        )
    if not fsdp_requested():
        return
    plugin = FullyShardedDataParallelPlugin()  # reads FSDP_VERSION, FSDP_OFFLOAD_PARAMS, ... like Accelerate
    if plugin.fsdp_version != 2:
        raise RecipeError(
            f"the accelerate config asks for FSDP version {plugin.fsdp_version} on CPU processes; retrofit shards "
            "CPU runs with FSDP2 (fully_shard) only: set 'fsdp_version: 2' in the config "
            "(recipes/accelerate/fsdp.yaml)"
        )
    if mixed_precision != "no":
        plugin.set_mixed_precision(mixed_precision)
    if _offloads(plugin):  # no accelerator to pin host memory for: the shards simply stay in CPU memory
        from torch.distributed.fsdp import CPUOffloadPolicy

        plugin.cpu_offload = CPUOffloadPolicy(pin_memory=False)
    from accelerate.state import PartialState

    acc.state.fsdp_plugin = plugin
    acc.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # as Accelerate does on GPUs: every
    # AcceleratorState() re-reads it from PartialState
    log.info(
        "%s on %d CPU processes over gloo: Accelerate enables FSDP only on accelerator devices, so "
        "retrofit switched this run from DDP to FSDP2 (fully_shard)",
        route(acc),
        acc.num_processes,
    )


def route(acc) -> str:
    """What the run does with its processes, for the log and summary.json: 'single', 'ddp',
    'fsdp2', 'fsdp2+offload', 'fsdp1', 'deepspeed'."""
    from accelerate.utils import DistributedType

    t = acc.distributed_type
    if t == DistributedType.FSDP:
        plugin = acc.state.fsdp_plugin
        return f"fsdp{plugin.fsdp_version}" + ("+offload" if _offloads(plugin) else "")
    if t == DistributedType.DEEPSPEED:
        return "deepspeed"
    return "single" if acc.num_processes == 1 else "ddp"


def _offloads(plugin) -> bool:
    """The plugin offloads parameters to the CPU (FSDP2's CPUOffloadPolicy, FSDP1's CPUOffload)."""
    off = plugin.cpu_offload
    return type(off).__name__ in ("CPUOffloadPolicy", "CPUOffload") and bool(getattr(off, "offload_params", True))


def is_sharded(acc) -> bool:
    return route(acc).startswith(("fsdp", "deepspeed"))


def sharded_parameters(model) -> dict:
    """How the prepared model's parameters are held: {'sharded': n, 'unsharded': [names]} (FSDP2 turns
    each parameter it manages into a DTensor; the position parameters must be among them)."""
    from torch.distributed.tensor import DTensor

    names = [n for n, p in model.named_parameters()]
    plain = [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]
    return {"sharded": len(names) - len(plain), "unsharded": plain}


_BASELINE_MIB = [0.0]


def rss_mib() -> float:
    """This process's resident set size now, MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def mark_baseline() -> None:
    """Remember the RSS before the model is loaded (what the runtime and libraries take)."""
    _BASELINE_MIB[0] = rss_mib() if os.path.exists("/proc/self/statm") else 0.0


def peak_memory_mib(acc) -> dict:
    """Peak memory of every process in MiB (collective): resident set size (ru_maxrss), the RSS before
    the model was loaded, and the accelerator's peak allocation where there is one."""
    import resource

    import torch

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    dev = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else -1.0
    mine = [rss, _BASELINE_MIB[0], dev]
    every = acc.gather(torch.tensor([mine], dtype=torch.float64, device=acc.device)).cpu().tolist()
    out = {"rss": [round(x[0], 1) for x in every], "rss_before_model": [round(x[1], 1) for x in every]}
    if every[0][2] >= 0:
        out["device"] = [round(x[2], 1) for x in every]
    return out


def clip_grad_norm(acc, params, max_norm: float):
    """Clip ``params``' gradients to ``max_norm`` by the norm of the whole gradient; return that norm.
    Under FSDP2 the gradients are DTensor shards: the norm is taken over every shard (``full_tensor``).
    (Accelerate's FSDP branch compares the list with ``model.parameters()`` by ``==``, which fails
    on a list that is not exactly the model's, e.g. without a frozen table.)"""
    import torch

    if not route(acc).startswith("fsdp2"):
        return acc.clip_grad_norm_(params, max_norm)
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
    coef = min(1.0, max_norm / (norm.item() + 1e-6))
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return norm


def cpu_processes() -> bool:
    """Several processes and no GPU: tell Accelerate to use CPU processes over gloo (it does not
    infer that under torchrun / ``accelerate launch --multi_gpu`` on a CPU-only machine)."""
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    xpu = hasattr(torch, "xpu") and torch.xpu.is_available()
    return world > 1 and not torch.cuda.is_available() and not xpu
