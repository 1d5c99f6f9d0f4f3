"""Atomic writes: a file or a folder appears complete or not at all (a killed run, a full disk or a
crash leaves the old one, never half of the new one). Every writer in the package goes through here.

    write_text(path, text)                   # a file
    write_dir(path, lambda tmp: model.save_pretrained(tmp))   # a folder
    with replacing(path) as tmp: ...         # anything written to tmp, renamed over path on success
    publish(tmp, path)                       # a folder that other processes filled (checkpoints)

A library writer (``save_pretrained``, ``savefig``, ``save_state``) writes into the temporary path one of
these hands out. A raw write anywhere in the package (``open(..., "w")``, ``.write_text``, ``.save_pretrained``,
``savefig``, ``torch.save``, ...) says why it may in a ``# raw write: WHY`` comment on its line or the three above;
``tests/foundation/test_run_folder.py`` scans the package and fails on one without.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import OutputError

# How writers say "the disk is full": an errno, or the text of safetensors' Rust error.
_NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_NO_SPACE_TEXT = ("No space left on device", "Disk quota exceeded")
_REFUSED_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}


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


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _free_bytes(path: Path) -> int:
    for p in (path, *path.parents):
        if p.exists():
            return shutil.disk_usage(p).free
    return 0


def no_space(exc: BaseException, where: str | os.PathLike) -> bool:
    """Whether ``exc`` is a write that failed for lack of disk space. torch's zip writer says only
    "unexpected pos" (its stream failed); then the free space of ``where`` decides."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _NO_SPACE_ERRNOS:
            return True
        if any(text in str(e) for text in _NO_SPACE_TEXT):
            return True
        if isinstance(e, RuntimeError) and "unexpected pos" in str(e):
            return _free_bytes(Path(where)) < 1 << 20
    return False


def _refused(exc: BaseException) -> bool:
    """Whether ``exc`` is the file system refusing a write: no permission, or a read-only mount."""
    return isinstance(exc, OSError) and exc.errno in _REFUSED_ERRNOS


def no_space_error(path: str | os.PathLike) -> OutputError:
    return OutputError(
        f"no space left on device while writing {path}; nothing was kept. Free some space "
        "(or write somewhere else) and run again"
    )


def make_parent(path: str | os.PathLike) -> Path:
    """Create the folder that will hold ``path``; an OutputError says why it cannot be."""
    parent = Path(path).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise OutputError(
            f"cannot create {parent}: a file is in the way ({_file_in_the_way(parent)}); choose another path"
        ) from None
    except OSError as e:
        raise OutputError(f"cannot create {parent}: {e.strerror or e}; choose another path") from None
    return parent


def check_creatable(path: str | os.PathLike, what: str = "") -> None:
    """Say now, before any work and creating nothing that stays, when the folder ``path`` cannot be created
    or written into: it or an ancestor is a file, or the nearest existing one refuses a new file. ``what``
    names where the path came from ("--out", "output_dir") for the message."""
    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    nearest = next(p for p in (path, *path.parents) if p.exists())
    if not nearest.is_dir():
        if nearest == path:
            raise OutputError(f"{name} is a file; give a folder (it is created if needed)")
        raise OutputError(f"{name} cannot be created: a file is in the way ({nearest}); choose another path")
    # an existing folder is replaced through a temporary sibling: its parent must take one too
    for folder in (nearest, *([path.absolute().parent] if nearest == path else [])):
        refused = _cannot_write_in(folder)
        if refused:
            raise OutputError(
                f"{name} cannot be written: {folder.absolute()} is not writable ({refused}); choose another path"
            )


def _cannot_write_in(folder: Path) -> str | None:
    """Why a file cannot be created in ``folder`` (None when it can). Tried, not read from permission bits:
    root writes past them, and a read-only mount or an ACL refuses what the bits allow."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".retrofit-probe-")
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    os.unlink(probe)
    return None


def _file_in_the_way(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            return p
    return path


@contextlib.contextmanager
def replacing(path: str | os.PathLike, *, keep_existing: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write (a file or a folder); on success it is published
    over ``path``; on any error it is removed and ``path`` is untouched. A full disk is an
    OutputError that says so."""
    path = Path(path)
    make_parent(path)
    tmp = sibling(path)
    try:
        yield tmp
        publish(tmp, path, keep_existing=keep_existing)
    except Exception as e:
        if no_space(e, tmp):
            raise no_space_error(path) from e
        if _refused(e):
            raise OutputError(f"cannot write {path}: {e.strerror or e}; nothing was kept. Choose another path") from e
        raise
    finally:
        if tmp.exists():
            _remove(tmp)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with replacing(path) as tmp:
        # raw write: writes the temporary file that replacing() renames into place
        tmp.write_text(text)
    return Path(path)


def write_dir(path: str | os.PathLike, write: Callable[[Path], object], *, keep_existing: bool = False) -> Path:
    """Call ``write(tmp_dir)`` and publish the folder over ``path``."""
    with replacing(path, keep_existing=keep_existing) as tmp:
        tmp.mkdir()
        write(tmp)
    return Path(path)
