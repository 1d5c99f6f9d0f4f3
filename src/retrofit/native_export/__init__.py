"""Native-architecture export: write a converted model as an architecture transformers already has.

    retrofit.export(model_or_run_dir, "out/", native=True) -> ExportResult

The exported folder loads with plain ``transformers.AutoModelForCausalLM.from_pretrained(out)``,
without retrofit and without remote code (no ``retrofit`` block, no ``auto_map`` in its config).
One short function per (adapter, scheme) pair maps the weights (nanoGPT-style surgery: every
tensor's name and shape is checked before it is copied), one module per target kind. The mappings are the lines of
``CATALOG`` below (the one place: ``MAPPINGS`` is filled from it, docs/export.md's table is rendered from it,
``base.table``); a new mapping is its function and one line.

After writing, the folder is loaded back with plain transformers and its logits are compared with
the patched model's on random token ids past the native length; the result (and versions) go to
``retrofit_export.json`` beside the weights. A pair that no native architecture can express (T5
buckets, FIRE, ...) is a ``RetrofitError`` that points to ``retrofit.load``; ALiBi added after the
score scaling (``scale_bias=False``) is refused too unless ``approximate=True`` (Falcon, inexact,
reported with the perplexity difference). See docs/export.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..foundation import run_folder
from ..foundation.errors import OptionError, RetrofitError
from ..foundation.schema import from_keywords
from ..foundation.versions import library_versions
from .base import (
    MAPPINGS,
    TOLERANCE,
    Built,
    ExportOptions,
    ExportResult,
    Line,
    mapping,
    per_head_qkv,
    register,
    supported_pairs,
)
from .gpt2 import FALCON_BF16_EXACT
from .rope import _check_rope_config, rope_parameters

log = logging.getLogger(__name__)

CATALOG = (  # one line per mapping: the function that builds, the families and schemes it takes, the target
    Line(
        "gpt2.gpt2_alibi_to_falcon",
        ("gpt2",),
        ("alibi",),
        "FalconForCausalLM",
        "`FalconForCausalLM` (`alibi=True`, `parallel_attn=False`, `bias=True`, `multi_query=False`, "
        "`new_decoder_architecture=False`, `activation=gelu_new`) for `scale_bias=true`; the default "
        "`scale_bias=false` is refused, `--approximate` writes Falcon anyway",
        f"`scale_bias=true`: yes up to {FALCON_BF16_EXACT - 1} tokens (Falcon's bfloat16 bias), beyond it close "
        "(see below); `--approximate`: no (see below)",
    ),
    Line(
        "gpt2.gpt2_rope_to_neox",
        ("gpt2",),
        ("rope",),
        "GPTNeoXForCausalLM",
        "`GPTNeoXForCausalLM` (`use_parallel_residual=False`, rotary fraction, `hidden_act=gelu_new`, tied embeddings), "
        "any scaling",
        "yes",
    ),
    Line(
        "baked_table.baked_table",
        None,
        ("nope", "sinusoidal", "extend"),
        "same architecture (baked position table)",
        "the same class with a longer table (`--max-length` rows): all zeros (`nope`), the scaled sinusoids "
        "(`sinusoidal`), the stretched table (`extend`); an encoder's classifier keeps its head, an embedding model "
        "its sentence-transformers modules, reloaded by its own Auto class for the check",
        "yes",
    ),
    Line(
        "rope.same_architecture",
        ("llama", "gpt_neox", "falcon"),
        ("rope",),
        "same architecture (rope_parameters)",
        "the same architecture with `rope_parameters` (and `max_position_embeddings`) set, any scaling (linear, "
        "yarn, dynamic, ntk, new theta; the LLaMA family's MLA split-off rotary part included); an ALiBi Falcon "
        "given RoPE: `alibi: false`",
        "yes",
    ),
    Line(
        "alibi.same_architecture",
        ("bloom", "mpt", "falcon"),
        ("alibi",),
        "same architecture (its own ALiBi)",
        "the same architecture with its own ALiBi, kept through a fine-tune (MPT: `max_seq_len` raised to "
        "`--max-length`, since its bias covers that many keys; a rotary Falcon: `alibi: true`, for "
        "`scale_bias=true`, the bias before the scaling as Falcon adds it)",
        f"yes (Falcon: up to {FALCON_BF16_EXACT - 1} tokens, its bfloat16 bias, as above)",
    ),
)
register(CATALOG)


__all__ = [
    "export",
    "ExportResult",
    "ExportOptions",
    "Built",
    "CATALOG",
    "MAPPINGS",
    "mapping",
    "supported_pairs",
    "rope_parameters",
    "per_head_qkv",
    "max_logit_diff",
    "TOLERANCE",
    "FALCON_BF16_EXACT",
]


def _resolve_source(model_or_dir):
    """A converted model, a retrofit checkpoint folder, or a pipeline run folder holding ``final/``."""
    if isinstance(model_or_dir, nn.Module):
        return model_or_dir, None, None
    path = run_folder.model_dir(model_or_dir)
    if not (path / "config.json").exists():
        raise RetrofitError(f"{model_or_dir} is neither a retrofit checkpoint nor a run folder with final/ in it")
    from ..models.io import load

    model = load(path)
    tokenizer = None
    if any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer, path


def _info(model) -> dict:
    from ..patch.conversion import describe, position_controls

    info = describe(model)
    if not info["converted"]:
        raise RetrofitError(
            "export: the model is not converted (nothing retrofit-specific to export; save it with save_pretrained)"
        )
    offset, fade = position_controls(model)
    if fade > 0 or offset:
        raise RetrofitError(
            "export: reset fine-tune position controls first "
            "(retrofit.set_position_controls(model, offset=0, native_fade=0))"
        )
    return info


def _check_ids(vocab: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, length), generator=g)


def max_logit_diff(a, b, ids: torch.Tensor) -> float:
    """Max abs difference of the two models' logits on ``ids`` (one full forward each, no cache)."""
    with torch.no_grad():  # a bare encoder (an embedding model) has no logits: its hidden states
        la, lb = (_output(m(input_ids=ids.to(m.device), use_cache=False)).float() for m in (a, b))
    return float((la - lb.to(la.device)).abs().max())


