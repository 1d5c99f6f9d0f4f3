"""Memory on paper: the peak memory per device of a fine-tune, from the model's shape and the recipe.

``retrofit finetune RECIPE --plan`` prints it for DDP, FSDP (full shard) and FSDP + CPU offload;
``docs/finetune.md``'s table for 1B / 7B / 70B LLaMA-style models comes from the same function
(``research/memory_table.py``), and ``research/check_plan.py`` holds it against measured peaks.

Per device, for P parameters of which T train, N processes, B x S tokens per micro-batch, L layers:

- weights: frozen parameters at the load dtype's width, trainable ones in fp32 (4 bytes);
  FSDP keeps 1/N of them plus two gathered decoder blocks (the one computing, the one prefetched);
  with offload only the two gathered blocks are on the device.
- gradients: 4 T (fp32); DDP adds its bucket copy (another 4 T); FSDP 4 T / N plus one block's.
- optimizer: AdamW's two fp32 moments, 8 T (/ N under FSDP; on the host with offload).
- activations: what backward keeps per layer per token, (11 d + 4 d_kv + m) elements at the compute
  width a (norm inputs and outputs, q/k/v before and after rotation, attention output; m, the MLP's
  f-wide tensors: 5 f for a gated MLP such as LLaMA's, 3 f for GELU, 2 f for ReLU, 6 f for GPT-2's
  `gelu_new`, whose tanh formula runs as separate ops), times L; with gradient checkpointing one d-wide input per
  layer plus one layer's full set. Attention runs in fused or chunked kernels, so there is no S x S
  term, except where attention dropout is on while training (GPT-2's attn_pdrop = 0.1): the kernels
  then keep the probabilities, the dropped copy and the mask, 3 a H S bytes per token per layer.
  (Counted with saved-tensor hooks on 13M-parameter models, B x S = 2 x 512: LLaMA 210 MiB against 211
  predicted; GPT-2 with `gelu` 216 against 216, `relu` 184 against 184, `gelu_new` 312 against 312, and
  with attention dropout 488 against 504.)
- logits: B S V at the compute width, an fp32 copy for the loss and its gradient (a + 8 bytes each).

Not counted: the framework (CUDA context, allocator slack; CPU processes: the Python runtime, about
0.5 GiB RSS each here), a distillation teacher, retrofit's position parameters (under 0.01% of a model).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass

from .recipe import budget  # the one budget arithmetic, shared with the loop

GiB = 2**30
WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2, None: 4, "auto": 2}
ROUTES = ("ddp", "fsdp", "fsdp+offload")
MLP_SAVED = {"relu": 2.0, "gelu_new": 6.0}  # other activations of an ungated MLP: 3 f (measured, docstring)
ALL_ROUTES = ("single", *ROUTES)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shape:
    """What the formula needs of a model (``from_model`` counts it on a meta-device instance)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    params: int  # every parameter, tied ones once
    block_params: int  # the largest decoder block
    gated: bool  # SwiGLU-style MLP (gate and up projections)
    mlp_saved: float  # f-wide tensors the MLP keeps for backward, per token (see the module docstring)
    attention_dropout: float  # > 0: training keeps S x S probabilities
    lora_per_rank: int  # LoRA parameters per unit of rank over the default targets: sum(in + out)
    norm_params: int
    embedding_params: int
    native: int | None = None  # the positions the config declares (the distillation teacher's window)
    trained: int | None = None  # counted on the run's own model (``shape_of_recipe``); None: from the formula

    @property
    def kv_width(self) -> int:
        return self.hidden // self.heads * self.kv_heads


