"""What retrofit keeps out of the user's terminal, and why.

``progress_bars()`` is the one switch for retrofit's progress bars (``RETROFIT_PROGRESS=0`` turns them off).

``HARMLESS`` is the one list of library messages that are harmless where retrofit triggers them, each
with the reason. ``hushed(*keys)`` drops them for the duration of a block unless retrofit's own logger
is at DEBUG (``retrofit --verbose``, or ``logging.getLogger("retrofit").setLevel(logging.DEBUG)``),
which shows everything. ``configure(verbose)`` is the command line's logging: retrofit's INFO lines,
other libraries' warnings, each line once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import warnings
from collections.abc import Iterator

VERBOSE_LOGGER = "retrofit"
PROGRESS_ENV = "RETROFIT_PROGRESS"  # "0": no progress bars (fine-tune, pretraining, evaluation), for logs and CI


def progress_bars() -> bool:
    """Whether retrofit draws progress bars: yes unless ``RETROFIT_PROGRESS=0``."""
    return os.environ.get(PROGRESS_ENV, "1") != "0"


@dataclasses.dataclass(frozen=True)
class Log:
    """A record logged by ``logger`` whose message matches ``pattern``."""

    logger: str
    pattern: str
    why: str

    def matches(self, message: str) -> bool:
        return re.search(self.pattern, message) is not None


@dataclasses.dataclass(frozen=True)
class PositionsOnlyReport(Log):
    """transformers' LOAD REPORT when its only rows are retrofit's position tensors, UNEXPECTED to the
    base architecture; ``retrofit.load`` reads them itself (any other row keeps the report)."""

    def matches(self, message: str) -> bool:
        if not super().matches(message):
            return False
        rows = [line.split("|") for line in message.splitlines() if "|" in line]
        rows = [(cells[0].strip(), cells[1]) for cells in rows[1:] if not set(cells[0].strip()) <= {"-"}]
        return bool(rows) and all(k.startswith("retrofit_positions.") and "UNEXPECTED" in s for k, s in rows)


@dataclasses.dataclass(frozen=True)
class Warning_:
    """A Python warning of ``category`` whose message starts with ``pattern``."""

    category: type[Warning]
    pattern: str
    why: str


HARMLESS = {
    "positions_unexpected": PositionsOnlyReport(
        "transformers.modeling_utils",
        r"LOAD REPORT",
        "retrofit_positions.* are the new scheme's parameters; retrofit.load loads them after the base model",
    ),
    "shared_tensor": Log(
        "accelerate.utils.other",
        r"Removed shared tensor",
        "tied weights (lm_head = embeddings) are saved once in a checkpoint and tied again when it is loaded",
    ),
    "loss_type": Log(
        "transformers.modeling_utils",
        r"`loss_type=None` was set in the config",
        "transformers falls back to ForCausalLMLoss, the right loss for a causal LM",
    ),
    "gradient_checkpointing_name": Warning_(
        FutureWarning,
        r"`is_gradient_checkpointing` is deprecated",
        "peft reads transformers' old attribute name; nothing to do for the user",
    ),
}


class _Drop(logging.Filter):
    def __init__(self, rules: list[Log]):
        super().__init__()
        self.rules = rules

    def filter(self, record: logging.LogRecord) -> bool:
        if logging.getLogger(VERBOSE_LOGGER).isEnabledFor(logging.DEBUG):
            return True
        message = record.getMessage()
        return not any(rule.matches(message) for rule in self.rules)


@contextlib.contextmanager
def hushed(*keys: str) -> Iterator[None]:
    """Drop the ``HARMLESS`` messages named by ``keys`` (all of them when none is named) in this block."""
    rules = [HARMLESS[k] for k in keys] if keys else list(HARMLESS.values())
    by_logger: dict[str, list[Log]] = {}
    for rule in rules:
        if isinstance(rule, Log):
            by_logger.setdefault(rule.logger, []).append(rule)
    filters = [(logging.getLogger(name), _Drop(group)) for name, group in by_logger.items()]
    for logger, f in filters:
        logger.addFilter(f)
    try:
        with warnings.catch_warnings():
            if not logging.getLogger(VERBOSE_LOGGER).isEnabledFor(logging.DEBUG):
                for rule in rules:
                    if isinstance(rule, Warning_):
                        warnings.filterwarnings("ignore", message=rule.pattern, category=rule.category)
            yield
    finally:
        for logger, f in filters:
            logger.removeFilter(f)


def configure(verbose: bool) -> None:
    """The command line's logging: retrofit's INFO lines (DEBUG with ``verbose``), other libraries'
    warnings (INFO with ``verbose``). huggingface_hub prints through its own handler: not again here."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger(VERBOSE_LOGGER).setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("huggingface_hub").propagate = False
