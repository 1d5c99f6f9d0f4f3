"""The study's cell cache, in one place for ``retrofit study`` and the committed study reports (research/study.py).

A finished cell lives in ``ROOT/<name>/<file>`` (``cell.json`` unless said), a JSON record that carries what
it was measured with, its *plan*. A record is reused only for the same plan (``plan_of(record)`` against the
planned one), never for a cell matched by a ``rerun`` pattern (shell patterns: ``alibi-*``); ``restore``
puts a record back where the cache has none (a report's cells, on a machine that lacks the cache).
"""

from __future__ import annotations

import fnmatch
import json
import logging
from pathlib import Path

from ..foundation import run_folder
from ..foundation.atomic import write_text

log = logging.getLogger(__name__)


def stored_plan(record: dict):
    """The plan a record was cached with: its ``plan`` key (``retrofit study``'s records)."""
    return record.get("plan")


def read(path: Path, plan, plan_of=stored_plan, what: str = "") -> dict | None:
    """The record at ``path`` when it was measured with ``plan``, else None (said in the log when it exists)."""
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    if plan_of(record) == plan:
        return record
    log.info("%s: the cached record ran another plan; not reused", what or path)
    return None


def write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(record, indent=1, default=str))


class CellCache:
    """Finished cells under ``root``, one folder per cell name; ``rerun``: shell patterns of cells never read."""

    def __init__(self, root: str | Path, rerun=()):
        self.root, self.rerun = Path(root), list(rerun)

    def path(self, name: str, file: str = run_folder.STUDY_CELL) -> Path:
        return self.root / name / file

    def recompute(self, name: str) -> bool:
        """Whether ``name`` is to run again though cached (it matches a ``rerun`` pattern)."""
        return any(fnmatch.fnmatchcase(name, p) for p in self.rerun)

    def get(self, name: str, plan, plan_of=stored_plan, file: str = run_folder.STUDY_CELL) -> dict | None:
        """The cell's cached record for ``plan``, else None (also when it is to run again)."""
        if self.recompute(name):
            return None
        return read(self.path(name, file), plan, plan_of, f"cell {name}")

    def put(self, name: str, record: dict, file: str = run_folder.STUDY_CELL) -> None:
        write(self.path(name, file), record)

    def restore(self, name: str, record: dict, file: str = run_folder.STUDY_CELL) -> bool:
        """``record`` into the cache where it has none for ``name``; whether it was written."""
        path = self.path(name, file)
        if path.exists():
            return False
        write(path, record)
        return True
