"""The classes ``retrofit.models.auto.register`` gives transformers for ``model_type: retrofit``."""

from __future__ import annotations

import os

from transformers import PretrainedConfig

from ..foundation.errors import RetrofitError
from ..patch.saved_config import SAVED_MODEL_TYPE as MODEL_TYPE


class RetrofitConfig(PretrainedConfig):
    """A saved retrofit config: the base model's keys (its length key = the converted model's reach)
    plus the ``retrofit`` block. It only leads transformers to ``RetrofitForCausalLM``; the model is
    built from ``retrofit.base_config``."""

    model_type = MODEL_TYPE


class RetrofitForCausalLM:
    """What ``AutoModelForCausalLM`` (and each task's Auto class: ``for_task``) uses for a retrofit checkpoint: it
    returns ``retrofit.load``'s model (the base architecture's own class, converted), never an instance of this
    class. ``AutoModel`` (embeddings: sentence-transformers) gets the converted model's base model."""

    config_class = RetrofitConfig
    task = "causal-lm"

    def __init__(self, *args, **kwargs):
        raise TypeError(
            "load a retrofit checkpoint with AutoModelForCausalLM.from_pretrained(path) or retrofit.load(path)"
        )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, config=None, **kwargs):
        from ..foundation import task
        from ..patch.conversion import encoder_of  # not at import: this module loads inside transformers' own
        from .io import load

        if args:
            raise RetrofitError("a retrofit checkpoint takes keyword arguments only (dtype=, device_map=, ...)")
        model = load(_local_folder(pretrained_model_name_or_path, kwargs), **_load_kwargs(kwargs))
        if cls.task == "embeddings":
            return encoder_of(model)  # the encoder's hidden states (its head, if any, stays with the full model)
        saved = task.of_model(model).name
        if saved != cls.task:
            raise RetrofitError(
                f"{pretrained_model_name_or_path} is a converted {saved} model ({type(model).__name__}); load it "
                f"with {task.by_name(saved).auto_class} (or AutoModel for its encoder's hidden states), or "
                "retrofit.load(path)"
            )
        return model


def for_task(name: str) -> type:
    """The stand-in class for one task's Auto class (``task.TASKS``)."""
    from ..foundation.task import retrofit_class_name

    return (
        RetrofitForCausalLM
        if name == "causal-lm"
        else type(retrofit_class_name(name), (RetrofitForCausalLM,), {"task": name})
    )


_HUB_KWARGS = ("revision", "cache_dir", "token", "local_files_only", "force_download", "proxies")
_LOAD_KWARGS = ("dtype", "torch_dtype", "device_map", "low_cpu_mem_usage")
# passed by transformers' Auto classes or meaningless here (no remote code is ever run for a retrofit checkpoint)
_IGNORED = ("trust_remote_code", "adapter_kwargs", "code_revision", "_from_auto", "_commit_hash", "use_safetensors")


def _local_folder(name_or_path, kwargs: dict) -> str:
    """A local folder as is (``subfolder`` inside it); a Hub id: the checkpoint's own files downloaded first
    (not an inexact ``native/`` export, the eval report or plots)."""
    sub = kwargs.get("subfolder") or ""
    if os.path.isdir(name_or_path):
        return os.path.join(str(name_or_path), sub)
    from huggingface_hub import snapshot_download

    hub = {k: kwargs[k] for k in _HUB_KWARGS if kwargs.get(k) is not None}
    pattern = f"{sub}/*" if sub else "*"
    local = snapshot_download(str(name_or_path), allow_patterns=[pattern], ignore_patterns=["*.png", "*.md"], **hub)
    return os.path.join(local, sub)


def _load_kwargs(kwargs: dict) -> dict:
    unknown = sorted(
        k for k, v in kwargs.items() if v is not None and k not in (*_HUB_KWARGS, *_LOAD_KWARGS, *_IGNORED, "subfolder")
    )
    if unknown:  # e.g. quantization_config, gguf_file, attn_implementation: refused, never dropped silently
        raise RetrofitError(
            f"a retrofit checkpoint cannot be loaded with {', '.join(unknown)}: load it with "
            "retrofit.load(path, dtype=..., device_map=...) or export it (retrofit export --native)"
        )
    out = {k: kwargs[k] for k in _LOAD_KWARGS if kwargs.get(k) is not None}
    if "torch_dtype" in out:
        out.setdefault("dtype", out.pop("torch_dtype"))
    return out
