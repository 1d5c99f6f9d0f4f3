"""retrofit: give a pretrained Hugging Face model a new positional mechanism.

    import retrofit
    retrofit.convert(model, "alibi")      # in place, returns the model
    retrofit.save(model, "runs/x"); model = retrofit.load("runs/x")

Heavier entry points (finetune, evaluate, export) are imported on first use.
"""

__version__ = "0.1.0"

from .core import architectures, convert, describe, revert, schemes, set_position_controls  # noqa: E402
from .errors import RetrofitError  # noqa: E402
from .io import load, load_model, save  # noqa: E402

_LAZY = {
    "finetune": ("retrofit.finetune", "finetune"),
    "evaluate": ("retrofit.evaluation", "evaluate"),
    "export": ("retrofit.export", "export"),
    "run": ("retrofit.pipeline", "run"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'retrofit' has no attribute {name!r}")


__all__ = [
    "__version__",
    "convert",
    "revert",
    "describe",
    "schemes",
    "architectures",
    "save",
    "load",
    "load_model",
    "set_position_controls",
    "RetrofitError",
    *_LAZY,
]
