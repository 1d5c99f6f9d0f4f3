"""The models of one evaluation run: loading, naming, and what lengths each can run plainly."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..foundation.errors import OptionError, RetrofitError
from ..foundation.native import native_length

log = logging.getLogger(__name__)


@dataclass
class EvalModel:
    """A model in the run. ``max_length`` None means no limit."""

    name: str
    role: str  # the evaluated model: "converted", or "original" when it is not; else "baseline"
    model: Any
    tokenizer: Any
    info: dict = field(default_factory=dict)

    @property
    def max_length(self) -> int | None:
        return self.info.get("max_length")


def _load(name_or_path: str, *, gguf_file=None, device=None, dtype=None):
    """``retrofit.load_model`` (hub id, folder, retrofit checkpoint, or a ``.gguf`` file path)."""
    from ..models.io import load_model

    if gguf_file is None and name_or_path.endswith(".gguf"):
        gguf_file = name_or_path
    model, tok = load_model(name_or_path, gguf_file=gguf_file, device=device, dtype=dtype)
    return model, tok  # a classifier or embedding model is measured on its task (evaluation.longdoc)


def describe_model(model) -> dict:
    """``retrofit.describe(model)``, or a minimal stand-in built from the config when that fails."""
    try:
        from ..patch.conversion import describe

        d = dict(describe(model))
        d.setdefault("source", "retrofit.describe")
        return d
    except RetrofitError as e:  # e.g. an architecture retrofit has no adapter for
        log.info("retrofit.describe failed (%s); using the config's native length", e)
    except (AttributeError, ImportError, ModuleNotFoundError, NotImplementedError) as e:
        log.info("retrofit.describe unavailable (%s); using the config's native length", e)
    cfg = model.config
    length = native_length(cfg)
    return {
        "converted": False,
        "scheme": None,
        "options": {},
        "model_type": getattr(cfg, "model_type", None),
        "native": {"kind": None, "length": length},
        "max_length": length,
        "last_kernel": None,
        "source": "config",
    }


def model_name(model, fallback: str) -> str:
    cfg = getattr(model, "config", None)
    name = getattr(cfg, "_name_or_path", "") if cfg is not None else ""
    return name or fallback


def base_model_name(model) -> str | None:
    """The pretrained model a retrofit checkpoint was converted from, when the config says so."""
    block = getattr(model.config, "retrofit", None)
    if isinstance(block, dict):
        for key in ("base_model", "base", "source_model", "name_or_path"):
            if block.get(key):
                return str(block[key])
    return None


@dataclass(frozen=True)
class Loading:
    """How ``resolve`` loads or places a model: the tokenizer for one given in memory, the GGUF file of a path, the
    device and dtype (None: as it is, or the library default)."""

    tokenizer: Any = None
    gguf_file: str | None = None
    device: Any = None
    dtype: Any = None


def resolve(spec, role: str | None, how: Loading = Loading(), *, default_name: str) -> EvalModel:
    """A path / hub id, an ``nn.Module``, ``(model, tokenizer)`` or ``(name, model, tokenizer)`` -> EvalModel,
    loaded or placed as ``how`` says. ``role`` None: the evaluated model's, "converted" or "original" as the model
    is."""
    tokenizer, gguf_file, device, dtype = how.tokenizer, how.gguf_file, how.device, how.dtype
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if isinstance(spec, str):
        if not spec.endswith(".gguf") and not gguf_file and Path(spec).is_dir():  # "./x" not found stays a path
            from ..foundation.run_folder import model_dir

            spec = str(model_dir(spec))  # a run folder: its fine-tuned final/ (the report names it)
        model, tok = _load(spec, gguf_file=gguf_file, device=device, dtype=dtype)
        name = spec if not gguf_file or spec.endswith(".gguf") else f"{spec}/{gguf_file}"
    elif isinstance(spec, torch.nn.Module):
        model, tok, name = spec, tokenizer, model_name(spec, default_name)
        if device is not None:
            model.to(device)
    elif isinstance(spec, tuple) and len(spec) in (2, 3):
        name, model, tok = spec if len(spec) == 3 else (model_name(spec[0], default_name), *spec)
    else:
        raise OptionError(f"cannot evaluate {type(spec).__name__}; pass a path, a hub id or an nn.Module")
    if tok is None:
        raise OptionError(f"model {name!r} needs a tokenizer (pass tokenizer=...)")
    model.eval()
    info = describe_model(model)
    cfg_name = getattr(model.config, "_name_or_path", "") or None
    if not info.get("converted"):
        info["base_model"] = name  # an unconverted model is its own base
    else:  # the config's retrofit block, else the name it was loaded under before converting in memory
        info["base_model"] = base_model_name(model) or (cfg_name if cfg_name and cfg_name != name else None)
    info["parameters"] = sum(p.numel() for p in model.parameters())
    info["dtype"] = str(next(model.parameters()).dtype).replace("torch.", "")
    role = role or ("converted" if info.get("converted") else "original")
    return EvalModel(name=name, role=role, model=model, tokenizer=tok, info=info)


def same_tokenizer(a, b, sample: str) -> bool:
    """True when two tokenizers share vocabulary, EOS and the encoding of ``sample``."""
    if a is b:
        return True
    try:
        if a.get_vocab() != b.get_vocab():
            return False
    except (AttributeError, NotImplementedError):
        pass
    if getattr(a, "eos_token_id", None) != getattr(b, "eos_token_id", None):
        return False
    enc = lambda t: t(sample, add_special_tokens=False)["input_ids"]  # noqa: E731
    return enc(a) == enc(b)


def check_tokenizers(models: list[EvalModel], sample: str) -> None:
    """Refuse a baseline whose tokenizer differs from the converted model's (perplexities would not compare)."""
    ref = models[0]
    for m in models[1:]:
        if not same_tokenizer(ref.tokenizer, m.tokenizer, sample):
            raise OptionError(
                f"baseline {m.name!r} uses a different tokenizer than {ref.name!r}; per-token perplexities "
                "are not comparable, so it is refused (evaluate it in its own run)"
            )
