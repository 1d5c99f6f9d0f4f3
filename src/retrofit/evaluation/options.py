"""Every option of an evaluation, once: ``EvalOptions`` (no torch). ``evaluate()`` takes its fields as
keywords, ``retrofit eval`` makes one flag per field (``cli/eval.py``), and a pipeline recipe's ``eval:``
section is this dataclass plus its baselines (``run_recipe.EvalSection``). A new option is one field here.
The defaults and why they were chosen: docs/eval.md ("Options and their defaults").

A field's metadata (``schema.field_help``): ``help``; ``flag`` when the command-line flag is not
``--name-with-dashes`` (``--no-sliding`` turns a true default off).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ..data.longdoc import listed as longdoc_tasks
from ..foundation.errors import OptionError
from ..foundation.schema import field_help as _opt

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
ORIGINAL = "original"  # the baseline name that means the evaluated model's own original positions


@dataclass
class EvalOptions:
    """What an evaluation scores and how (the models and where they run are ``evaluate``'s own arguments)."""

    lengths: list = _opt(
        "Lengths: token counts (512) or multiples of the model's native length ('4x'). Left "
        "unset in retrofit eval and evaluate(), the default stops at the model's limit.",
        factory=lambda: ["1x", "2x", "4x", "8x"],
    )
    data: str = _opt(
        "Data spec (retrofit.data.specs): 'stdlib', 'shakespeare[:heldout]', UTF-8 text files/folders/globs, "
        "or a datasets name[:config[:split[:field]]]; for a classifier or an embedding model, a 'longdoc:' task "
        f"({longdoc_tasks()}) or records (json, jsonl, csv or parquet "
        "files, or a Hub dataset, read by the run's field names). Default: stdlib for a causal or masked LM; for a "
        "task run (a classifier or an embedding model), the data of its task: the 'longdoc:' task it was fine-tuned "
        "on, or the records its fine-tune held out.",
        "stdlib",
    )
    doc_separator: Optional[str] = _opt(
        "Join documents with this text instead of EOS (escapes allowed on the "
        "command line: '\\n\\n' for wikitext rows).",
        None,
    )
    budget: int = _opt("Tokens scored at every length.", 65536)
    budget_windows: Optional[int] = _opt(
        "At least this many windows of the longest length: the budget grows to hold them, so it fits the "
        "model it is given (null = the budget as given; retrofit eval --quick: 2, the fewest with an interval).",
        None,
    )
    stride: Optional[int] = _opt("Sliding-window stride (null = half of each sliding window).", None)
    sliding: bool = _opt(
        "Sliding-window rows at each length (window = the length) for models that run it plainly "
        "(baselines past their limit always get theirs).",
        True,
        flag="--no-sliding",
    )
    batch_size: int = _opt("Windows per forward pass.", 1)
    position_buckets: int = _opt("Log-spaced position buckets for loss by position.", 32, flag="--buckets")
    passkey: bool = _opt("Also run passkey retrieval (any passkey option turns it on in retrofit eval).", False)
    passkey_lengths: Optional[list] = _opt("Passkey lengths, same units as lengths (null = lengths).", None)
    passkey_depths: list = _opt("Passkey depths in [0, 1].", factory=lambda: list(DEPTHS))
    passkey_trials: int = _opt("Passkey trials per (length, depth).", 5)
    recall: bool = _opt(
        "Also run recall: continue a random span seen at each depth of the eval text from its "
        "first recall_cue tokens (retrofit.evaluation.recall; any recall option turns it on "
        "in retrofit eval).",
        False,
    )
    recall_lengths: Optional[list] = _opt("Recall lengths, same units as lengths (null = lengths).", None)
    recall_depths: list = _opt("Recall depths in [0, 1].", factory=lambda: list(DEPTHS))
    recall_trials: int = _opt("Recall trials per (length, depth), one forward pass each.", 10)
    recall_span: int = _opt("Tokens in recall's random span.", 12)
    recall_cue: int = _opt("The span's first tokens repeated at the end (fewer than recall_span).", 4)
    copy: bool = _opt(
        "Retrieval at distance on natural text: a held-out span d tokens back, "
        "its first copy_cue tokens repeated at the end; the copy gain (nats per token the first "
        "occurrence saves) at each distance, and the effective reach (retrofit.evaluation.retrieval).",
        True,
        flag="--no-copy",
    )
    copy_distances: list = _opt(
        "Copy distances, same units as lengths; left unset, those up to the longest length.",
        factory=lambda: ["0.25x", "0.5x", "1x", "2x", "4x", "8x", "16x"],
    )
    copy_trials: int = _opt("Copy trials per (model, distance), one forward pass each, paired across models.", 8)
    copy_span: Optional[int] = _opt(
        "Tokens in a copied span (null = min(32, native length / 4), so that a span fits at 1/4 native).", None
    )
    copy_cue: Optional[int] = _opt("The span's first tokens repeated as the cue (null = a quarter of the span).", None)
    copy_keys: int = _opt(
        "Spans per trial: the target and copy_keys - 1 distractors between it and the cue "
        "(multi-key: the cue picks one, recency does not).",
        1,
    )
    seed: int = _opt("Passkey, recall and copy seed (keys, spans, text offsets).", 0)


NAMES = tuple(f.name for f in dataclasses.fields(EvalOptions))
DEFAULTS = EvalOptions()
# A lighter evaluation for a CPU (retrofit eval --quick): fewer tokens and lengths, no long-window sliding rows,
# fewer copy trials. The far-context gain (a native-size window) and the copy measure stay. The budget fits the
# model: 8,192 tokens, or two windows of the longest length when that is more (SmolLM2's 2x is 16,384).
QUICK = {
    "lengths": ["1x", "2x", "4x"],
    "budget": 8192,
    "budget_windows": 2,
    "sliding": False,
    "copy_trials": 4,
    "copy_distances": ["0.25x", "1x", "2x", "4x"],
}


def is_quick(o: EvalOptions) -> bool:
    """``o`` is as light as ``QUICK`` makes it (its lengths and the budget the model fits aside): --quick was
    given, or the same settings."""
    return all(getattr(o, k) == v for k, v in QUICK.items() if k not in ("lengths", "budget"))


def fitted_budget(o: EvalOptions, longest: int) -> EvalOptions:
    """``o`` with its budget raised to ``budget_windows`` windows of the ``longest`` length, when that is more."""
    n = o.budget_windows
    if n is None:
        return o
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise OptionError(f"budget_windows must be a positive integer or null, got {n!r}")
    return dataclasses.replace(o, budget=max(o.budget, n * longest))


def eval_options(options: EvalOptions | None = None, **given) -> EvalOptions:
    """``options`` (default: the defaults) with the keywords ``given`` set; an unknown keyword is an error."""
    unknown = sorted(set(given) - set(NAMES))
    if unknown:
        raise OptionError(f"unknown evaluation option(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    return dataclasses.replace(options or EvalOptions(), **given)
