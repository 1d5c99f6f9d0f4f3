"""The distillation teacher's view of a block: the original read through its own sliding window.

The teacher is the unconverted original (``model.make_teacher``); it reads positions only up to its
native length W. ``train.teacher_window: sliding`` (the default) reads a block of T tokens the way the
evaluation reads the original past native (``scoring.windows.sliding_spans``): the first window
gives positions [0, W); each next one ends ``stride`` tokens later and gives only its last ``stride``
positions, so every position of the block has the original's prediction, from between W - stride and
W tokens of context. ``first`` keeps the pre-issue-33 behaviour: the first window only (no teacher past
W). A block no longer than W is one window either way. An embedding model's teacher (``task: embedding``) reads the
first window of each text, one vector per text (``tasks.Embedding.distilled``).

The KL is computed window by window: the teacher's logits exist for one window at a time ([B, k, V],
not [B, T, V]: at a 50k vocabulary and 8k tokens the whole block's would be 1.6 GB per row in fp32).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..foundation.errors import RecipeError
from ..scoring.losses import last_logits
from ..scoring.masking import IGNORE
from ..scoring.windows import centred_spans, sliding_spans


@dataclass(frozen=True)
class TeacherView:
    """Which positions of a block the teacher predicts, and from which window."""

    window: int  # tokens per teacher forward: the native length (the block's when shorter or unknown)
    stride: int | None  # None: the first window only ('first')

    @classmethod
    def of(cls, train_cfg, block_length: int, native: int | None, task: str | None = None) -> "TeacherView":
        """The recipe's view; a task's teacher (``task: embedding``: one vector per text) reads its first window."""
        window = min(block_length, native or block_length)
        if train_cfg.teacher_window == "first" or task is not None:
            return cls(window, None)
        stride = train_cfg.teacher_stride or max(1, (native or block_length) // 2)
        if native and stride > native:
            raise RecipeError(
                f"'train.teacher_stride' = {stride} exceeds the teacher's window, its native length {native}"
            )
        return cls(window, min(stride, window))

    def spans(self, length: int) -> list[tuple[int, int, int]]:
        """``(start, end, k)`` per teacher forward over a block of ``length``: it reads ``[start, end)`` and
        gives the logits of positions ``[end - k, end)``."""
        if self.stride is None:
            w = min(self.window, length)
            return [(0, w, w)]
        return sliding_spans(length, self.window, self.stride)

    def student_length(self, block_length: int) -> int:
        """Tokens of each block the ``distill`` objective trains on: the positions the teacher predicts."""
        return self.window if self.stride is None else block_length

    def describe(self, block_length: int) -> str:
        n = len(self.spans(block_length))
        how = "first window only" if self.stride is None else f"stride {self.stride}"
        return f"{n} window{'s' * (n != 1)} of {self.window}, {how}"


class Clock:
    """Seconds spent inside ``with clock:`` since the last ``take()``. On CUDA it records events (no sync per
    window; ``take`` waits for them), elsewhere it reads the wall clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.windows = 0
        self._seconds, self._events, self._t = 0.0, [], 0.0

    def __enter__(self):
        if self.cuda:
            self._events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self._events[-1][0].record()
        else:
            self._t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.windows += 1
        if self.cuda:
            self._events[-1][1].record()
        else:
            self._seconds += time.perf_counter() - self._t
        return False

    def take(self) -> float:
        for start, end in self._events:
            end.synchronize()
            self._seconds += start.elapsed_time(end) / 1000
        seconds, self._seconds, self._events = self._seconds, 0.0, []
        return seconds


@dataclass(frozen=True)
class Teacher:
    """The distillation teacher as a loss reads it: the frozen original (``model``), how it reads a block
    (``view``), the softmax ``temperature``, the autocast context its forwards run in and the clock that times them
    (None: untimed)."""

    model: Any
    view: TeacherView
    temperature: float = 1.0
    autocast: Any = nullcontext
    clock: Clock | None = None


def distill_kl(student_logits, input_ids, teacher: Teacher) -> torch.Tensor:
    """KL(teacher || student) per position, summed over the vocabulary, averaged over the positions the
    teacher predicts (``teacher.view``), x temperature^2. ``student_logits``: [B, T, V] for ``input_ids`` [B, T]."""
    total, count, temperature = 0.0, 0, teacher.temperature
    for start, end, k in teacher.view.spans(input_ids.shape[1]):
        with teacher.clock or nullcontext(), torch.no_grad(), teacher.autocast():
            teacher_logits = last_logits(teacher.model, input_ids[:, start:end], k)  # [B, k, V]
        total = total + kl_sum(student_logits[:, end - k : end], teacher_logits, temperature)
        count += teacher_logits.shape[0] * k
    return total / count * temperature**2


def masked_distill_kl(student_logits, inputs, labels, teacher: Teacher) -> torch.Tensor:
    """A masked LM's distillation: KL(teacher || student) at the block's masked tokens (``labels`` not
    IGNORE), averaged over them, x temperature^2. The teacher reads the same masked ``inputs`` [B, T] through
    its native window the way the masked-LM evaluation reads the original (``scoring.windows.centred_spans``:
    each token from the window where it is most central, stride ``view.stride``); ``student_logits``: [B, T, V]."""
    total, count, view, temperature = 0.0, 0, teacher.view, teacher.temperature
    n = inputs.shape[1]
    window = min(view.window, n)
    for start, end, a, b in centred_spans(n, window, min(view.stride or window, window)):
        chosen = labels[:, a:b] != IGNORE  # (B, b - a)
        if not chosen.any():
            continue
        with teacher.clock or nullcontext(), torch.no_grad(), teacher.autocast():
            teacher_logits = teacher.model(input_ids=inputs[:, start:end]).logits[:, a - start : b - start]
        total = total + kl_sum(student_logits[:, a:b][chosen], teacher_logits[chosen], temperature)
        count += int(chosen.sum())
    return total / max(count, 1) * temperature**2


def kl_sum(student_logits, teacher_logits, temperature: float) -> torch.Tensor:
    """KL(teacher || student) summed over the vocabulary and over positions (float32)."""
    s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    p = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    return (p.exp() * (p - s)).sum()