@dataclass(frozen=True)
class Run:
    """What the formula needs of a recipe."""

    method: str = "lora"  # lora | full
    lora_r: int = 16
    train_norms: bool = True
    train_embeddings: bool = False
    batch_size: int = 1
    block_length: int = 4096
    weight_dtype: str | None = "bfloat16"
    mixed_precision: str = "bf16"
    gradient_checkpointing: bool = True

    @classmethod
    def of(cls, r) -> "Run":
        t = r.train
        return cls(
            t.method,
            t.lora.r,
            t.train_norms,
            t.train_embeddings,
            t.batch_size,
            r.data.block_length,
            r.model.dtype,
            t.mixed_precision,
            t.gradient_checkpointing,
        )


def trainable(shape: Shape, run: Run) -> int:
    """The parameters a run trains: counted on the run's model where the shape has it (``Shape.trained``), else
    from the shape and the method (a model without its conversion and head: ``docs/finetune.md``'s table)."""
    if shape.trained is not None:
        return shape.trained
    if run.method == "full":
        return shape.params
    extra = (shape.norm_params if run.train_norms else 0) + (shape.embedding_params if run.train_embeddings else 0)
    return run.lora_r * shape.lora_per_rank + extra


def estimate(shape: Shape, run: Run, route: str, processes: int) -> dict:
    """Bytes per device by component (and on the host, for offload), for one route."""
    if route not in ALL_ROUTES:
        raise ValueError(f"route {route!r}: one of {', '.join(ALL_ROUTES)}")
    n = processes if route.startswith("fsdp") else 1
    T = trainable(shape, run)
    w = WIDTH.get(run.weight_dtype, 4)
    a = 2 if run.mixed_precision in ("bf16", "fp16") or w == 2 else 4  # compute width
    extra_copies = (
        0
        if run.method == "full"
        # PEFT modules_to_save keeps the original beside the copy
        else ((shape.norm_params if run.train_norms else 0) + (shape.embedding_params if run.train_embeddings else 0))
    )
    frozen = shape.params - (T if run.method == "full" else 0) + extra_copies
    weights_all = frozen * w + T * 4
    block_frac = shape.block_params / shape.params
    gathered = 2 * shape.block_params * max(a, w if run.method != "full" else a)
    tokens = run.batch_size * run.block_length
    mlp = shape.mlp_saved * shape.intermediate
    per_token_layer = (11 * shape.hidden + 4 * shape.kv_width + mlp) * a
    if shape.attention_dropout > 0:
        per_token_layer += 3 * a * shape.heads * run.block_length
    if run.gradient_checkpointing:
        act = tokens * (shape.layers * shape.hidden * a + per_token_layer)
    else:
        act = tokens * shape.layers * per_token_layer
    logits = tokens * shape.vocab * (a + 8)
    host = 0
    if route in ("single", "ddp"):  # DDP keeps a bucket copy of the gradients
        weights, grads, optim = weights_all, (8 if route == "ddp" else 4) * T, 8 * T
    elif route == "fsdp":
        weights = weights_all / n + gathered
        grads = 4 * T / n + 4 * T * block_frac
        optim = 8 * T / n
    else:  # offload: shards, gradients and the optimizer step live in host memory
        weights, grads, optim = gathered, 4 * T * block_frac, 0
        host = weights_all / n + 4 * T / n + 8 * T / n
    parts = {"weights": weights, "gradients": grads, "optimizer": optim, "activations": act, "logits": logits}
    return {
        "route": route,
        "processes": processes,
        "trainable": T,
        **{k: int(v) for k, v in parts.items()},
        "device_total": int(sum(parts.values())),
        "host_per_process": int(host),
    }


