"""The evaluation report: ``report.json`` (validated against ``schema.json``), ``report.md``, plots."""

from __future__ import annotations

import json
import logging
import math
import os
import platform
from pathlib import Path
from typing import Any

from ..foundation import run_folder
from ..foundation.atomic import write_text
from ..foundation.versions import library_versions

log = logging.getLogger(__name__)

SCHEMA_VERSION = "1.0"
SCHEMA_PATH = Path(__file__).with_name("schema.json")
#: wall-clock sections (and the list of files written); everything else is identical across reruns
VOLATILE = ("cost", "timing", "plots")


def sections() -> tuple[str, ...]:
    """The measures' keys of a causal LM's report, in its order: each measure's ``keys`` in the catalog's order
    (``measure.CATALOG``), the wall-clock ones (``VOLATILE``: the cost) last."""
    from .measure import by_task

    keys = [k for m in by_task()["causal-lm"] for k in m.keys]
    return (*(k for k in keys if k not in VOLATILE), *(k for k in keys if k in VOLATILE))


def schema() -> dict:
    """schema.json, with the keys of each measure that declares its own (``Measure.schema``)."""
    from .measure import measures

    out = json.loads(SCHEMA_PATH.read_text())
    for m in measures():
        out["properties"].update(m.schema)
    return out


def jsonable(x: Any) -> Any:
    """Plain JSON types: NaN/inf -> None, tuples -> lists, unknown objects -> str."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if hasattr(x, "item"):  # numpy / torch scalars
        return jsonable(x.item())
    return str(x)


def environment(model) -> dict:
    """Versions and hardware, for the record."""
    import torch

    dev = next(model.parameters()).device
    hw = {
        "device": str(dev),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if dev.type == "cuda":
        hw["gpu"] = torch.cuda.get_device_name(dev)
    return {**library_versions(), "hardware": hw}


class Report:
    """Everything one ``evaluate()`` run measured. ``report.data`` is the JSON document."""

    def __init__(self, data: dict):
        self.data = jsonable(data)

    # ---------------------------------------------------------------- access
    @property
    def rows(self) -> list[dict]:
        """One row per (model, length, method): model, role, length, method, ppl, tokens, ..."""
        return self.data["rows"]

    def __getitem__(self, key):
        return self.data[key]

    def ppl(self, model: str | None = None, length: int | None = None, method: str = "non-overlapping") -> float:
        """The perplexity of one row (model defaults to the evaluated one, the first)."""
        model = model or self.data["models"][0]["name"]
        for r in self.rows:
            if r["model"] == model and r["method"] == method and (length is None or r["length"] == length):
                return r["ppl"]
        raise KeyError(f"no row for model={model!r} length={length} method={method!r}")

    def comparable(self) -> dict:
        """The report without wall-clock sections (reruns on the same inputs give equal values)."""
        return {k: v for k, v in self.data.items() if k not in VOLATILE}

    def validate(self) -> None:
        import jsonschema

        jsonschema.validate(self.data, schema())

    # ---------------------------------------------------------------- output
    def to_json(self) -> str:
        return json.dumps(self.data, indent=2, sort_keys=False)

    def save(self, out: str | os.PathLike, plots: bool = True) -> Path:
        """Write report.json, report.md and (unless ``plots=False``) the PNG plots into ``out``."""
        from .markdown import render_markdown

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.validate()
        files = {}
        if plots:
            from .plots import write_plots

            files = write_plots(self, out)
            self.data["plots"] = sorted(files)
        write_text(out / run_folder.REPORT, self.to_json() + "\n")
        write_text(out / run_folder.REPORT_MD, render_markdown(self, files))
        log.info("wrote %s", out / run_folder.REPORT)
        return out

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Report":
        p = Path(path)
        if p.is_dir():
            p = p / run_folder.REPORT
        return cls(json.loads(p.read_text()))

    def __repr__(self):
        names = ", ".join(m["name"] for m in self.data["models"])
        return f"Report(models=[{names}], lengths={self.data['settings']['lengths']}, rows={len(self.rows)})"
