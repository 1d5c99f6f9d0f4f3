"""Model side of a fine-tune: load, keep a teacher, convert, choose what trains (LoRA or full)."""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn

from ..adapters.base import claimant
from ..foundation.errors import RecipeError
from ..foundation.task import RECIPE_TASKS, of_model, with_article
from ..patch.conversion import POSITIONS_MODULE

log = logging.getLogger(__name__)


def load(model_cfg, task: tuple = (None, None)):
    """(model, tokenizer) through retrofit.load_model (built-in names resolved; a GGUF checkpoint
    comes back dequantized: trainable, mergeable, savable). A ``standin:<preset>`` stand-in not built yet
    is pretrained first: the recipe asks for it (the log says so before it starts). ``task``: (the recipe's
    ``task``, its class names): a classifier or an embedding model of the checkpoint (``RECIPE_TASKS``)."""
    from ..foundation.task import require_language_model
    from ..models.io import load_model
    from .standin import ensure

    ensure(model_cfg.name_or_path)
    want, labels = RECIPE_TASKS.get(task[0]), task[1]
    model, tok = load_model(
        model_cfg.name_or_path,
        gguf_file=model_cfg.gguf_file,
        dtype=model_cfg.dtype,
        task=want,
        num_labels=None if labels is None else len(labels),
    )
    if labels is not None:  # the classes by name: the saved config, its card and pipelines say them
        if model_cfg.new_head:
            new_head(model)
        model.config.id2label = dict(enumerate(labels))
        model.config.label2id = {n: i for i, n in enumerate(labels)}
    if want is None:
        require_language_model(model, "retrofit finetune")
    elif of_model(model).name != want:
        raise RecipeError(
            f"'task: {task[0]}' needs {with_article(want)} model; {model_cfg.name_or_path!r} is a converted "
            f"{type(model).__name__}, which keeps its class: start from the original checkpoint with "
            "'convert.scheme' in the recipe (it loads as the task's class, then converts)"
        )
    if tok is None:
        raise RecipeError(f"'model.name_or_path' = {model_cfg.name_or_path!r} has no tokenizer; fine-tuning needs one")
    return model, tok


def new_head(model) -> None:
    """``model.new_head: true``: the classification head drawn afresh as transformers draws a new one (its linear
    weights normal(0, initializer_range), zero biases); the encoder (BERT's pooler with it) is kept."""
    base = getattr(model, model.base_model_prefix, None)
    std = getattr(model.config, "initializer_range", 0.02)
    with torch.no_grad():
        for child in model.children():
            for m in child.modules() if child is not base else ():
                if isinstance(m, nn.Linear):
                    m.weight.normal_(0.0, std)
                    if m.bias is not None:
                        m.bias.zero_()
    log.info(
        "model.new_head: a new classification head (%s), the checkpoint's trained one dropped", type(model).__name__
    )


def make_teacher(model, model_cfg, task: tuple = (None, None)) -> nn.Module:
    """A frozen copy of the unconverted model (for the distill objective). A model that was loaded
    converted (a retrofit checkpoint) is loaded again (as ``task``'s class, as ``load`` takes it) and reverted:
    its original mechanism is kept."""
    from ..patch import conversion
    from ..patch.conversion import is_converted, revert

    if is_converted(model):
        said = conversion.log  # its "converted ..." lines were said for the student already
        level = said.level
        said.setLevel(logging.WARNING)
        try:
            teacher = revert(load(model_cfg, task)[0])
        finally:
            said.setLevel(level)
        log.info("distillation teacher: %s with its original positions (reverted)", model_cfg.name_or_path)
    else:
        teacher = copy.deepcopy(model)
    teacher.eval().requires_grad_(False)
    return teacher


