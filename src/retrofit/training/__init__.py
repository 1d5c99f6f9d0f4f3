"""Fine-tuning a converted model: ``retrofit.finetune(recipe) -> output_dir``.

See ``docs/finetune.md`` and ``retrofit finetune --help`` for the recipe keys.
"""

from .recipe import Recipe, iter_keys

__all__ = ["finetune", "Recipe", "iter_keys"]


def __getattr__(name):  # the loop (torch, accelerate) is imported on first use: recipes stay light
    if name == "finetune":
        from .loop import finetune

        return finetune
    raise AttributeError(f"module 'retrofit.training' has no attribute {name!r}")
