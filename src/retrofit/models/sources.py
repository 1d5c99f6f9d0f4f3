"""Where a model comes from, checked before transformers reads it: a local folder, a GGUF file or a
Hub id. Each way that fails for the user's reason (no such path, a folder that is not a model, a
model that is not a causal LM, damaged weights, the Hub out of reach) is retrofit's own error that
says what is wrong and what to do, never transformers' traceback."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from ..foundation.errors import HubError, ModelLoadError, RetrofitError, UnsupportedArchitectureError
from . import builtin

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0  # one request says whether the Hub answers; its own retries take a minute


def check(target: str, *, gguf: bool = False) -> bool:
    """Refuse what cannot be a causal LM before loading; True for a retrofit checkpoint folder.
    A name that is not on disk must be a Hub id."""
    path = Path(target)
    if gguf:
        return False
    if path.exists():
        return _check_folder(path)
    if names_a_path(target):
        raise _missing(target)
    return False


def names_a_path(name: str) -> bool:
    """Whether a model argument names a local path, not a Hub id, decided on this machine alone. As in
    transformers, a path that exists wins; so does one that starts with ``.``, ``/`` or ``~``, one with a path
    separator that is not shaped like a Hub id (``org/name``), and an ``org/name`` whose ``org`` is a folder
    here (``runs/gpt2-alibi`` beside ``runs/tiny-gpt2-alibi``). Anything else shaped like a Hub id is one."""
    if Path(name).expanduser().exists() or name.startswith((".", "/", "~", os.sep)):
        return True
    if os.altsep and os.altsep in name:
        return True
    if not _is_hub_id(name):
        return True  # not a Hub id: what can it be but a path (said as "no such file or folder")
    return "/" in name and Path(name.split("/", 1)[0]).is_dir()


ST_PATTERNS = ["modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "*/config.json"]


def sentence_transformers_source(name_or_path: str, gguf_file: str | None = None) -> Path | None:
    """The folder holding an embedding model's sentence-transformers files (``modules.json``, its pooling and
    ``Normalize``), which convert and fine-tune keep: a local folder or a built-in name as it is; a Hub id: those
    files alone, fetched (or read from the cache when offline). None for a model without them; a Hub id whose
    files cannot be read is said, with what the result loses."""
    local = builtin.local_folder(name_or_path, gguf_file)
    if local is not None or gguf_file or not _is_hub_id(name_or_path):
        return local
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(name_or_path, allow_patterns=ST_PATTERNS))
    except OSError as e:  # offline and not cached, the Hub out of reach, no such repository
        log.warning(
            "%s: its sentence-transformers files (modules.json, pooling, normalize) could not be read (%s); "
            "SentenceTransformer() of the result will use mean pooling without its normalisation",
            name_or_path,
            type(e).__name__,
        )
        return None
    return folder if (folder / "modules.json").is_file() else None


def _missing(name: str) -> ModelLoadError:
    first = name.split("/", 1)[0]
    why = (
        f" ({first}/ is a folder here, so this is a path, not a Hub id)"
        if "/" in name and _is_hub_id(name) and Path(first).is_dir()
        else ""
    )
    return ModelLoadError(
        f"no such file or folder: {name}{why}; give a model folder, a .gguf file, or a Hub id (org/name)"
    )


def precheck(name: str, gguf_file: str | None = None) -> None:
    """What can be said of a model argument without importing torch: a missing path or GGUF file, a file
    given as a folder, a name that is neither a path nor a Hub id. Built-in names are resolved later."""
    if name.startswith(builtin.PREFIXES):
        return
    path = Path(name)
    if gguf_file:
        gguf = path / gguf_file if path.is_dir() else Path(gguf_file)
        if not (gguf.is_file() or path.is_file()):
            raise ModelLoadError(f"no such GGUF file: {gguf}")
        return
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"no such GGUF file: {path}")
        return
    if path.exists():
        _model_folder(path)
        return
    if names_a_path(name):
        raise _missing(name)
    _hub_or_cache(name)


def _hub_or_cache(hub_id: str) -> None:
    """A Hub id that is neither in the local Hugging Face cache nor reachable (offline, or the Hub does not
    answer one quick request): the error ``from_pretrained`` would end in, said now."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(hub_id, "config.json"), str):
        return
    why = hub_unusable()
    if why:
        raise _uncached(hub_id, why)