def _output(out) -> torch.Tensor:
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _reload_class(model):
    """The class an export is reloaded with: a causal LM's Auto class, else its own task's (a classifier's, a bare
    encoder's, a masked LM's), as a user loads it."""
    import transformers

    from ..foundation.task import of_model

    task = of_model(model)
    return getattr(transformers, task.auto_class)


def export(
    model_or_run_dir, path: str | os.PathLike, native: bool = True, *, tokenizer=None, **options
) -> ExportResult:
    """Write ``model_or_run_dir`` (a converted model, a retrofit checkpoint folder, or a run folder with
    ``final/``) to ``path``. ``native=True``: a native transformers architecture (see the module doc);
    ``native=False``: the retrofit format (``retrofit.save``; reload with ``retrofit.load``). ``tokenizer``: written
    beside the weights (default: the folder's own).

    ``options``, keywords (their defaults and help: ``ExportOptions``; any other keyword is a TypeError naming them):
    ``max_length``: the longest sequence the native model should accept where its architecture has a
    limit (GPT-2 for NoPE: the size of the zero position table; default max(8192, 4 x native)).
    ``check_length``: tokens of the random-id equivalence check (default min(4 x native, native + 1024)).
    ``approximate=True``: also write the closest architecture where none is exact (gpt2 + alibi with
    scale_bias=False -> Falcon); an inexact export reports ``exact: False``, the reason, and, when a tokenizer
    is known, the perplexity of both models on ``ppl_text`` (a ``retrofit.data.specs`` spec, default
    "stdlib") at ``check_length``. An export that should be exact but differs by more than ``tolerance``
    (default ``TOLERANCE``) raises and writes nothing."""
    from ..models.io import save
    from ..patch.conversion import UNBOUNDED, reach

    o = from_keywords(ExportOptions, options, "export")
    model, tok, source = _resolve_source(model_or_run_dir)
    tokenizer = tokenizer if tokenizer is not None else tok
    info = _info(model)
    if not native:
        out = save(model, path, tokenizer=tokenizer)
        return ExportResult(
            out=str(out),
            native=False,
            mapping=None,
            target="retrofit",
            exact=True,
            max_abs_logit_diff=0.0,
            check_length=None,
            notes=["load with retrofit.load(path)"],
        )
    pair = (info["architecture"], info["scheme"])
    _refuse_inexpressible(pair, info["options"])
    fn = MAPPINGS.get(f"{pair[0]}+{pair[1]}").build
    native_len = int(info["native"]["length"])
    limit = reach(model) if reach(model) < UNBOUNDED else None  # a finite scheme (extend: its table's rows)
    max_length = o.max_length
    if max_length is not None and limit is not None and max_length > limit:
        raise OptionError(f"max_length {max_length} is past what the converted model reads ({limit} positions)")
    opts = {
        "max_length": _positive("max_length", max_length, limit or max(8192, 4 * native_len)),
        "approximate": o.approximate,
        "reach": max_length or reach(model),
    }  # what an unbounded export advertises (ALiBi: no limit)
    check_len = _positive("check_length", o.check_length, min(4 * native_len, native_len + 1024))
    was_training = model.training
    model.eval()
    try:
        built = fn(model, info, opts)
        check_len = min(check_len, built.limit or check_len)  # a baked table is the exported model's limit
        check = {"length": check_len, "tolerance": o.tolerance, "ppl_text": o.ppl_text}
        return _write(Job(model, tokenizer, info, source), built, path, check)
    finally:
        model.train(was_training)