def convert(model, convert_cfg):
    """Convert as the recipe says; a model loaded already converted (a retrofit checkpoint) goes on
    with its own scheme when the recipe names the same one (or none), and is an error otherwise."""
    from ..patch.conversion import convert as convert_model
    from ..patch.conversion import describe

    current = describe(model)
    if current["converted"]:
        return _go_on(model, convert_cfg, current)
    if convert_cfg.scheme is not None:
        convert_model(model, convert_cfg.scheme, **convert_cfg.options)
    return model


def set_attention_dropout(model, train_cfg) -> float | None:
    """The fine-tune's attention dropout (``train.attention_dropout``) on a converted model; None (the model's
    own dropout stays) for an unconverted one or ``attention_dropout: null``. Returns what is set."""
    state = getattr(model, "_retrofit_state", None)
    if train_cfg.attention_dropout is None or state is None:
        return None
    state.attention_dropout = float(train_cfg.attention_dropout)
    return state.attention_dropout


def _go_on(model, convert_cfg, current: dict):
    from ..patch.conversion import set_kernel
    from ..scheme.options import common_defaults

    scheme, options = current["scheme"], dict(convert_cfg.options)
    if convert_cfg.scheme not in (None, scheme):
        raise RecipeError(
            f"'model.name_or_path' is a checkpoint already converted to {scheme!r} but 'convert.scheme' is "
            f"{convert_cfg.scheme!r}: set 'convert.scheme: {scheme}' to fine-tune it further, or start from the "
            f"original model ({current['base_model'] or 'its base model'})"
        )
    kernel = options.pop("kernel", None)
    have = {**common_defaults(), **current["options"]}  # common options are saved only when set
    have["temperature_length"] = current["options"].get("temperature_length", options.get("temperature_length"))
    clash = {k: (v, have.get(k)) for k, v in options.items() if have.get(k, v) != v}
    unknown = sorted(set(options) - set(have))
    if clash or unknown:
        detail = ", ".join(
            [f"{k}: recipe {a!r} vs checkpoint {b!r}" for k, (a, b) in clash.items()]
            + [f"{k}: not an option of this checkpoint's {scheme}" for k in unknown]
        )
        raise RecipeError(
            f"'convert.options' differ from the converted checkpoint's ({detail}); "
            "drop them (the checkpoint's own apply) or start from the original model"
        )
    if kernel:
        set_kernel(model, kernel)
    log.info("going on from a checkpoint already converted to %s %s", scheme, current["options"])
    return model


def positions_parameters(model) -> int:
    mod = getattr(model, POSITIONS_MODULE, None)
    return sum(p.numel() for p in mod.parameters()) if mod is not None else 0


def lora_targets(model, lora_cfg) -> list[str] | str:
    targets = lora_cfg.target_modules
    if targets is None:  # the adapter's; a family retrofit has no adapter for (an unconverted control): all linear
        adapter = claimant(model)
        targets = list(adapter.targets()) if adapter else "all-linear"
    if isinstance(targets, str) and targets != "all-linear":
        targets = [targets]
    if isinstance(targets, list):
        names = [n for n, m in model.named_modules() if not list(m.children())]
        unmatched = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
        if unmatched:
            raise RecipeError(
                f"'train.lora.target_modules': {', '.join(map(repr, unmatched))} match no module of "
                f"{model.config.model_type}; leaf modules end with e.g. "
                f"{', '.join(sorted({n.rsplit('.', 1)[-1] for n in names})[:12])}"
            )
    return targets


def extra_trainable(model, train_cfg) -> list[str]:
    """Module names trained in full next to LoRA: the new position parameters, norms, embeddings."""
    names = []
    if positions_parameters(model):
        names.append(POSITIONS_MODULE)
    if of_model(model).name == "sequence-classification":  # BERT's pooler: new under a masked LM's encoder
        names += [
            n for n, m in model.named_modules() if n.endswith("pooler") and next(m.parameters(), None) is not None
        ]
    if train_cfg.train_norms:
        names += [n for n, m in model.named_modules() if _is_norm(m)]
    if train_cfg.train_embeddings:
        emb = model.get_input_embeddings()
        names += [n for n, m in model.named_modules() if m is emb]
        if _tied(model):  # naming the output side too makes PEFT train one shared copy (ensure_weight_tying)
            out = model.get_output_embeddings()
            names += [n for n, m in model.named_modules() if m is out]
    return names


