"""Long-input evaluation: perplexity vs length (non-overlapping and sliding windows) with
baselines on the same tokens, loss by position, passkey retrieval, speed and memory.

    report = retrofit.evaluate("runs/gpt2-alibi", lengths=[1024, 2048], data="stdlib", baselines=["gpt2"])
    report.rows        # one row per (model, length, method)
    report.save("runs/gpt2-alibi/eval")   # report.json, report.md, *.png
"""

from .report import Report
from .runner import evaluate

__all__ = ["evaluate", "Report"]
