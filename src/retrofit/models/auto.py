"""Plain transformers loading of a retrofit checkpoint.

A converted model is saved with ``model_type: "retrofit"`` (the original type, architectures and
length are kept in ``config.json``'s ``retrofit.base_config``). With retrofit imported, transformers'
own extension points map that type here, so

    import retrofit
    from transformers import AutoConfig, AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained("runs/gpt2-alibi")   # the converted model

returns the converted model (through ``retrofit.load``), and any tool built on transformers
(lm-evaluation-harness, pipelines) gets it too once ``retrofit`` is imported in its process.
Without retrofit, transformers refuses the unknown model type: it never silently loads the
original. ``import retrofit`` stays light: registration waits until transformers' auto classes are
imported (an import hook), or happens at once if they already are.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys

_CONFIG_AUTO = "transformers.models.auto.configuration_auto"
_MODELING_AUTO = "transformers.models.auto.modeling_auto"


def _register_config(configuration_auto) -> None:
    from .hf_classes import RetrofitConfig

    configuration_auto.AutoConfig.register(RetrofitConfig.model_type, RetrofitConfig, exist_ok=True)


def _register_model(modeling_auto) -> None:
    """Every task's Auto class (``task.TASKS``: causal LM, masked LM, classifiers, ``AutoModel``) maps
    ``model_type: retrofit`` to a class that loads the checkpoint with ``retrofit.load``."""
    from ..foundation.task import TASKS
    from .hf_classes import RetrofitConfig, for_task

    for t in TASKS:
        getattr(modeling_auto, t.auto_class).register(RetrofitConfig, for_task(t.name), exist_ok=True)


_AFTER = {_CONFIG_AUTO: _register_config, _MODELING_AUTO: _register_model}


def _register(name: str, module) -> None:
    try:
        _AFTER[name](module)
    except Exception as e:  # a transformers API change must not break transformers itself
        logging.getLogger(__name__).warning(
            "retrofit could not register its model type with transformers (%s: %s); load retrofit checkpoints "
            "with retrofit.load(path)",
            type(e).__name__,
            e,
        )


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Registers with each of transformers' auto modules right after it has been imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _AFTER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register(fullname, module)
            if all(m in sys.modules for m in _AFTER):
                _remove_hook()

        spec.loader.exec_module = exec_then_register
        return spec


_hook = _RegisterAfterImport()


def _remove_hook() -> None:
    if _hook in sys.meta_path:
        sys.meta_path.remove(_hook)


def install() -> None:
    """Register with the auto modules already imported; the others register when they are."""
    for name in _AFTER:
        if name in sys.modules:
            _register(name, sys.modules[name])
    if not all(m in sys.modules for m in _AFTER) and _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)