def from_model(model, lora_targets: list[str] | None = None) -> Shape:
    """The Shape of a (meta-device or real) transformers model: parameters counted, not assumed."""
    from torch import nn

    from ..adapters.base import claimant
    from .model import _is_norm

    cfg = model.config
    get = lambda *keys, default=None: next((getattr(cfg, k) for k in keys if getattr(cfg, k, None)), default)  # noqa: E731
    hidden = get("hidden_size", "n_embd", "d_model")
    heads = get("num_attention_heads", "n_head", "num_heads")
    blocks = _decoder_blocks(model)
    params = {id(p): p for p in model.parameters()}
    if lora_targets is None:
        adapter = claimant(model)
        lora_targets = list(adapter.targets()) if adapter else None
    lora = 0
    for name, m in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        weight = getattr(m, "weight", None)
        if (
            weight is not None
            and weight.dim() == 2
            and not isinstance(m, nn.Embedding)
            and ((lora_targets is None and isinstance(m, nn.Linear)) or (lora_targets and leaf in lora_targets))
        ):
            lora += sum(weight.shape)
    emb = model.get_input_embeddings().weight.numel()
    names = {n for n, _ in model.named_modules()}
    gated = any(n.endswith(("gate_proj", "w1", "gate_up_proj")) for n in names)
    return Shape(
        name=getattr(cfg, "_name_or_path", "") or cfg.model_type,
        layers=len(blocks),
        hidden=hidden,
        intermediate=get("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden),
        heads=heads,
        kv_heads=get("num_key_value_heads", default=heads),
        vocab=cfg.vocab_size,
        params=sum(p.numel() for p in params.values()),
        block_params=max(sum(p.numel() for p in b.parameters()) for b in blocks),
        gated=gated,
        mlp_saved=5.0
        if gated
        else MLP_SAVED.get(str(get("activation_function", "hidden_act", "hidden_activation", default="gelu")), 3.0),
        attention_dropout=float(get("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob", default=0.0)),
        lora_per_rank=lora,
        norm_params=sum(p.numel() for m in model.modules() if _is_norm(m) for p in m.parameters(recurse=False)),
        embedding_params=emb,
        native=get("max_position_embeddings", "n_positions", "n_ctx"),
    )


def _decoder_blocks(model):
    """The repeated decoder blocks: the longest ModuleList of the model."""
    from torch import nn

    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=len)) if lists else [model]


def shape_of_recipe(r) -> Shape:
    """Shape of the recipe's model from its config alone (a meta-device instance; no weights read), with the
    parameters the run trains counted on it as the run makes them (``_trained``)."""
    import json
    from pathlib import Path

    import torch
    from transformers import AutoConfig

    from ..models.builtin import resolve, standin_preset
    from ..models.io import base_config
    from ..models.sources import readable
    from ..models.standin import build_model, built, get_config
    from .tasks import label_names

    name = r.model.name_or_path
    preset = standin_preset(name)
    if preset is not None and not built(preset):  # its shape, without pretraining it
        cfg = get_config(preset)
        with torch.device("meta"):
            model = build_model(cfg, cfg.vocab_size, eos_token_id=0)
        return dataclasses.replace(
            _shape_of(model, r.task, r.train.lora), trained=_trained(model, r.convert, r.train, {})
        )
    target, gguf = resolve(name, r.model.gguf_file)
    with readable(target, gguf):
        config = Path(target, "config.json")
        block = (json.loads(config.read_text()).get("retrofit") or {}) if config.is_file() and not gguf else {}
        cfg = base_config(Path(target)) if block else AutoConfig.from_pretrained(target, gguf_file=gguf)
    with torch.device("meta"):
        model = _model_of(cfg, r.task, len(label_names(r)) if r.task == "classification" else 0, gguf)
    return dataclasses.replace(
        _shape_of(model, r.task, r.train.lora), trained=_trained(model, r.convert, r.train, block)
    )


def _model_of(cfg, task: str | None, classes: int, gguf):
    """The class the run loads the recipe's model as (``models.io.load_model``): its ``task``'s, a classifier's with
    the ``classes`` it trains; else the class its config names (a GGUF checkpoint: a causal LM)."""
    import transformers

    from ..foundation.task import RECIPE_TASKS, by_name, model_class

    if task is None:
        cls = transformers.AutoModelForCausalLM if gguf else model_class(cfg)
    else:
        cls = getattr(transformers, by_name(RECIPE_TASKS[task]).auto_class)
    if task == "classification":
        cfg.num_labels = classes
    return cls.from_config(cfg) if hasattr(cls, "from_config") else cls._from_config(cfg)


