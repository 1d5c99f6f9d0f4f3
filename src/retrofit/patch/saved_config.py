"""What a converted model's config says to the world, kept in one place: its reach (the config's length
key and, when saved, the tokenizer's ``model_max_length``), and ``model_type: retrofit`` in every saved
config.json, so that plain transformers refuses a checkpoint instead of loading the original model
(``retrofit.models.auto`` maps the type back to the converted model). ``revert`` undoes the in-memory part."""

from __future__ import annotations

import json
import types
from pathlib import Path

from ..foundation.atomic import write_text
from ..foundation.errors import RetrofitError
from ..foundation.native import LENGTH_KEYS
from ..foundation.task import of_class, retrofit_class_name

SAVED_MODEL_TYPE = "retrofit"  # config.json's model_type of a saved converted model (hf_classes registers it)

UNBOUNDED = int(1e30)  # transformers' VERY_LARGE_INTEGER: how tokenizers (and lm-eval) spell "no limit"


def base_config(config, previous: dict, class_name: str | None = None) -> dict:
    """The original config values that a saved retrofit config replaces (``load`` restores them to
    build the base model): its model type and architectures (the model's own class where the config names
    none: a classifier loads with its head), and the length key's value."""
    if previous.get("base_config"):
        return dict(previous["base_config"])
    # the model's own class first: a classifier loaded from a masked-LM checkpoint keeps that checkpoint's name
    archs = [class_name] if class_name else list(getattr(config, "architectures", None) or [])
    out = {"model_type": config.model_type, "architectures": archs}
    key = reach_key(config)
    if key:
        out[key] = getattr(config, key)
    return out


def reach_key(config) -> str | None:
    """The attribute under which this config stores ``max_position_embeddings`` (GPT-2: n_positions)."""
    key = getattr(config, "attribute_map", {}).get("max_position_embeddings", "max_position_embeddings")
    return key if hasattr(config, key) else None


def advertise_reach(model, state, length: int) -> None:
    """Make clients that read the config (generate's length cap, lm-evaluation-harness, tokenizer
    truncation) see the converted model's reach, not the old table's size; and make every save of
    this model (``save_pretrained``, ``push_to_hub``, ``retrofit.save``) write a retrofit config,
    which plain transformers refuses instead of silently loading the original model. ``revert``
    undoes both. Only this instance is patched."""
    cfg = model.config
    state.reach_key = reach_key(cfg)
    if state.reach_key:
        state.reach_original = getattr(cfg, state.reach_key)
        setattr(cfg, state.reach_key, length)
    model.save_pretrained = types.MethodType(_save_pretrained, model)


def withdraw_reach(model, state) -> None:
    if state.reach_key:
        setattr(model.config, state.reach_key, state.reach_original)
    model.__dict__.pop("save_pretrained", None)


def _save_pretrained(self, save_directory, *args, **kwargs):
    """``save_pretrained`` of a converted model: the stock one, then config.json marked as retrofit's."""
    if kwargs.get("push_to_hub"):
        raise RetrofitError("save the converted model locally, then push it with `retrofit push DIR --repo user/name`")
    # raw write: the user's own save_pretrained call on a converted model, into the folder the user named (config.json
    # is then rewritten through write_text)
    out = type(self).save_pretrained(self, save_directory, *args, **kwargs)
    if kwargs.get("is_main_process", True):  # other ranks write no config.json (HF's multi-process pattern)
        mark_saved_config(Path(save_directory) / "config.json")
    return out


def mark_saved_config(path: Path) -> None:
    """Rewrite a saved converted model's config.json with ``model_type: retrofit``: transformers then
    loads it only with retrofit imported (as the converted model) and refuses it otherwise."""
    d = json.loads(path.read_text())
    if "retrofit" in d:
        write_text(path, json.dumps(marked(d), indent=2, sort_keys=True) + "\n")


def marked(d: dict) -> dict:
    """A converted model's config.json as retrofit saves it. A checkpoint saved before configs were marked
    (its own ``model_type``, no ``retrofit.base_config``) gets its ``base_config`` from its own keys."""
    d = json.loads(json.dumps(d))
    block = d["retrofit"]
    if "base_config" not in block and d.get("model_type") != SAVED_MODEL_TYPE:
        key = next((k for k in LENGTH_KEYS if k in d), None)
        block["base_config"] = {
            "model_type": d.get("model_type"),
            "architectures": d.get("architectures") or [],
            **({key: d[key]} if key else {}),
        }
    base = (block["base_config"].get("architectures") or [None])[0]
    d["model_type"], d["architectures"] = SAVED_MODEL_TYPE, [retrofit_class_name(of_class(base).name)]  # its task's
    return d
