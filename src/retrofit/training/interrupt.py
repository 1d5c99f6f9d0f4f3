"""Ctrl-C during a fine-tune saves where it stopped. The first SIGINT is noted and the step under way
finishes; the loop then writes a checkpoint at that step and stops, saying which step a re-run of the same
command resumes from. A second SIGINT stops at once (the last checkpoint is then where a re-run resumes).
Under several processes the flag is agreed on (one all-reduce per step), so every process saves at the
same step: a checkpoint is collective."""

from __future__ import annotations

import logging
import signal
import threading

import torch

log = logging.getLogger(__name__)


class Interrupts:
    """A context manager: while inside, SIGINT sets ``self.requested`` instead of raising (once)."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False

    def _handle(self, signum, frame):
        if self.requested:  # the second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.requested = True
        log.warning("interrupt: finishing this step, then saving a checkpoint (Ctrl-C again to stop at once)")

    def agreed(self, acc) -> bool:
        """Whether any process was interrupted (every process gets the same answer)."""
        if acc.num_processes == 1:
            return self.requested
        flag = torch.tensor([1.0 if self.requested else 0.0], device=acc.device)
        return bool(acc.reduce(flag, reduction="sum").item() > 0)