def hub_unusable() -> str | None:
    """Why the Hub cannot be asked now, or None: ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set, or the
    one quick request this process makes to the Hub (``_probe``: asked once, remembered) got no answer."""
    from huggingface_hub import constants

    if _offline_by_env() or (constants.HF_HUB_OFFLINE and constants.ENDPOINT not in _probed):
        return "HF_HUB_OFFLINE is set"
    return None if _probe(constants.ENDPOINT) is None else "the Hub does not answer"


_probed: dict[str, str | None] = {}  # endpoint -> why it did not answer (None: it did), once per process


def _probe(endpoint: str) -> str | None:
    if endpoint not in _probed:
        _probed[endpoint] = _unreachable(endpoint)
        if _probed[endpoint] is not None:
            log.warning(
                "%s does not answer (%s); this process reads the local Hugging Face cache only",
                endpoint,
                _probed[endpoint],
            )
    return _probed[endpoint]


def _uncached(hub_id: str, why: str) -> HubError:
    return HubError(
        f"{hub_id!r} is not a local folder and not in the Hugging Face cache, and {why}; check the "
        "name or path, or connect to download it"
    )


def _is_hub_id(name: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _model_folder(path: Path) -> Path:
    """``path/config.json``, or the error that says why ``path`` is not a model folder."""
    if not path.is_dir():
        raise ModelLoadError(
            f"{path} is a file, not a model; give the folder that holds config.json and the weights, or a .gguf file"
        )
    config = path / "config.json"
    if not config.is_file():
        raise ModelLoadError(
            f"{path} is not a model folder (it has no config.json); give a folder written by "
            "save_pretrained or retrofit convert, a .gguf file, or a Hub id"
        )
    return config


def _check_folder(path: Path) -> bool:
    config = _model_folder(path)
    try:
        d = json.loads(config.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{config} is not valid JSON ({e}); restore the file or save the model again") from None
    if "retrofit" in d:
        return True
    if "auto_map" not in d:  # remote-code models name their own classes
        check_model_type(d.get("model_type"), str(path), d.get("architectures"))
    return False


def check_model_type(model_type: str | None, name: str, architectures: list | None = None) -> None:
    """A config transformers knows, of a causal language model, or of an encoder whose config names its head
    (``architectures``: a masked LM, a classifier; ALBERT and DistilBERT have no causal-LM class at all)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from ..foundation.task import of_class

    if not model_type:
        raise ModelLoadError(f"{name}/config.json has no model_type: it is not a transformers model config")
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ModelLoadError(
            f"{name}: model type {model_type!r} is unknown to transformers "
            f"{transformers.__version__}; upgrade transformers or check the model"
        )
    head = (architectures or [None])[0]
    with_head = of_class(head).name not in ("causal-lm", "embeddings") and hasattr(transformers, head or "")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not with_head:
        raise UnsupportedArchitectureError(
            f"{name} is a {model_type!r} model ({head or 'no architectures in its config'}), which is neither a "
            "causal (decoder-only) language model nor an encoder with its head (a masked LM or a classifier); "
            f"retrofit converts: {supported_architectures()}"
        )


def supported_architectures() -> str:
    from ..adapters import ADAPTERS

    def types(c) -> str:
        kin = getattr(c, "kin", ())  # what an adapter claims by structure beyond the types it lists
        return ", ".join(c.model_types) + (f"; by structure its kin: {', '.join(kin)}" if kin else "")

    return ", ".join(f"{n} ({types(c)})" for n, c in ADAPTERS.items())


def check_gguf(path: Path) -> None:
    if not path.is_file():
        raise ModelLoadError(f"no such GGUF file: {path}")


@contextlib.contextmanager
def hub_access(hub_id: str | None) -> Iterator[None]:
    """For a Hub id, one quick request first (once per process): when the Hub does not answer, this block
    reads the local cache only (said once, at once, instead of a minute of retries per file). No-op for
    local paths."""
    with cache_only(hub_id is not None):
        yield


@contextlib.contextmanager
def cache_only(hub: bool = True) -> Iterator[None]:
    """A block that may ask the Hub (``hub``): when ``hub_unusable`` says it cannot be asked, huggingface_hub,
    transformers and ``datasets`` read their local caches only inside it (each reads its own offline flag),
    so what is not cached fails at once instead of after each library's retries. Restored after."""
    import sys

    from huggingface_hub import constants

    if not hub or hub_unusable() is None:
        yield
        return
    flags = [(constants, "HF_HUB_OFFLINE")]
    if "datasets" in sys.modules:  # imported later, it reads huggingface_hub's flag
        import datasets.config

        flags.append((datasets.config, "HF_HUB_OFFLINE"))
    saved = [getattr(mod, name) for mod, name in flags]
    for mod, name in flags:
        setattr(mod, name, True)
    try:
        yield
    finally:
        for (mod, name), value in zip(flags, saved):
            setattr(mod, name, value)


def _unreachable(endpoint: str) -> str | None:
    from huggingface_hub import get_session

    try:
        get_session().head(endpoint, timeout=PROBE_TIMEOUT_S)
    except Exception as e:  # any transport failure means "not reachable now"; the message says which
        return f"{type(e).__name__}: {e}"
    return None


@contextlib.contextmanager
def readable(target: str | os.PathLike, gguf_file: str | None = None) -> Iterator[None]:
    """Turn transformers' and safetensors' errors for a model that cannot be read into retrofit's."""
    try:
        yield
    except RetrofitError:
        raise
    except Exception as e:
        error = _explain(e, str(target), gguf_file)
        if error is None:
            raise
        raise error from e


def _explain(e: Exception, target: str, gguf_file: str | None):
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if type(e).__name__ == "SafetensorError":
        return ModelLoadError(
            f"the weights in {target} cannot be read ({first}): the file is damaged or "
            "incomplete; download or save the model again"
        )
    if gguf_file and isinstance(e, (RuntimeError, ValueError, KeyError)):
        detail = (
            "its tensors' shapes differ from those its metadata gives (listed above)"
            if "ignore_mismatched_sizes" in str(e)
            else first
        )
        return ModelLoadError(
            f"{Path(target) / gguf_file} cannot be loaded as a causal LM: {detail}; the file is "
            "damaged or written by a converter transformers cannot read"
        )
    hub = _hub_error(e, target)
    if hub is not None:
        return hub
    if isinstance(e, OSError):
        return ModelLoadError(f"cannot load model {target!r}: {first}")
    return None


def _hub_error(e: Exception, target: str):
    from huggingface_hub import errors as hf

    chain = _chain(e)
    if any(isinstance(x, hf.GatedRepoError) for x in chain):
        return HubError(f"{target} is a gated Hub repo: accept its terms on huggingface.co and set HF_TOKEN")
    if any(isinstance(x, hf.RepositoryNotFoundError) for x in chain):
        return ModelLoadError(
            f"{target!r} is neither a local folder nor a model on the Hub; check the name "
            "(a private repo needs HF_TOKEN)"
        )
    if any(isinstance(x, (hf.OfflineModeIsEnabled, hf.LocalEntryNotFoundError)) for x in chain):
        return _uncached(target, "HF_HUB_OFFLINE is set" if _offline_by_env() else "the Hub does not answer")
    if any(isinstance(x, hf.HfHubHTTPError) for x in chain):
        return HubError(f"the Hub refused {target!r}: {str(e).splitlines()[0]}")
    return None


def _offline_by_env() -> bool:
    return any(
        os.environ.get(k, "").upper() in ("1", "ON", "YES", "TRUE") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _chain(e: BaseException) -> list[BaseException]:
    out = []
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out