def _refuse_inexpressible(pair: tuple[str, str], options: dict) -> None:
    """RetrofitError when no native architecture expresses the conversion (no mapping for the pair, a length-aware
    temperature, a rope extension)."""
    if f"{pair[0]}+{pair[1]}" not in MAPPINGS:
        raise RetrofitError(
            f"no native architecture expresses {pair[0]} + {pair[1]}; supported: {'; '.join(supported_pairs())}. "
            "Export without --native (retrofit format) and load it with retrofit.load(path)"
        )
    if options.get("temperature"):
        raise RetrofitError(
            f"no native architecture expresses the length-aware temperature (temperature="
            f"{options['temperature']}): {'; '.join(supported_pairs())} have no per-position logit scale "
            "(Llama 4's attn_temperature_tuning uses another, floored formula). Export without --native "
            "(retrofit format) and load it with retrofit.load(path)"
        )
    if options.get("extension", "none") != "none":
        raise RetrofitError(
            f"no native architecture expresses rope extension {options['extension']!r} (a second rotary "
            "view for the far keys, merged per query-key pair): transformers' rope_parameters rotate each "
            "position one way. Export without --native (retrofit format) and load it with retrofit.load(path)"
        )


def _positive(name: str, value, default: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise OptionError(f"{name} must be an int >= 2; got {value!r}")
    return value


@dataclass(frozen=True)
class Job:
    """What ``export`` writes natively: the converted ``model``, its ``tokenizer``, what ``describe`` says of it
    (``info``: its architecture and scheme name the mapping) and the folder it came from (``source``, or None)."""

    model: Any
    tokenizer: Any
    info: dict
    source: Any = None


def _write(job: Job, built: Built, path, check: dict) -> ExportResult:
    model, tokenizer, info, source = job.model, job.tokenizer, job.info, job.source
    pair = (info["architecture"], info["scheme"])

    from ..foundation.atomic import write_dir
    from ..models.io import tokenizer_reach

    check_len, tolerance = check["length"], check["tolerance"]
    result = ExportResult(
        native=True,
        mapping=f"{pair[0]}+{pair[1]}",
        target=type(built.model).__name__,
        model_type=built.model.config.model_type,
        check_length=check_len,
        dtype=str(model.dtype).replace("torch.", ""),
        source=str(source) if source else None,
    )

    def write(tmp: Path):
        # raw write: inside write_dir's temporary folder
        built.model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
            reach = built.reach or getattr(built.model.config, "max_position_embeddings", None)
            if reach:
                tokenizer_reach(tmp / "tokenizer_config.json", reach)
        for f in run_folder.st_files(source) if source else []:  # an embedding model's sentence-transformers modules
            (tmp / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(source) / f, tmp / f)
        _check_config(tmp / "config.json")
        reloaded = _reload_class(model).from_pretrained(tmp, dtype=model.dtype).eval()
        if getattr(built.model.config, "rope_parameters", None):
            _check_rope_config(reloaded.config, built.model.config.rope_parameters)
        diff = max_logit_diff(model, reloaded, _check_ids(model.get_input_embeddings().weight.shape[0], check_len))
        limit = built.exact_below
        fp32 = model.dtype == torch.float32
        exact = built.exact and (diff <= tolerance or not fp32)
        if built.exact and built.strict and (limit is None or check_len < limit) and diff > tolerance and fp32:
            raise RetrofitError(
                f"export: {result['target']} should equal the patched model but differs by {diff:.3g} "
                f"(tolerance {tolerance:g}) at {check_len} tokens; nothing was written"
            )
        notes = list(built.notes)
        if not fp32:
            notes.append(f"measured in {result['dtype']}: the {tolerance:g} tolerance applies to float32 only")
        if limit is not None and check_len >= limit:
            exact = False
            notes.append(f"checked at {check_len} tokens, past the exact range (< {limit})")
        result.update(exact=exact, exact_below=limit, max_abs_logit_diff=diff, notes=notes)
        if not exact:
            result.update(_ppl_difference(model, reloaded, tokenizer, check["ppl_text"], check_len))
        record = {
            **result,
            "retrofit": {k: info[k] for k in ("scheme", "options", "architecture", "native")},
            "versions": library_versions(),
        }
        # raw write: inside write_dir's temporary folder
        (tmp / run_folder.EXPORT_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")

    out = write_dir(path, write)
    result["out"] = str(out)
    if source:  # where it went, in the run folder's manifest: push and the card find it wherever it is
        run_folder.record_export(source, out)
    log.info(
        "exported %s to %s (%s, max |dlogit| %.3g)",
        result["mapping"],
        out,
        result["target"],
        result["max_abs_logit_diff"],
    )
    return result


def _ppl_difference(patched, exported, tokenizer, spec: str, length: int, windows: int = 2) -> dict:
    """Perplexity of both models on the same ``windows`` non-overlapping windows of ``length`` tokens of
    real text (``scoring.losses``, the protocol of ``retrofit eval``)."""
    if tokenizer is None:
        return {"ppl": None, "ppl_note": "no tokenizer: the perplexity difference was not measured"}
    from ..data.specs import load_documents
    from ..scoring.losses import nonoverlapping_nll
    from ..scoring.tokens import first_tokens

    tokens, _ = first_tokens(tokenizer, load_documents(spec), windows * length + 1)  # not the whole corpus
    n = min(windows, (len(tokens) - 1) // length)
    if n == 0:
        return {"ppl": None, "ppl_note": f"{spec!r} has fewer than {length + 1} tokens: perplexity not measured"}
    ids = torch.tensor(tokens[: n * length + 1])
    a, b = (float(nonoverlapping_nll(m, ids, length).mean()) for m in (patched, exported))
    return {
        "ppl": {
            "text": spec,
            "tokens": n * length,
            "length": length,
            "patched": math.exp(a),
            "exported": math.exp(b),
            "relative_diff": math.exp(b - a) - 1,
        }
    }


def _check_config(path: Path) -> None:
    cfg = json.loads(path.read_text())
    bad = [k for k in ("retrofit", "auto_map") if k in cfg]
    if bad or cfg.get("_attn_implementation") == "retrofit":
        raise RetrofitError(f"export: the written config still has {bad or '_attn_implementation=retrofit'}")
