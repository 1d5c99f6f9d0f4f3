"""One real tiny pipeline run (recipes/tiny-run.yaml), shared by tests/pipeline/test_stages.py and
tests/publishing/test_cards_push.py.

The run is made once per test session (about 20 s) and cached here; tests that change a run folder
work on a copy (``copy_run``)."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY_RECIPE = REPO / "recipes" / "tiny-run.yaml"
_CACHE: dict[str, Path] = {}


def shared_run(tmp_path_factory) -> Path:
    """The run folder of one uninterrupted ``retrofit.run(recipes/tiny-run.yaml)``."""
    if "run" not in _CACHE:
        import retrofit

        out = tmp_path_factory.getbasetemp() / "shared-tiny-run"
        _CACHE["run"] = retrofit.run(TINY_RECIPE, overrides=[f"output_dir={out}"])
    return _CACHE["run"]


def copy_run(run_dir: Path, dest: Path) -> Path:
    """A copy of a run folder whose recipe points at the copy (so a re-run works there)."""
    import yaml

    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("checkpoints"))
    recipe = yaml.safe_load((dest / "run.yaml").read_text())
    recipe["output_dir"] = str(dest)
    (dest / "run.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return dest
