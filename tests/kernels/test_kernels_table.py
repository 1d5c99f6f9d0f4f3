"""The attention kernels are one table (``retrofit.kernels.KERNELS``) and the kernel choice lives in one place (the
model's state, saved with it): the CLI's choices and help come from the table, each row is one module, earlier
names map in one place, nothing reads an environment variable, and ``set_kernel`` reaches the saved config."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch

import retrofit
from retrofit import kernels
from retrofit.cli import convert as cli_convert
from retrofit.foundation.errors import OptionError
from retrofit.patch.conversion import set_kernel

from ..tiny import TINY, ids

ROOT = Path(__file__).resolve().parents[2]


def _convert_parser():
    parser = argparse.ArgumentParser()
    cli_convert.add_parser(parser.add_subparsers())
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["convert"]


def test_the_cli_offers_the_tables_choices_and_lists_every_kernel():
    sub = _convert_parser()
    kernel_opt = next(a for a in sub._actions if "--kernel" in a.option_strings)
    assert kernel_opt.choices is None  # no second list: the table validates
    assert [kernel_opt.type(name) for name in kernels.CHOICES] == list(kernels.CHOICES)
    with pytest.raises(argparse.ArgumentTypeError, match="kernel must be one of auto, sdpa, "):
        kernel_opt.type("fast")
    kernel_help = cli_convert.scheme_help().split("kernels (--kernel)")[1].split("architectures:")[0]
    listed = re.findall(r"^  ([\w-]+): ", kernel_help, re.MULTILINE)
    assert listed == [p.name for p in kernels.KERNELS]


def test_each_row_is_one_module_named_after_it_and_no_other_module_names_a_kernel():
    rows = {p.name.replace("-", "_"): p for p in kernels.KERNELS}
    assert {p.serves.__module__ for p in kernels.KERNELS} == {p.run.__module__ for p in kernels.KERNELS}
    assert all(p.run.__module__ == f"retrofit.kernels.{mod}" for mod, p in rows.items())
    helpers = {
        "__init__",
        "call",
        "cpu_flash",
        "denormal",
    }  # the table, the call record, the CPU flash op, the denormal flush
    assert {f.stem for f in (ROOT / "src" / "retrofit" / "kernels").glob("*.py")} - helpers == set(rows)
    quoted = re.compile("[\"'](" + "|".join(re.escape(p.name) for p in kernels.KERNELS) + ")[\"']")
    outside = [
        f"{f.relative_to(ROOT)}: {m.group(0)}"
        for f in sorted((ROOT / "src" / "retrofit").rglob("*.py"))
        if f != ROOT / "src" / "retrofit" / "kernels" / "__init__.py"
        for m in quoted.finditer(f.read_text())
    ]
    assert not outside, outside


def test_a_name_the_table_does_not_hold_or_a_kernel_that_cannot_serve_the_kind_is_an_error():
    with pytest.raises(OptionError, match="kernel must be one of auto, "):
        kernels.check("fused", "bias")  # a 0.1 name: no alias kept
    with pytest.raises(OptionError, match="cannot serve a rotary scheme"):
        kernels.check("cpu-flash-mask", "rotary")


def test_nothing_reads_the_kernel_from_the_environment():
    hits = [
        f"{f.relative_to(ROOT)}"
        for d in (ROOT / "src" / "retrofit", ROOT / "research")
        for f in sorted(d.rglob("*.py"))
        if "RETROFIT_ATTENTION_PATH" in f.read_text()
    ]
    assert not hits, hits
    code = [
        f"{f.relative_to(ROOT)}"
        for f in sorted((ROOT / "src" / "retrofit" / "kernels").glob("*.py"))
        + [ROOT / "src" / "retrofit" / "patch" / "attention.py"]
        if "environ" in f.read_text()
    ]
    assert not code, code


def test_set_kernel_is_saved_and_an_earlier_name_loads(tmp_path):
    model = retrofit.convert(TINY["gpt2"](), "t5", kernel="auto")
    set_kernel(model, "chunked")
    assert model.config.retrofit["kernel"] == "chunked"
    retrofit.save(model, tmp_path / "m")
    loaded = retrofit.load(tmp_path / "m")
    assert retrofit.describe(loaded)["kernel"] == "chunked"
    with torch.no_grad():
        loaded(ids(1, 20))
    assert retrofit.describe(loaded)["last_kernel"] == "chunked"
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    with pytest.raises(OptionError, match="kernel must be one of"):
        set_kernel(loaded, "fast")
    assert retrofit.describe(loaded)["kernel"] == "chunked"  # unchanged by the refused choice
    config["retrofit"]["kernel"] = "fused"  # a 0.1 name in a saved config: no alias kept, a clear error
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(OptionError, match="kernel must be one of auto, "):
        retrofit.load(tmp_path / "m")


@pytest.mark.parametrize("term", ["softcap", "sinks"])
def test_only_a_kernel_that_writes_the_scores_out_serves_a_models_own_score_terms(term):
    """gemma2's softcap and gpt_oss's sinks: auto takes the one row that applies them (chunked), a named row
    that cannot says why, and the output equals the plain formula."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g) for _ in range(3))
    slopes = torch.tensor([0.5, 0.25])
    extra = {"softcap": 2.0} if term == "softcap" else {"sinks": torch.tensor([1.0, -0.5])}
    call = kernels.Call(q, k, v, 8**-0.5, bias=lambda h, i, j: -slopes[h] * (i - j), slopes=slopes, **extra)
    assert call.scored
    assert kernels.choose(call).name == "chunked"
    assert all(p.why_not(call) for p in kernels.KERNELS if not p.scores)
    with pytest.raises(RuntimeError, match="does not apply"):
        kernels.choose(call, "sdpa-alibi-dims")
    out, kernel = kernels.attend(call)
    i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
    content = q @ k.transpose(-1, -2) * 8**-0.5
    if term == "softcap":
        content = torch.tanh(content / 2.0) * 2.0
    scores = (content - slopes[:, None, None] * (i - j)).masked_fill(j > i, float("-inf"))
    if term == "sinks":
        sink = extra["sinks"].reshape(1, 2, 1, 1).expand(1, 2, 12, 1)
        probs = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(scores, -1)
    torch.testing.assert_close(out, probs @ v, atol=1e-6, rtol=1e-5)
