"""A run folder: what ``retrofit convert``, ``retrofit finetune`` and ``retrofit run`` leave behind.

- ``retrofit convert ... --out DIR``: DIR is a retrofit checkpoint (``config.json`` + safetensors).
- ``retrofit finetune`` / ``retrofit run``: ``output_dir/final/`` is the fine-tuned checkpoint (a
  fine-tune may write into the folder it started from, so DIR can hold both).

The commands that consume a result (eval, export, card, push) read the newest model in it:
``final/`` when there is one, else DIR itself.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .errors import RetrofitError

log = logging.getLogger(__name__)

FINAL = "final"
_told: set[str] = set()


def is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def model_dir(path) -> Path:
    """The model a run folder holds: ``final/`` if it has one, else the folder (unchanged when neither)."""
    path = Path(path)
    final = path / FINAL
    if is_model_dir(final):
        if is_model_dir(path) and str(path) not in _told:
            _told.add(str(path))
            log.info("%s holds a checkpoint and a fine-tuned %s/: using %s", path, FINAL, final)
        return final
    return path


def read_json(path: Path):
    return json.loads(Path(path).read_text()) if Path(path).is_file() else None


def retrofit_block(model_folder: Path) -> dict:
    """The ``retrofit`` block of a checkpoint's config.json ({} for a plain model)."""
    return (read_json(Path(model_folder) / "config.json") or {}).get("retrofit") or {}


def native_length(model_folder: Path) -> int:
    """The native length of a checkpoint: its retrofit block's, else the config's own."""
    cfg = read_json(Path(model_folder) / "config.json") or {}
    n = ((cfg.get("retrofit") or {}).get("native") or {}).get("length")
    for key in ("n_positions", "max_position_embeddings"):
        n = n or cfg.get(key)
    if not n:
        raise RetrofitError(f"{model_folder}: cannot tell the native length from config.json")
    return int(n)
