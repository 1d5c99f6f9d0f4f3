"""retrofit: give a pretrained Hugging Face model a new positional mechanism.

    import retrofit
    retrofit.convert(model, "alibi")      # in place, returns the model
    retrofit.save(model, "runs/x"); model = retrofit.load("runs/x")

Every entry point is imported on first use.
"""

from .foundation.errors import RetrofitError
from .foundation.versions import DISTRIBUTION, __version__
from .models import auto as _auto

_auto.install()  # plain AutoModelForCausalLM.from_pretrained(checkpoint) gives the converted model

# Public names, imported on first use so that `import retrofit` stays light.
# (Module names differ from the function names on purpose: importing a submodule
# `retrofit.finetune` would shadow the function `retrofit.finetune`.)
_LAZY = {
    "convert": ("retrofit.patch.conversion", "convert"),
    "revert": ("retrofit.patch.conversion", "revert"),
    "describe": ("retrofit.patch.conversion", "describe"),
    "schemes": ("retrofit.patch.conversion", "schemes"),
    "architectures": ("retrofit.patch.conversion", "architectures"),
    "set_position_controls": ("retrofit.patch.conversion", "set_position_controls"),
    "save": ("retrofit.models.io", "save"),
    "load": ("retrofit.models.io", "load"),
    "load_model": ("retrofit.models.io", "load_model"),
    "finetune": ("retrofit.training", "finetune"),
    "evaluate": ("retrofit.evaluation", "evaluate"),
    "calibrate": ("retrofit.training.calibrate", "calibrate"),
    "export": ("retrofit.native_export", "export"),
    "run": ("retrofit.pipeline.stages", "run"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'retrofit' has no attribute {name!r}")


__all__ = ["__version__", "DISTRIBUTION", "RetrofitError", *_LAZY]
