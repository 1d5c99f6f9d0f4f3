"""Atomic writes: a file or a folder appears complete or not at all (a killed run, a full disk or a
crash leaves the old one, never half of the new one). Every writer in the package goes through here.

    write_text(path, text)                   # a file
    write_dir(path, lambda tmp: model.save_pretrained(tmp))   # a folder
    with replacing(path) as tmp: ...         # anything written to tmp, renamed over path on success
    publish(tmp, path)                       # a folder that other processes filled (checkpoints)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path


def sibling(path: Path, tag: str = "tmp") -> Path:
    """A hidden, unique name next to ``path`` (same file system: the rename is atomic)."""
    return path.parent / f".{path.name}.{tag}-{uuid.uuid4().hex[:8]}"


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def publish(tmp: Path, path: Path, *, keep_existing: bool = False) -> Path:
    """Rename the complete ``tmp`` to ``path``. An existing ``path`` is moved aside first and removed
    after, so ``path`` is never half-written; with ``keep_existing`` an existing one (another process
    finished first) is kept and ``tmp`` dropped."""
    tmp, path = Path(tmp), Path(path)
    if path.exists():
        if keep_existing:
            _remove(tmp)
            return path
        old = sibling(path, "old")
        os.replace(path, old)
        os.replace(tmp, path)
        _remove(old)
        return path
    try:
        os.replace(tmp, path)
    except OSError:  # a racing process created it between the check and the rename
        if not (keep_existing and path.exists()):
            raise
        _remove(tmp)
    return path


@contextlib.contextmanager
def replacing(path: str | os.PathLike, *, keep_existing: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write (a file or a folder); on success it is published
    over ``path``; on any error it is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling(path)
    try:
        yield tmp
        publish(tmp, path, keep_existing=keep_existing)
    finally:
        if tmp.exists():
            _remove(tmp)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with replacing(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_dir(path: str | os.PathLike, write: Callable[[Path], object], *, keep_existing: bool = False) -> Path:
    """Call ``write(tmp_dir)`` and publish the folder over ``path``."""
    with replacing(path, keep_existing=keep_existing) as tmp:
        tmp.mkdir()
        write(tmp)
    return Path(path)
