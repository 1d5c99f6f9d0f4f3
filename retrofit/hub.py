"""Push a run folder to the Hugging Face Hub: ``retrofit push RUN_DIR --repo user/name``.

What is uploaded, from a staging folder that holds exactly these files:

- the weights (``*.safetensors`` and their index), ``config.json``, ``generation_config.json`` and the
  tokenizer files (see ``run_folder.published_layout``): an exact native transformers export at the root; else the
  retrofit checkpoint (``final/`` of a fine-tune, or the folder ``retrofit convert`` wrote) at the
  root and an inexact native export, if any, in ``native/``;
- ``README.md`` (the model card; written from the folder when it has none, and rewritten on each
  push while it is one that push wrote);
- ``eval/report.json``, ``eval/report.md`` and ``eval/*.png``.

Never uploaded: optimizer, scheduler or RNG state, ``checkpoints/``, ``adapter/``, logs, the
manifest or the recipe (they hold local paths). The token comes from ``HF_TOKEN`` or the login
cache (``hf auth login``); a missing token is a :class:`~retrofit.errors.HubError` (exit 5) before
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

from . import run_folder as rf
from .errors import HubError, OptionError, RetrofitError
from .saved_config import SAVED_MODEL_TYPE, marked

log = logging.getLogger(__name__)

MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json")
REPORT_FILES = (rf.REPORT, rf.REPORT_MD)
# Never uploaded, whatever folder they turn up in (checked on the staged list as a last guard).
FORBIDDEN = re.compile(r"(optimizer|scheduler|rng_state|random_states|scaler|checkpoint|training_args|\.pt$|\.bin$"
                       r"|\.pkl$|log\.jsonl$|manifest\.json$|recipe\.yaml$|run\.yaml$)", re.IGNORECASE)
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
    return files


def upload_plan(run_dir: str | os.PathLike, repo: str | None = None) -> list[tuple[str, Path]]:
    """[(path in the repo, local file)] of everything a push uploads, sorted by repo path. A folder
    without a model card gets one written (for ``repo``)."""
    run_dir = Path(run_dir)
    plan: dict[str, Path] = {}
    for prefix, src in rf.published_layout(run_dir).items():
        plan.update(_weights(prefix, src))
    card = run_dir / rf.CARD
    from .cards import AUTO_MARK, write_card

    if not card.is_file() or AUTO_MARK in card.read_text():  # none, or one push wrote: (re)write from the folder
        write_card(run_dir, repo=repo, auto=True)
        log.info("model card %s written from what %s holds (remove its last line to keep hand edits)", card, run_dir)
    plan[rf.CARD] = card
    ev = run_dir / rf.EVAL
    for p in [ev / n for n in REPORT_FILES] + sorted(ev.glob("*.png")):
        if p.is_file():
            plan[f"eval/{p.name}"] = p
    bad = [name for name in plan if FORBIDDEN.search(name)]
    if bad:
        raise RetrofitError(f"refusing to upload {bad}: training state and logs are never pushed")
    return sorted(plan.items())


def stage(plan: list[tuple[str, Path]], folder: Path) -> Path:
    """Copy (hard-link where possible) the planned files into ``folder``."""
    for name, src in plan:
        dest = folder / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        config = json.loads(src.read_text()) if src.name == "config.json" else {}
        if "retrofit" in config and config.get("model_type") != SAVED_MODEL_TYPE:  # saved before configs were marked
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


def format_plan(plan: list[tuple[str, Path]]) -> str:
    total = sum(p.stat().st_size for _, p in plan)
    width = max(len(n) for n, _ in plan)
    lines = [f"  {name:<{width}}  {_human(p.stat().st_size):>10}" for name, p in plan]
    return "\n".join(lines + [f"  {len(plan)} files, {_human(total)}"])


def push(run_dir, repo: str, *, private: bool = False, revision: str = "main", dry_run: bool = False,
         commit_message: str | None = None) -> dict:
    """Upload a run folder's model, card and report to ``repo`` (``user/name``).

    Returns ``{"repo", "revision", "files": [(path in repo, bytes)], "commit_url"}`` (no commit_url
    for a dry run, which calls nothing on the Hub).
    """
    repo = check_repo_id(repo)
    if not isinstance(revision, str) or not revision:
        raise OptionError(f"--revision must be a branch name, got {revision!r}")
    run_dir = Path(run_dir)
    plan = upload_plan(run_dir, repo)
    result = {"repo": repo, "revision": revision, "files": [(n, p.stat().st_size) for n, p in plan],
              "weights": rf.published_weights(run_dir), "commit_url": None}
    if dry_run:
        log.info("dry run: would upload %d files to %s@%s", len(plan), repo, revision)
        return result
    token = get_token()
    if not token:
        raise HubError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (nothing was uploaded)")
    result["commit_url"] = _upload(plan, repo, token, private, revision,
                                   commit_message or f"retrofit: upload {run_dir.name}")
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
            info = api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model", revision=revision,
                                     commit_message=message)
    except Exception as e:  # HTTP / network errors from the Hub, with the token kept out of the message
        if isinstance(e, RetrofitError):
            raise
        raise HubError(f"upload to {repo} failed: {_scrub(str(e), token)}") from None
    url = getattr(info, "commit_url", None) or str(info)
    log.info("pushed: %s", url)
    return url


def _scrub(text: str, token: str) -> str:
    return text.replace(token, "***") if token else text
