"""Long-input evaluation: perplexity vs length (non-overlapping and sliding windows) with
baselines on the same tokens, loss by position, passkey retrieval, speed and memory.

    report = retrofit.evaluate("runs/gpt2-alibi", lengths=[1024, 2048], data="stdlib", baselines=["gpt2"])
    report.rows        # one row per (model, length, method)
    report.save("runs/gpt2-alibi/eval")   # report.json, report.md, *.png
"""

__all__ = ["evaluate", "Report"]


def __getattr__(name):  # imported on first use: ``retrofit.evaluation.options`` stays light
    if name == "evaluate":
        from .runner import evaluate

        return evaluate
    if name == "Report":
        from .report import Report

        return Report
    raise AttributeError(f"module 'retrofit.evaluation' has no attribute {name!r}")
