"""Passkey retrieval (Mohtashami & Jaggi, 2023): find a 5-digit key hidden in filler text.

The prompt is built at the token level so that its length is exact:

    <intro> <filler x k> The pass key is NNNNN. Remember it. <filler x (m - k)> <question>

``k / m`` is the depth (0 = key first, 1 = key last). The model answers by greedy decoding, and
the answer is right when the first 5-digit number in the continuation is the key.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch

from ..adapters.inputs import cache_kwarg, output_cache
from ..foundation.errors import LengthError
from ..scoring.intervals import wilson
from .lengths import resolve as resolve_lengths
from .measure import Measure, Planned, Setup, check_depths, check_lengths, check_positive, check_supported
from .models import EvalModel

INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there."
)
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY_LINE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
_FIVE_DIGITS = re.compile(r"(?<!\d)(\d{5})(?!\d)")


@dataclass(frozen=True)
class PasskeyPrompt:
    ids: list[int]
    key: str
    depth: float
    key_token_index: int  # where the key line starts, in tokens


def bos_prefix(tokenizer) -> list[int]:
    """``[BOS]`` when the tokenizer starts its inputs with one (LLaMA-style), else ``[]``."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos] if bos is not None and getattr(tokenizer, "add_bos_token", False) else []


class PromptBuilder:
    """Builds passkey prompts of an exact token length for one tokenizer."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.intro = self._enc(INTRO)
        self.filler = self._enc(FILLER)
        self.question = self._enc(QUESTION)
        self.prefix = bos_prefix(tokenizer)

    def _enc(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def fixed_tokens(self, key: str = "00000") -> int:
        """Tokens of everything except the filler."""
        return len(self.prefix) + len(self.intro) + len(self._enc(KEY_LINE.format(key=key))) + len(self.question)

    def build(self, length: int, depth: float, key: str) -> PasskeyPrompt:
        """A prompt of at most ``length`` tokens (filler fills the rest, whole sentences, then single tokens)."""
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        key_ids = self._enc(KEY_LINE.format(key=key))
        room = length - len(self.prefix) - len(self.intro) - len(key_ids) - len(self.question)
        if room < 0:
            raise ValueError(f"passkey prompt needs at least {length - room} tokens, got length {length}")
        reps = room // len(self.filler) + 1
        filler = (self.filler * reps)[:room]  # [room] token ids
        cut = round(depth * room)
        # put the key on a sentence boundary when the filler has one near the cut
        cut = (cut // len(self.filler)) * len(self.filler) if room >= len(self.filler) and depth < 1.0 else cut
        before = self.prefix + self.intro + filler[:cut]
        ids = before + key_ids + filler[cut:] + self.question
        return PasskeyPrompt(ids=ids, key=key, depth=depth, key_token_index=len(before))


def make_keys(seed: int, n: int) -> list[str]:
    """``n`` reproducible 5-digit keys (no leading zero)."""
    rng = random.Random(seed)
    return [str(rng.randint(10000, 99999)) for _ in range(n)]


def grade(continuation: str, key: str) -> bool:
    """True when the first 5-digit number in ``continuation`` is ``key``."""
    m = _FIVE_DIGITS.search(continuation)
    return bool(m) and m.group(1) == key


def greedy_decode(model, ids: list[int], max_new_tokens: int, eos_token_id: int | None = None) -> list[int]:
    """Greedy continuation of ``ids``; uses the KV cache when the model returns one."""
    dev = next(model.parameters()).device
    x = torch.tensor([ids], device=dev)  # [1, T]
    out_ids: list[int] = []
    past = None
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            if past is not None:
                out = model(input_ids=x[:, -1:], **{cache_kwarg(model): past}, use_cache=True)
            else:
                out = model(input_ids=x, use_cache=True)
            past = output_cache(out)
            nxt = int(out.logits[0, -1].argmax())
            out_ids.append(nxt)
            if eos_token_id is not None and nxt == eos_token_id:
                break
            x = torch.cat([x, torch.tensor([[nxt]], device=dev)], dim=1)
    return out_ids


def run_trial(model, tokenizer, prompt: PasskeyPrompt, max_new_tokens: int = 8) -> dict:
    """Decode one prompt; ``{"key", "answer", "correct"}``."""
    new = greedy_decode(model, prompt.ids, max_new_tokens, getattr(tokenizer, "eos_token_id", None))
    text = tokenizer.decode(new, skip_special_tokens=True)
    return {"key": prompt.key, "answer": text, "correct": grade(text, prompt.key)}


NEW_TOKENS = 8


def not_run(m: EvalModel, L: int, d: float, bar, trials: int) -> dict | None:
    """The cell of a length past the model's limit (recorded as not run), else None."""
    if m.max_length is None or L <= m.max_length:
        return None
    bar.update(trials)
    return {
        "model": m.name,
        "role": m.role,
        "length": L,
        "depth": d,
        "trials": 0,
        "correct": 0,
        "accuracy": None,
        "note": f"not run: {m.name} accepts at most {m.max_length} tokens",
    }


