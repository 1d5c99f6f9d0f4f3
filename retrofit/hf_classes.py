"""The classes ``retrofit.auto.register`` gives transformers for ``model_type: retrofit``."""

from __future__ import annotations

import os

from transformers import PretrainedConfig

from .auto import MODEL_TYPE


class RetrofitConfig(PretrainedConfig):
    """A saved retrofit config: the base model's keys (its length key = the converted model's reach)
    plus the ``retrofit`` block. It only leads transformers to ``RetrofitForCausalLM``; the model is
    built from ``retrofit.base_config``."""

    model_type = MODEL_TYPE


class RetrofitForCausalLM:
    """What ``AutoModelForCausalLM`` uses for a retrofit checkpoint: it returns ``retrofit.load``'s
    model (the base architecture's own class, converted), never an instance of this class."""

    config_class = RetrofitConfig

    def __init__(self, *args, **kwargs):
        raise TypeError("load a retrofit checkpoint with AutoModelForCausalLM.from_pretrained(path) or retrofit.load(path)")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, config=None, **kwargs):
        from .io import load

        return load(_local_folder(pretrained_model_name_or_path, kwargs), **_load_kwargs(kwargs))


_HUB_KWARGS = ("revision", "cache_dir", "token", "local_files_only", "force_download", "proxies")
_LOAD_KWARGS = ("dtype", "torch_dtype", "device_map", "low_cpu_mem_usage")


def _local_folder(name_or_path, kwargs: dict) -> str:
    """A local folder as is; a Hub id downloaded (snapshot) first."""
    if os.path.isdir(name_or_path):
        return str(name_or_path)
    from huggingface_hub import snapshot_download

    return snapshot_download(str(name_or_path), **{k: kwargs[k] for k in _HUB_KWARGS if kwargs.get(k) is not None})


def _load_kwargs(kwargs: dict) -> dict:
    if kwargs.get("attn_implementation"):
        raise ValueError("a retrofit checkpoint runs retrofit's attention; do not pass attn_implementation")
    out = {k: kwargs[k] for k in _LOAD_KWARGS if kwargs.get(k) is not None}
    if "torch_dtype" in out:
        out.setdefault("dtype", out.pop("torch_dtype"))
    return out