def _trained(model, convert_cfg, train_cfg, block: dict) -> int | None:
    """The parameters the run trains (the count ``outputs.write_run_info`` writes): the meta-device ``model``
    converted as the recipe says (or as the checkpoint's ``retrofit`` ``block`` was), then LoRA or full as
    ``model.make_trainable`` makes it. Counts only: nothing runs a forward. None (the formula counts, and says so)
    when the conversion reads a weight the meta device does not hold (e.g. a rotary model's inv_freq)."""
    from ..patch import conversion
    from .model import make_trainable

    scheme, options = convert_cfg.scheme, dict(convert_cfg.options)
    if scheme is None and block.get("scheme"):
        scheme, options = block["scheme"], dict(block.get("options") or {})
    said = conversion.log  # its "converted ..." line is the run's to say
    level, _ = said.level, said.setLevel(logging.WARNING)
    try:
        if scheme is not None:
            conversion.convert_shape(model, scheme, **options)
    except NotImplementedError as e:  # "Cannot copy out of meta tensor"
        log.info("--plan: trainable parameters by the formula (%s does not convert on the meta device: %s)", scheme, e)
        return None
    finally:
        said.setLevel(level)
    model = make_trainable(model, train_cfg)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _shape_of(model, task: str | None, lora) -> Shape:
    """The model's shape as the run trains it (``task``: the recipe's; ``lora``: train.lora, whose target modules
    are counted)."""
    targets = lora.target_modules
    shape = from_model(
        model,
        [targets]
        if isinstance(targets, str) and targets != "all-linear"
        else (None if targets == "all-linear" else targets),
    )
    # a task's model has no token logits: a classifier's are one row a sequence, an embedding model has none
    return dataclasses.replace(shape, vocab=0) if task else shape


def table(shape: Shape, run: Run, processes: int) -> str:
    """The rows --plan prints: one per route, GiB per device by component."""
    head = (
        f"{shape.name}: {shape.params / 1e9:.3g}B parameters, {trainable(shape, run):,} trainable "
        f"({run.method}), {run.batch_size} x {run.block_length} tokens per device, {processes} processes, "
        f"gradient checkpointing {'on' if run.gradient_checkpointing else 'off'}"
    )
    cols = ("weights", "gradients", "optimizer", "activations", "logits", "device_total", "host_per_process")
    rows = [estimate(shape, run, route, processes) for route in ROUTES]
    unit, size = ("GiB", GiB) if max(e["device_total"] for e in rows) >= GiB else ("MiB", 2**20)
    lines = [head, "", "| route | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for e in rows:
        lines.append(f"| {e['route']} | " + " | ".join(f"{e[c] / size:.2f}" for c in cols) + " |")
    lines.append("")
    lines.append(
        f"{unit} per device (host_per_process: CPU memory per process with offload). Not counted: the "
        "framework's own memory (CUDA context, allocator slack), a distillation teacher."
    )
    return "\n".join(lines)


# Time on paper: the device the run would use, at a utilisation a Hugging Face fine-tune reaches (not a
# measurement of the fine-tune; pass --tokens-per-s with a rate you measured, e.g. log.jsonl's tokens_per_s
# of a short run, to replace it). GPUs: dense bf16 peaks by name; a CPU: its fp32 matmul rate, measured.
GPU_PEAKS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
    "V100": 125e12,
    "T4": 65e12,
}
GPU_UTILISATION = 0.30
CPU_UTILISATION = 0.50  # of the measured fp32 matmul rate


