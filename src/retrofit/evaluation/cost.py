"""Wall time and peak memory of a block of work (CUDA allocator on GPU, peak RSS on CPU)."""

from __future__ import annotations

import re
import resource
import sys
import time

import torch

_STATUS = "/proc/self/status"


def _status_kb(field: str) -> int | None:
    try:
        with open(_STATUS) as f:
            m = re.search(rf"^{field}:\s+(\d+)\s+kB", f.read(), re.M)
        return int(m.group(1)) if m else None
    except OSError:
        return None


def _reset_rss_peak() -> bool:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0: ``echo 5 > /proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _maxrss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


class Meter:
    """``with Meter(device) as m: ...``; then ``m.result()`` -> seconds, peak memory and how it was measured.

    - CUDA: ``torch.cuda.max_memory_allocated`` (peak of tensors, weights included), reset at entry.
    - Linux CPU: peak resident set size of the process (VmHWM), reset at entry through clear_refs,
      so the peak belongs to this block.
    - elsewhere: ``ru_maxrss``, the peak since the process started (an upper bound).
    ``peak_memory_delta_bytes`` is the peak minus what was in use at entry.
    """

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.measure = "torch.cuda.max_memory_allocated"
            self.before = torch.cuda.memory_allocated(self.device)
        elif _reset_rss_peak() and _status_kb("VmHWM") is not None:
            self.measure = "peak RSS (VmHWM, reset per measurement)"
            self.before = (_status_kb("VmRSS") or 0) * 1024
        else:
            self.measure = "ru_maxrss (peak since process start)"
            self.before = _maxrss_bytes()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
        elif self.measure.startswith("peak RSS"):
            self.peak = (_status_kb("VmHWM") or 0) * 1024
        else:
            self.peak = _maxrss_bytes()
        self.seconds = time.perf_counter() - self.t0
        return False

    def result(self, tokens: int) -> dict:
        return {
            "seconds": self.seconds,
            "tokens_per_s": tokens / self.seconds if self.seconds > 0 else None,
            "peak_memory_bytes": int(self.peak),
            "peak_memory_delta_bytes": int(max(0, self.peak - self.before)),
            "memory_measure": self.measure,
        }
