"""The fine-tune's meter: loss (mean over the accumulated micro-batches), grad norm, learning rate,
tokens/s and the distillation teacher's share of the step, for the log records, the progress bar and
summary.json."""

from __future__ import annotations

import logging
import math
import time

import torch

from ..foundation.quiet import progress_bars
from .recipe import tokens_per_step
from .teacher import Clock

log = logging.getLogger(__name__)


class Meter:
    """Loss (mean over the accumulated micro-batches), grad norm, lr, tokens/s, the teacher's time; progress bar."""

    def __init__(self, t, block_length: int, acc, start_step: int, clock: Clock | None = None, view=None):
        """``t``: the recipe's train section; ``block_length``: data.block_length; ``view``: the teacher's
        (``TeacherView``) when it reads windows of the block."""
        from tqdm.auto import tqdm

        self.clock, self.view, self.block_length = clock, view, block_length
        self.interval = (start_step, time.perf_counter())  # (step, time) of the last record
        self.skipped = 0.0  # seconds since then spent outside training steps (evaluation, checkpoints)
        self.teacher_total = [0.0, 0.0]  # teacher seconds, step seconds since the start
        self.tokens_per_step = tokens_per_step(t, block_length, acc.num_processes)
        self.start_step, self.t0 = start_step, time.perf_counter()
        self.sums: dict = {}
        self.n = 0
        self.grad_norm, self.lr = math.nan, math.nan
        self.steps = t.steps
        self.bar = tqdm(
            total=t.steps * self.tokens_per_step,
            initial=start_step * self.tokens_per_step,
            disable=not (acc.is_local_main_process and progress_bars()),
            desc="finetune",
            unit="tok",
            unit_scale=True,
            dynamic_ncols=True,
        )

    def add(self, loss, parts) -> None:
        for k, v in {"loss": loss, **parts}.items():
            self.sums[k] = self.sums.get(k, 0.0) + v.detach()
        self.n += 1

    def rate(self, step: int) -> float:
        return self.tokens_per_step * (step - self.start_step) / max(time.perf_counter() - self.t0, 1e-9)

    def record(self, acc, step: int) -> dict:
        """The record for the steps since the last one (collective: every process calls it)."""
        rec = {"step": step}
        rec.update({k: acc.reduce(v / self.n, "mean").item() for k, v in self.sums.items()})
        rec.update(
            lr=self.lr,
            grad_norm=float(self.grad_norm),
            tokens=step * self.tokens_per_step,
            tokens_per_s=round(self.rate(step), 1),
        )
        if self.clock is not None:
            rec.update(self._teacher(acc, step))
        self.bar.set_postfix(
            step=f"{step}/{self.steps}", loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:,.0f}"
        )
        if self.bar.disable and acc.is_main_process and (step % max(1, self.steps // 20) == 0 or step == self.steps):
            log.info(
                "step %d/%d: %s of %s tokens, %s tokens/s, loss %.4f",
                step,
                self.steps,
                f"{rec['tokens']:,}",
                f"{self.steps * self.tokens_per_step:,}",
                f"{rec['tokens_per_s']:,.0f}",
                rec["loss"],
            )
        return rec

    def _teacher(self, acc, step: int) -> dict:
        """The teacher's seconds per step and share of the step time since the last record (mean over processes)."""
        last_step, last_t = self.interval
        now = time.perf_counter()
        wall = max(now - last_t - self.skipped, 1e-9)
        both = torch.tensor([self.clock.take(), wall], dtype=torch.float32, device=acc.device)
        teacher, wall = acc.reduce(both, "mean").tolist()
        self.interval, self.skipped = (step, now), 0.0
        self.teacher_total = [self.teacher_total[0] + teacher, self.teacher_total[1] + wall]
        steps = max(step - last_step, 1)
        return {"teacher_s_per_step": round(teacher / steps, 6), "teacher_share": round(teacher / wall, 4)}

    def teacher_summary(self, steps: int) -> dict | None:
        """The teacher's cost over the run (None without a teacher), for summary.json and the log."""
        if self.clock is None or not steps:
            return None
        teacher, wall = self.teacher_total
        return {
            "windows_per_block": len(self.view.spans(self.block_length)),
            "window": self.view.window,
            "stride": self.view.stride,
            "seconds_per_step": round(teacher / steps, 6),
            "share_of_step": round(teacher / max(wall, 1e-9), 4),
        }

    def skip(self, seconds: float) -> None:
        """Leave ``seconds`` spent outside the training steps out of the teacher's share."""
        self.skipped += seconds

    def reset(self) -> None:
        self.sums, self.n = {}, 0

    def close(self) -> None:
        self.bar.close()
        self.elapsed = time.perf_counter() - self.t0
