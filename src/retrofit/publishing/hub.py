"""Push a run folder to the Hugging Face Hub: ``retrofit push RUN_DIR --repo user/name``.

What is uploaded, from a staging folder that holds exactly these files:

- the weights (``*.safetensors`` and their index), ``config.json``, ``generation_config.json`` and the
  tokenizer files (see ``run_folder.published_layout``): an exact native transformers export at the root; else the
  retrofit checkpoint (``final/`` of a fine-tune, or the folder ``retrofit convert`` wrote) at the
  root and an inexact native export, if any, in ``native/``;
- ``README.md`` (the model card, rendered in memory for the repo from what the folder holds when the folder
  has none or one that retrofit generated; a card edited by hand is uploaded as it is);
- ``eval/report.json``, ``eval/report.md`` and ``eval/*.png``.

Nothing is written into the run folder (a dry run writes nothing at all). Never uploaded: optimizer, scheduler or RNG state, ``checkpoints/``, ``adapter/``, logs, the
manifest or the recipe (they hold local paths). The token comes from ``HF_TOKEN`` or the login
cache (``hf auth login``); a missing token is a :class:`~retrofit.foundation.errors.HubError` (exit 5) before
anything is created. The token is passed to ``HfApi`` only: never logged, printed or written.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from ..foundation import run_folder
from ..foundation.errors import HubError, OptionError, RetrofitError
from ..patch.saved_config import SAVED_MODEL_TYPE, marked

log = logging.getLogger(__name__)

MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
REPORT_FILES = (run_folder.REPORT, run_folder.REPORT_MD)
# Never uploaded, whatever folder they turn up in (checked on the staged list as a last guard).
FORBIDDEN = re.compile(
    r"(optimizer|scheduler|rng_state|random_states|scaler|checkpoint|training_args|\.pt$|\.bin$"
    r"|\.pkl$|log\.jsonl$|manifest\.json$|recipe\.yaml$|run\.yaml$)",
    re.IGNORECASE,
)
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def check_repo_id(repo: str, key: str = "--repo") -> str:
    if not isinstance(repo, str) or not _REPO_ID.match(repo) or ".." in repo or repo.endswith((".git", ".")):
        raise OptionError(f"{key} must be a Hub repo id like 'user/name', got {repo!r}")
    return repo


def _weights(prefix: str, src: Path) -> dict[str, Path]:
    files = {prefix + p.name: p for p in sorted(src.glob("*.safetensors"))}
    if not files:
        raise RetrofitError(f"{src} holds no *.safetensors weights")
    for name in MODEL_FILES + TOKENIZER_FILES:
        if (src / name).is_file():
            files[prefix + name] = src / name
    files.update({prefix + p.as_posix(): src / p for p in run_folder.st_files(src)})  # an embedding model's modules
    return files


def upload_plan(run_dir: str | os.PathLike, repo: str | None = None) -> list[tuple[str, Path | bytes]]:
    """[(path in the repo, local file or the bytes to upload)] of everything a push uploads, sorted by repo
    path. Writes nothing: the card is rendered in memory for ``repo`` when the folder has none or has one
    retrofit generated (``cards.is_generated``); a card edited by hand is uploaded as it is."""
    run_dir = Path(run_dir)
    plan: dict[str, Path | bytes] = {}
    for prefix, src in run_folder.published_layout(run_dir).items():
        plan.update(_weights(prefix, src))
    card = run_dir / run_folder.CARD
    from .cards import card_text, is_generated

    if not card.is_file() or is_generated(card.read_text()):
        template = ((run_folder.recipe(run_dir) or {}).get("card") or {}).get("template")
        plan[run_folder.CARD] = card_text(run_dir, template=template, repo=repo).encode()
        log.info("model card rendered for %s from what %s holds", repo or "the Hub", run_dir)
    else:
        plan[run_folder.CARD] = card
        if repo and repo not in card.read_text():
            log.warning(
                "%s was edited by hand (no retrofit mark) and does not name %s: it is uploaded as it is", card, repo
            )
    ev = run_dir / run_folder.EVAL
    for p in [ev / n for n in REPORT_FILES] + sorted(ev.glob("*.png")):
        if p.is_file():
            plan[f"{run_folder.EVAL}/{p.name}"] = p
    bad = [name for name in plan if FORBIDDEN.search(name)]
    if bad:
        raise RetrofitError(f"refusing to upload {bad}: training state and logs are never pushed")
    return sorted(plan.items())


def _size(src: Path | bytes) -> int:
    return len(src) if isinstance(src, bytes) else src.stat().st_size


def stage(plan: list[tuple[str, Path]], folder: Path) -> Path:
    """Copy (hard-link where possible) the planned files into ``folder``."""
    for name, src in plan:
        dest = folder / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(src, bytes):  # rendered in memory (the card)
            # raw write: a temporary staging folder, uploaded and then deleted
            dest.write_bytes(src)
            continue
        config = json.loads(src.read_text()) if src.name == "config.json" else {}
        if "retrofit" in config and config.get("model_type") != SAVED_MODEL_TYPE:  # saved before configs were marked
            # raw write: a temporary staging folder, uploaded and then deleted
            dest.write_text(json.dumps(marked(config), indent=2, sort_keys=True) + "\n")
            log.info("%s: staged with model_type 'retrofit' (an older retrofit checkpoint)", name)
            continue
        try:
            os.link(src, dest)
        except OSError:
            shutil.copy2(src, dest)
    return folder


def get_token() -> str | None:
    """``HF_TOKEN``, else the token saved by ``hf auth login`` (None when neither)."""
    token = os.environ.get("HF_TOKEN")
    if token:
        return token
    from huggingface_hub import get_token as hf_get_token

    return hf_get_token()


def token_source() -> str:
    if os.environ.get("HF_TOKEN"):
        return "HF_TOKEN"
    return "the login cache" if get_token() else "none"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def format_plan(files: list[tuple[str, int]]) -> str:
    """The listing a dry run prints: ``files`` is ``push(...)["files"]``, [(path in the repo, bytes)]."""
    total = sum(n for _, n in files)
    width = max(len(name) for name, _ in files)
    lines = [f"  {name:<{width}}  {_human(n):>10}" for name, n in files]
    return "\n".join(lines + [f"  {len(files)} files, {_human(total)}"])


def push(
    run_dir,
    repo: str,
    *,
    private: bool = False,
    revision: str = "main",
    dry_run: bool = False,
    commit_message: str | None = None,
) -> dict:
    """Upload a run folder's model, card and report to ``repo`` (``user/name``). Writes nothing into the folder.

    Returns ``{"repo", "revision", "files": [(path in repo, bytes)], "commit_url"}`` (no commit_url
    for a dry run, which calls nothing on the Hub and writes nothing anywhere).
    """
    repo = check_repo_id(repo)
    if not isinstance(revision, str) or not revision:
        raise OptionError(f"--revision must be a branch name, got {revision!r}")
    run_dir = Path(run_dir)
    plan = upload_plan(run_dir, repo)
    result = {
        "repo": repo,
        "revision": revision,
        "files": [(n, _size(p)) for n, p in plan],
        "weights": run_folder.published_weights(run_dir),
        "commit_url": None,
    }
    if dry_run:
        log.info("dry run: would upload %d files to %s@%s", len(plan), repo, revision)
        return result
    token = get_token()
    if not token:
        raise HubError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (nothing was uploaded)")
    result["commit_url"] = _upload(
        plan, repo, token, private, revision, commit_message or f"retrofit: upload {run_dir.name}"
    )
    return result


def _upload(plan, repo: str, token: str, private: bool, revision: str, message: str) -> str:
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    log.info("creating %s (private=%s) if needed", repo, private)
    try:
        api.create_repo(repo_id=repo, repo_type="model", private=private, exist_ok=True)
        if revision != "main":
            api.create_branch(repo_id=repo, branch=revision, repo_type="model", exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="retrofit-push-") as tmp:
            folder = stage(plan, Path(tmp))
            log.info("uploading %d files to %s@%s", len(plan), repo, revision)
            info = api.upload_folder(
                folder_path=str(folder), repo_id=repo, repo_type="model", revision=revision, commit_message=message
            )
    except Exception as e:  # HTTP / network errors from the Hub, with the token kept out of the message
        if isinstance(e, RetrofitError):
            raise
        raise HubError(f"upload to {repo} failed: {_scrub(str(e), token)}") from None
    url = getattr(info, "commit_url", None) or str(info)
    log.info("pushed: %s", url)
    return url


def _scrub(text: str, token: str) -> str:
    return text.replace(token, "***") if token else text
