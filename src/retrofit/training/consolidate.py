"""Full weights from a training checkpoint on one process: ``retrofit finetune RECIPE --final-from CKPT``.

A fine-tune writes ``final/`` itself at the end. This reads any ``checkpoints/step_N/`` folder the loop
wrote, whatever route wrote it, and builds ``final/`` (and ``adapter/``) from it without launching the
processes again: after a run that was stopped, or a DeepSpeed run saved without the gathered 16-bit
weights. Layouts read:

- ``model.safetensors``: one process or DDP (Accelerate's ``save_state``);
- ``pytorch_model_fsdp_0/``: FSDP sharded state dict (torch.distributed.checkpoint), read without a
  process group into the rebuilt model's own state dict;
- ``pytorch_model/*_model_states.pt`` + ``*_optim_states.pt``: DeepSpeed ZeRO-3. The fp32 master weights
  are the flat partitions of the optimizer files: parameter p of n elements takes ceil(n / world)
  elements from each rank's partition, in ``param_shapes`` order, the last rank padded; frozen
  parameters are kept as one fragment per rank in the model files, buffers in rank 0's ``module``.
"""

from __future__ import annotations

import logging
import math
import pickle
from pathlib import Path

import torch

from ..foundation.errors import RetrofitError

log = logging.getLogger(__name__)

FSDP_DIR, ZERO_DIR, PLAIN = "pytorch_model_fsdp_0", "pytorch_model", "model.safetensors"


def layout(folder: Path) -> str:
    """'plain', 'fsdp' or 'zero3' (RetrofitError when the folder holds none of them)."""
    if (folder / PLAIN).is_file():
        return "plain"
    if (folder / FSDP_DIR / ".metadata").is_file():
        return "fsdp"
    if list((folder / ZERO_DIR).glob("*_model_states.pt")):
        return "zero3"
    raise RetrofitError(
        f"{folder} holds no model weights retrofit can read: expected {PLAIN}, {FSDP_DIR}/ (FSDP) or "
        f"{ZERO_DIR}/*_model_states.pt (DeepSpeed); pass a checkpoints/step_N folder of a fine-tune"
    )


def read(folder: Path, template: dict[str, torch.Tensor], trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The full state dict in ``folder`` (keys of ``template``, the rebuilt model's state dict)."""
    kind = layout(folder)
    log.info("reading %s checkpoint %s", kind, folder)
    if kind == "plain":
        from safetensors.torch import load_file

        return load_file(folder / PLAIN)
    if kind == "fsdp":
        return _read_dcp(folder / FSDP_DIR, template)
    return read_zero3(folder / ZERO_DIR, trust_pickle)


def _read_dcp(folder: Path, template: dict) -> dict:
    import torch.distributed.checkpoint as dcp

    state = {"model": {k: v.detach().clone() for k, v in template.items()}}  # filled in place
    dcp.load(state, checkpoint_id=str(folder))  # no process group: read as one process
    return state["model"]


def _load(path: Path, trust_pickle: bool) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if not trust_pickle:
            raise RetrofitError(
                f"{path} holds Python objects besides tensors (DeepSpeed stores its enums and loss scaler "
                "there), which retrofit does not unpickle by default; if this is your own run's checkpoint, "
                "pass --trust-pickle"
            ) from e
        return torch.load(path, map_location="cpu", weights_only=False)


def _rank_files(folder: Path, suffix: str) -> list[Path]:
    def rank(p: Path) -> int:
        return int(p.name.split("zero_pp_rank_")[1].split("_")[0])

    return sorted(folder.glob(f"*zero_pp_rank_*{suffix}"), key=rank)


def read_zero3(folder: Path, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """fp32 weights of a DeepSpeed ZeRO-3 checkpoint folder (see the module doc for the layout)."""
    models = [_load(p, trust_pickle) for p in _rank_files(folder, "_model_states.pt")]
    optims = [_load(p, trust_pickle)["optimizer_state_dict"] for p in _rank_files(folder, "_optim_states.pt")]
    if not optims or len(models) != len(optims):
        raise RetrofitError(f"{folder}: {len(models)} model-state files but {len(optims)} optimizer-state files")
    world, stage = optims[0]["partition_count"], int(optims[0]["zero_stage"])
    world = max(world) if isinstance(world, (list, tuple)) else int(world)
    if stage != 3 or world != len(optims):
        raise RetrofitError(
            f"{folder}: ZeRO stage {stage} over {world} ranks with {len(optims)} files; "
            "retrofit reads ZeRO-3 checkpoints with every rank's files"
        )
    first = models[0]
    state = {k: v for k, v in first["module"].items() if k in set(first["buffer_names"])}  # buffers
    for name, shape in (first.get("frozen_param_shapes") or {}).items():
        pieces = torch.cat([m["frozen_param_fragments"][name].flatten() for m in models])
        state[name] = pieces[: shape.numel()].view(shape).clone()
    flats = [torch.cat([g.flatten() for g in o["fp32_flat_groups"]]) for o in optims]  # one per rank
    offset = 0
    for name, shape in {k: v for group in first["param_shapes"] for k, v in group.items()}.items():
        n = shape.numel()
        part = math.ceil(n / world)
        state[name] = torch.cat([f[offset : offset + part] for f in flats])[:n].view(shape).clone()
        offset += part
    if offset != flats[0].numel():
        raise RetrofitError(
            f"{folder}: the parameter shapes use {offset} of {flats[0].numel()} elements of "
            "each rank's partition; the files do not belong together"
        )
    for alias, source in dict(first.get("shared_params") or {}).items():
        if source in state:
            state[alias] = state[source]
    return state