def _tied(model) -> bool:
    out = model.get_output_embeddings()
    return (
        bool(getattr(model.config, "tie_word_embeddings", False))
        and out is not None
        and (out.weight is model.get_input_embeddings().weight)
    )


def _is_norm(m: nn.Module) -> bool:
    name = type(m).__name__
    return (
        isinstance(m, (nn.LayerNorm, nn.GroupNorm)) or name.endswith("Norm") or "RMSNorm" in name or "LayerNorm" in name
    )


PEFT_TASKS = {"causal-lm": "CAUSAL_LM", "sequence-classification": "SEQ_CLS"}


def make_trainable(model, train_cfg):
    """Wrap with PEFT LoRA (method: lora) or unfreeze everything but what the core froze (full)."""
    if train_cfg.method == "full":
        from ..patch.conversion import frozen_parameters

        keep_frozen = {id(p) for p in frozen_parameters(model)}  # the swapped-out native mechanism
        for p in model.parameters():
            p.requires_grad_(id(p) not in keep_frozen)
        return model
    from peft import LoraConfig, get_peft_model

    cfg = train_cfg.lora
    extra = extra_trainable(model, train_cfg)
    lcfg = LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=lora_targets(model, cfg),
        modules_to_save=extra or None,
        fan_in_fan_out=bool(getattr(claimant(model), "fan_in_fan_out", False)),
        ensure_weight_tying=bool(train_cfg.train_embeddings and _tied(model)),
        # PEFT's wrapper of the task (a classifier's keeps its head trained in full); else the plain PeftModel
        task_type=PEFT_TASKS.get(of_model(model).name),
    )
    peft_model = get_peft_model(model, lcfg)
    return peft_model


def base_model(model):
    """The transformers model under PEFT (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def trainable_hash(model) -> str:
    """A digest of the trainable weights this process holds: under FSDP2 (DTensors), its own shards."""
    import hashlib

    h = hashlib.sha256()
    for n, p in sorted(model.named_parameters()):
        if p.requires_grad:
            t = p.detach()
            t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's shard
            h.update(n.encode())
            # a copy: numpy() on the parameter itself would pin its storage, which FSDP2 frees and re-allocates
            h.update(t.to(torch.float32, copy=True).cpu().numpy().tobytes())
    return h.hexdigest()


def enable_checkpointing(model) -> None:
    """Activation (gradient) checkpointing, non-reentrant, through transformers' current name for it
    (``activation_checkpointing_enable``; ``gradient_checkpointing_enable`` before 5.x renamed it and now warns)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def mixed_precision(t) -> tuple[str, str | None]:
    """(the precision this run trains in, why it differs from the recipe's or None): the recipe's, except
    bf16/fp16 on a machine without a GPU whose CPU has no native bf16 (no AVX-512 BF16 or AMX), where autocast is
    emulated (far slower; measured: docs/finetune.md, "Details worth knowing"): fp32 then, unless
    ``train.cpu_mixed_precision: keep`` insists (``t``: the recipe's ``train`` section)."""
    import os

    from ..foundation.versions import bf16_native, cpu_info

    # the recipe's, else an accelerate launch config's (Accelerate reads it from the environment)
    asked = t.mixed_precision
    if asked == "no":
        asked = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if asked == "no" or torch.cuda.is_available() or t.cpu_mixed_precision == "keep":
        return asked, None
    if bf16_native(cpu_info()["flags"]) is not False:
        return asked, None
    return "no", (
        f"train.mixed_precision is {asked}, but this machine has no GPU and its CPU no native bf16 (no AVX-512 "
        f"BF16 or AMX): {asked} would be emulated, about 15x slower. Training in fp32 instead "
        f"(train.cpu_mixed_precision: keep runs {asked} anyway)."
    )
