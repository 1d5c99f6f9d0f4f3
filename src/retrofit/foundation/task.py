"""What a model is for, as one fact read from its config (``architectures``): the task decides the class a
checkpoint loads as, and whether its attention reads keys after the query. Causal LMs are what the
evaluation and cards serve; the fine-tune trains causal LMs (next token), masked LMs (masked tokens), and with a
recipe's ``task`` classifiers and embedding models; an encoder (masked LM, classifier, embeddings) converts, saves
and loads with its head kept."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Task:
    name: str
    suffixes: tuple[str, ...]  # how its transformers class names end
    auto_class: str  # the transformers Auto class that loads it
    pipeline_tag: str  # the Hub's name for it


TASKS = (
    Task("causal-lm", ("ForCausalLM", "LMHeadModel", "Decoder"), "AutoModelForCausalLM", "text-generation"),
    Task("masked-lm", ("ForMaskedLM",), "AutoModelForMaskedLM", "fill-mask"),
    Task(
        "sequence-classification",
        ("ForSequenceClassification",),
        "AutoModelForSequenceClassification",
        "text-classification",
    ),
    Task(
        "token-classification", ("ForTokenClassification",), "AutoModelForTokenClassification", "token-classification"
    ),
    Task("embeddings", ("Model",), "AutoModel", "feature-extraction"),
)


RECIPE_TASKS = {"classification": "sequence-classification", "embedding": "embeddings"}  # a recipe's task: its class


def retrofit_class_name(name: str) -> str:
    """The class a saved retrofit checkpoint of task ``name`` names in its config.json's ``architectures``
    (``models.hf_classes.for_task`` defines it): RetrofitForCausalLM, RetrofitForSequenceClassification, ..."""
    return "RetrofitForCausalLM" if name == "causal-lm" else "RetrofitFor" + "".join(w.title() for w in name.split("-"))


def with_article(word: str) -> str:
    """``word`` with its indefinite article: "an embedding", "a causal-lm"; the task "embeddings" is said "an
    embedding" ("an embedding model")."""
    word = "embedding" if word == "embeddings" else word
    return f"{'an' if str(word)[:1].lower() in 'aeiou' else 'a'} {word}"


def by_name(name: str) -> Task:
    return next(t for t in TASKS if t.name == name)


def of_class(name: str | None) -> Task:
    """The task of a transformers class name (``BertForMaskedLM`` -> masked-lm); causal-lm when unknown."""
    for task in TASKS:
        if name and name.endswith(task.suffixes):
            return task
    return TASKS[0]


def of_model(model) -> Task:
    """The task of a model in memory (its class)."""
    return of_class(type(model).__name__)


def require_language_model(model, what: str) -> None:
    """``what`` (the fine-tune, the evaluation) serves a causal LM (next token) or a masked LM (masked tokens); a
    classifier or an embedding model is refused with what does work for it."""
    from .errors import UnsupportedArchitectureError

    task = of_model(model)
    if task.name not in ("causal-lm", "masked-lm"):
        raise UnsupportedArchitectureError(
            f"{what} serves causal and masked language models as such; {type(model).__name__} is {with_article(task.name)} model: "
            "set 'task: classification' or 'task: embedding' in the recipe (docs/encoders.md)"
        )


def model_class(config):
    """The class a checkpoint's config names when it names a head (a masked LM, a classifier: loaded with that
    head) or is a bare encoder (``is_encoder``: BERT's ``BertModel``), else the causal-LM Auto class as before (a
    bare decoder, a custom class, no ``architectures``)."""
    import transformers

    name = (getattr(config, "architectures", None) or [None])[0]
    task = of_class(name)
    cls = getattr(transformers, name, None) if name else None
    if task.name == "embeddings" and isinstance(cls, type) and is_encoder(config):
        return cls  # a bare encoder (an embedding model): itself, not a decoder built over its weights
    if task.name in ("causal-lm", "embeddings") or not isinstance(cls, type):
        return transformers.AutoModelForCausalLM
    return cls


def is_encoder(config) -> bool:
    """Whether a config is a bidirectional encoder's: a family with a masked-LM class, used neither as a decoder
    nor as an encoder-decoder (BERT, RoBERTa, ...: their bare ``...Model`` is an embedding model)."""
    return (
        getattr(config, "model_type", None) in masked_lm_types()
        and not getattr(config, "is_decoder", False)
        and not getattr(config, "is_encoder_decoder", False)
    )


@functools.cache
def masked_lm_types() -> frozenset[str]:
    """The model types transformers has a masked-LM class for (``MODEL_FOR_MASKED_LM_MAPPING_NAMES``), read from
    its source file without importing it: importing ``modeling_auto`` imports torch (seconds), and this is asked
    by checks that answer within a second (``finetune --check``). Where the file no longer holds the table as a
    literal, the import reads it."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("transformers")  # found, not imported
    source = Path(spec.origin).parent / "models" / "auto" / "modeling_auto.py" if spec and spec.origin else None
    try:
        for node in ast.parse(source.read_text()).body if source else ():
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "MODEL_FOR_MASKED_LM_MAPPING_NAMES" for t in node.targets
            ):
                return frozenset(k for k, _ in ast.literal_eval(node.value.args[0]))
    except (OSError, SyntaxError, ValueError, AttributeError, IndexError, TypeError):
        pass  # not the literal it was: the import below says the same
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    return frozenset(MODEL_FOR_MASKED_LM_MAPPING_NAMES)
