"""Where each process stands in its training data, so that a resumed run reads exactly the batches an
uninterrupted one would have: whole-read blocks by the optimizer step (``block_batches``), a stream by
every process's ``stream.Position``, saved with each checkpoint (``StreamPlace``)."""

from __future__ import annotations

import logging

import torch

from ..data import specs
from . import blocks, stream
from .task_stream import batch_rows, to_device

log = logging.getLogger(__name__)


def block_batches(acc, train_loader, sampler):
    """Micro-batches of the whole-read blocks, epoch after epoch, from where ``acc.step`` says."""
    while True:
        where = blocks.Position.of(acc.step, len(train_loader))
        sampler.epoch = where.epoch
        yield from acc.skip_first_batches(train_loader, where.skip) if where.skip else train_loader


class StreamPlace:
    """This process's place in the stream: where it starts (a checkpoint's), where it stands after each batch."""

    def __init__(self, r, acc, progress):
        self.r, self.acc, self.progress = r, acc, progress
        self.seen: list[str] = []  # train.rank_checksums: a digest of every block this process trained on
        saved = progress.stream
        if saved is not None and len(saved) != acc.num_processes:
            from ..foundation.errors import RecipeError

            raise RecipeError(
                f"the checkpoint was written by {len(saved)} processes; resume it with as many "
                f"(this run has {acc.num_processes}), or start again with checkpoint.resume: never"
            )
        self.now = stream.Position(*saved[acc.process_index]) if saved is not None else stream.Position()
        if saved is not None:
            log.info("data: resuming the stream at epoch %d, document %d, token %d", *self.now.as_list())

    def batches(self, source, tok):
        """Micro-batches on the device; every process stops when any one's stream ends (no rank left waiting)."""
        d, t = self.r.data, self.r.train
        it = source.batches(
            tok,
            t.batch_size,
            d.block_length,
            d.packing,
            stream.Part(self.acc.process_index, self.acc.num_processes, t.seed),
            self.now,
        )
        for batch, after in it:
            if not self._all_have(True):
                return
            self.now = after
            if self.r.train.rank_checksums:
                self.seen += [specs.fingerprint(row.tolist()) for row in batch_rows(batch)]
            yield to_device(batch, self.acc.device)
        self._all_have(False)

    def _all_have(self, mine: bool) -> bool:
        if self.acc.num_processes == 1:
            return mine
        flags = self.acc.gather(torch.tensor([int(mine)], device=self.acc.device))
        return bool(flags.min().item())

    def save(self) -> None:
        """Every process's place into the loop state (collective: call on every process before a checkpoint)."""
        mine = torch.tensor([self.now.as_list()], dtype=torch.long, device=self.acc.device)
        self.progress.stream = self.acc.gather(mine).view(-1, 3).tolist()

    def say_short(self, step: int, per_step: int) -> None:
        t = self.r.train
        log.warning(
            "data: the stream ended after %s tokens, %s short of the %s budget (step %d of %d); stopping "
            "there (data.on_short: stop) and saving the weights; set data.on_short: repeat to read it "
            "again, or add data",
            f"{step * per_step:,}",
            f"{(t.steps - step) * per_step:,}",
            f"{t.steps * per_step:,}",
            step,
            t.steps,
        )
        self.short = {"steps_planned": t.steps, "steps_done": step, "tokens": step * per_step}