def device_rate() -> tuple[str, float]:
    """(what the time assumes, FLOP/s): the first CUDA GPU the run would use, else this CPU at the thread
    count the run would use, its fp32 matmul rate measured now (a few matmuls, under a second)."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        peak = next((v for k, v in GPU_PEAKS.items() if k in name), None)
        if peak is None:
            return (
                f"{name} (its peak is not in retrofit's table: an A100's 312 bf16 TFLOP/s assumed) at "
                f"{GPU_UTILISATION:.0%} utilisation",
                GPU_PEAKS["A100"] * GPU_UTILISATION,
            )
        return f"{name} ({peak / 1e12:.0f} bf16 TFLOP/s at {GPU_UTILISATION:.0%} utilisation)", peak * GPU_UTILISATION
    from ..foundation.versions import cpu_info

    rate = _cpu_matmul_rate()
    return (
        f"this CPU ({cpu_info()['processor']}, {torch.get_num_threads()} threads; fp32 matmul measured at "
        f"{rate / 1e9:.0f} GFLOP/s, {CPU_UTILISATION:.0%} of it assumed)",
        rate * CPU_UTILISATION,
    )


def _cpu_matmul_rate(n: int = 1024, repeats: int = 4) -> float:
    import time

    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm up
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return repeats * 2 * n**3 / (time.perf_counter() - t0)


def default_processes() -> tuple[int, str]:
    """The processes ``retrofit finetune`` would run in: WORLD_SIZE under a launcher, else one."""
    world = int(os.environ.get("WORLD_SIZE", "0"))
    if world:
        return world, f"{world} processes (WORLD_SIZE)"
    return 1, "1 process (retrofit finetune alone starts one; plan several with --processes N or under a launcher)"


def flops_per_token(shape: Shape, run: Run, teacher_forwards: float = 0.0) -> float:
    """Training FLOPs per token on paper: a forward is 2 P + 2 L S d (matmuls; causal attention scores and
    values); backward is 2 forwards for full fine-tuning, 1 for LoRA (input gradients only through frozen
    weights); gradient checkpointing recomputes one forward; a distillation teacher adds its forwards."""
    forward = 2 * shape.params + 2 * shape.layers * run.block_length * shape.hidden
    backward = (2.0 if run.method == "full" else 1.0) * forward
    recompute = forward if run.gradient_checkpointing else 0.0
    return forward + backward + recompute + teacher_forwards * forward


def time_lines(r, shape: Shape, tokens: int, processes: int, tokens_per_s: float | None) -> list[str]:
    from .teacher import TeacherView

    teacher = 0.0  # teacher tokens read per student token (a sliding window re-reads context)
    if r.train.objective != "lm":
        L = r.data.block_length
        teacher = sum(end - start for start, end, _ in TeacherView.of(r.train, L, shape.native, r.task).spans(L)) / L
    if tokens_per_s:
        rate, where = tokens_per_s, "at the rate given (--tokens-per-s)"
    else:
        fpt = flops_per_token(shape, Run.of(r), teacher)
        device, flops = device_rate()
        rate, where = (
            flops / fpt,
            (
                f"on paper on {device}: {fpt / 1e9:.3g} GFLOP per token"
                + (f", with the teacher reading {teacher:.2g} token{'s' * (teacher != 1)} per token" if teacher else "")
            ),
        )
    seconds = tokens / (rate * processes if not tokens_per_s else rate)
    return [
        f"time: {tokens:,} tokens at {rate:,.0f} tokens/s{' per device' if not tokens_per_s else ''} "
        f"= {_duration(seconds)} ({where})"
    ]


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under 1 s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def plan_budget(r, processes: int) -> str:
    """The budget lines alone (no model config needed)."""
    return "budget: " + budget(r, processes)[2]


def plan_model(r, processes: int, tokens_per_s: float | None = None) -> list[str]:
    """The time and memory lines (the model's config is read)."""
    from .model import mixed_precision

    shape = shape_of_recipe(r)
    precision, why = mixed_precision(r.train)
    return [
        f"precision: {'fp32' if precision == 'no' else precision}" + (f" ({why})" if why else ""),
        *time_lines(r, shape, budget(r, processes)[1], processes, tokens_per_s),
        "",
        table(shape, Run.of(r), processes),
    ]
