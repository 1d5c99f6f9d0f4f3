"""Fine-tuning a converted model: ``retrofit.finetune(recipe) -> output_dir``.

See ``docs/finetune.md`` and ``retrofit finetune --help`` for the recipe keys.
"""

from .loop import finetune
from .recipe import Recipe, iter_keys

__all__ = ["finetune", "Recipe", "iter_keys"]