def cell(m: EvalModel, L: int, d: float, correct: int, trials: int) -> dict:
    """A retrieval cell's accuracy with its 95% Wilson interval."""
    low, high = wilson(correct, trials)
    return {
        "model": m.name,
        "role": m.role,
        "length": L,
        "depth": d,
        "trials": trials,
        "correct": correct,
        "accuracy": correct / trials,
        "note": None,
        "ci_low": round(low, 4),
        "ci_high": round(high, 4),
    }


def run(models, lengths, depths, trials, seed, bar) -> list[dict]:
    """Accuracy per (model, length, depth); lengths past a model's limit are recorded as not run."""
    results = []
    keys = make_keys(seed, len(lengths) * len(depths) * trials)
    for m in models:
        builder = PromptBuilder(m.tokenizer)
        k = 0
        for L in lengths:
            for d in depths:
                cell_keys, k = keys[k : k + trials], k + trials
                skipped = not_run(m, L, d, bar, trials)
                if skipped:
                    results.append(skipped)
                    continue
                answers = []
                bar.set_description(f"{m.name[-24:]} passkey L={L} depth={d:g}")
                for key in cell_keys:
                    prompt = builder.build(L - NEW_TOKENS, d, key)
                    answers.append(run_trial(m.model, m.tokenizer, prompt, NEW_TOKENS))
                    bar.update(1)
                correct = sum(a["correct"] for a in answers)
                results.append(
                    {
                        **cell(m, L, d, correct, trials),
                        "answers": [{"key": a["key"], "answer": a["answer"]} for a in answers],
                    }
                )
    return results


def check_room(m: EvalModel, length: int) -> None:
    need = PromptBuilder(m.tokenizer).fixed_tokens() + NEW_TOKENS
    if length < need:
        raise LengthError(f"passkey length {length} is too short: the prompt alone takes {need} tokens")


def work(lengths: list[int], models: int, depths: list, trials: int) -> list[tuple[int, int]]:
    """(sequence length, forward passes counted) of the passkey cells: the cost line's and the progress bar's."""
    return [(L, models * len(depths) * trials) for L in lengths]


def settings(lengths: list[int], depths: list, o) -> dict:
    """The report's ``settings.passkey``: what the measure ran with (``o``: the options)."""
    return {"lengths": lengths, "depths": depths, "trials": o.passkey_trials, "new_tokens": NEW_TOKENS}


class Passkey(Measure):
    """Passkey retrieval at ``passkey_lengths`` (default: the lengths) x ``passkey_depths``: a five-digit key in
    filler, asked for at the end, greedy decoding graded (``retrofit eval --passkey``)."""

    name = "passkey"

    def asked(self, o) -> tuple | None:
        check_positive(passkey_trials=o.passkey_trials)
        depths = check_depths(o.passkey_depths, "passkey")  # checked even when not asked
        if not o.passkey:
            return None
        return check_lengths(o.passkey_lengths, "passkey lengths") if o.passkey_lengths else None, depths

    def lengths(self, setup: Setup, asked) -> list[int]:
        items = asked[0]
        return resolve_lengths(items, setup.native, "passkey lengths") if items else setup.lengths

    def check(self, setup: Setup, asked) -> None:
        if asked is not None:
            lengths = self.lengths(setup, asked)
            check_supported(setup.models[0], lengths, "passkey lengths")
            check_room(setup.models[0], min(lengths))

    def plan(self, setup: Setup, asked) -> Planned:
        seeds = {"passkey": setup.o.seed}  # always said (the report's schema requires it)
        if asked is None:
            return Planned(settings={"passkey": None}, seeds=seeds)
        lengths, depths, o = self.lengths(setup, asked), asked[1], setup.o
        work_ = work(lengths, len(setup.models), depths, o.passkey_trials)
        return Planned(work_, {"passkey": settings(lengths, depths, o)}, seeds, state=(lengths, depths))

    def run(self, setup: Setup, planned: Planned, bar) -> dict:
        (lengths, depths), o = planned.state, setup.o
        return {"passkey": run(setup.models, lengths, depths, o.passkey_trials, o.seed, bar)}


MEASURE = Passkey()
