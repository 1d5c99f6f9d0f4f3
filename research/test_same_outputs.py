"""research/same_outputs.py's comparison: two run folders that differ only in timing, memory and the source tree's
path are the same; a changed weight, a changed loss or a missing file is a difference, said by name."""

import json

import torch
from safetensors.torch import save_file

from same_outputs import compare


def _run(root, src, *, weight=1.0, loss=2.5, seconds=3.0, extra=False):
    root.mkdir(parents=True)
    save_file({"w": torch.full((2,), weight)}, str(root / "model.safetensors"))
    torch.save({"state": {0: {"exp_avg": torch.ones(2)}}}, root / "optimizer.bin")
    summary = {"val_loss": loss, "seconds": seconds, "peak_memory_mib": {"rss": [seconds * 100]}, "src": str(src)}
    (root / "summary.json").write_text(json.dumps(summary))
    cost = f"## Cost\n\n| {int(seconds * 300):,} | {int(seconds * 50)} MiB |\n\n"  # tokens/s, memory
    md = f"# Report\n\nval loss {loss}; took {seconds:.1f} s on 2026-12-0{int(seconds)}\n\n{cost}## Environment\n"
    (root / "report.md").write_text(md)
    if extra:
        (root / "extra.txt").write_text("x")


def test_timing_memory_and_paths_are_not_differences(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    _run(tmp_path / "a", old, seconds=3.0)
    _run(tmp_path / "b", new, seconds=7.0)
    assert compare(tmp_path / "a", tmp_path / "b", old, new) == []


def test_a_weight_a_loss_or_a_file_of_difference_is_said(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    _run(tmp_path / "a", old)
    _run(tmp_path / "b", new, weight=1.5, loss=2.6, extra=True)
    diffs = "\n".join(compare(tmp_path / "a", tmp_path / "b", old, new))
    assert "model.safetensors: sha256 differs" in diffs
    assert "summary.json: content differs" in diffs and "report.md: text differs" in diffs
    assert "only under new: extra.txt" in diffs
