"""What every measure of an evaluation is: its options checked, its plan (the forward passes it will make, what
the report's settings and seeds say of it), its run, its report keys (their JSON schema) and its section of
report.md. ``CATALOG`` lists every measure; ``runner.evaluate`` runs those of the model's task (``by_task``) and
drives them the same way. A new measure is its module (a ``Measure`` subclass and its instance) and one line of
``CATALOG``; its options, if it has new ones, are fields of ``options.EvalOptions`` (the one place every option
and flag is declared).

    asked = measure.asked(options)          # before anything is read: bad input raises a RetrofitError
    measure.check(setup, asked)             # the model loaded, the lengths resolved, before any tokens are read
    planned = measure.plan(setup, asked)    # its text drawn: work, settings, seeds
    section = measure.run(setup, planned, bar)  # its keys of the report
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ..foundation.errors import OptionError
from .lengths import parse_item, past_limit
from .models import EvalModel
from .options import EvalOptions


@dataclass
class Setup:
    """What every measure's plan and run read: the options, the models (the evaluated first), the evaluation's
    documents, its lengths resolved against the model, and the tokens every model scores (a language model's) or
    the documents' source (a classifier's or an embedding model's)."""

    o: EvalOptions
    models: list[EvalModel]
    docs: list  # the Documents read from --data
    label: str  # what they are, for messages
    lengths: list[int]
    stream: object = None  # scoring.tokens.build_stream's: the first budget tokens, a multiple of the longest length
    source: object = None  # a classifier's or embedding model's: a longdoc: spec or records.Records

    @property
    def native(self) -> int | None:
        return (self.models[0].info.get("native") or {}).get("length")


@dataclass
class Planned:
    """A measure ready to run. ``state`` None: it does not run (not asked, or not for this model)."""

    work: list[tuple[int, int]] = field(default_factory=list)  # (window length, forward passes): cost line, bar
    settings: dict = field(default_factory=dict)  # its keys of the report's ``settings``
    seeds: dict = field(default_factory=dict)  # its keys of the report's ``seeds``
    state: object = None  # what its run reads


# Every measure, in the report's order: "id": "module:ATTR", ATTR the module's ``Measure`` instance (a module under
# retrofit.evaluation, or a dotted one); each says which tasks it measures (``Measure.tasks``).
CATALOG: dict[str, str] = {
    "perplexity": "perplexity:MEASURE",
    "passkey": "passkey:MEASURE",
    "recall": "recall:MEASURE",
    "copy": "retrieval:MEASURE",
    "masked-lm": "masked:MEASURE",
    "masked-copy": "retrieval:MASKED",
    "long-document": "longdoc:MEASURE",
}


def measures() -> list["Measure"]:
    """Every measure of ``CATALOG``, in its order (their modules imported on first use)."""
    out = []
    for where in CATALOG.values():
        module, attr = where.split(":")
        out.append(getattr(importlib.import_module(module if "." in module else f"{__package__}.{module}"), attr))
    return out


def by_task() -> dict[str, tuple["Measure", ...]]:
    """{task: its measures in the report's order}, the tasks in the order the catalog first names them."""
    out: dict[str, tuple] = {}
    for m in measures():
        for t in m.tasks:
            out[t] = (*out.get(t, ()), m)
    return out


class Measure(ABC):
    """One measure. ``name``: its key in the report (its section, its settings, its seed); ``tasks``: the models it
    measures (``foundation.task`` names); ``keys``: what it writes of the report (default: its name), ``schema``
    their JSON schema where ``schema.json`` does not hold it; ``report``: a report class of its own (a task
    whose first measure has one writes it instead of ``report.Report``)."""

    name: str = ""
    unit: str = "window"  # what its work counts (the progress bar's unit)
    tasks: tuple[str, ...] = ("causal-lm",)
    schema: dict = {}  # {report key: its JSON schema}, added to schema.json's properties
    report: type | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        """Its keys of the report, in order."""
        return (self.name,)

    @abstractmethod
    def asked(self, o: EvalOptions):
        """What was asked of it, checked before anything is read; None when it is not asked."""

    def check(self, setup: Setup, asked) -> None:
        """What can be said against the loaded model before any text is tokenized (``setup.stream`` is not built
        yet): its lengths past the model's limit, or too short for its prompt. Nothing by default."""

    @abstractmethod
    def plan(self, setup: Setup, asked) -> Planned:
        """Its text drawn, its cost counted (``setup.stream`` built)."""

    @abstractmethod
    def run(self, setup: Setup, planned: Planned, bar) -> dict:
        """Its keys of the report (``bar``: the progress bar over every measure's forward passes)."""

    def absent(self) -> dict:
        """Its keys of the report when it does not run."""
        return {self.name: None}

    def markdown(self, report, plots: dict) -> list[str]:
        """Its lines of report.md (``report.Report``'s; ``plots``: the plots written). None by default."""
        return []


def check_lengths(lengths, what: str = "lengths") -> list:
    """Validated length items (token counts or ``"4x"`` multiples), before anything is loaded."""
    if isinstance(lengths, (int, str)):
        lengths = [lengths]
    if not lengths:
        raise OptionError(f"{what}: give at least one length")
    return [parse_item(x, what) for x in lengths]


def check_positive(**values) -> None:
    """Each value a positive integer (a bool is not one), else an OptionError naming it."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise OptionError(f"{name} must be a positive integer, got {v!r}")


def check_depths(depths, what: str) -> list[float]:
    """Depths as floats in [0, 1], else an OptionError."""
    for d in depths:
        if not isinstance(d, (int, float)) or not 0.0 <= float(d) <= 1.0:
            raise OptionError(f"{what} depths must lie in [0, 1], got {d!r}")
    return [float(d) for d in depths]


def mechanism(m: EvalModel) -> str:
    """What sets a model's limit, for messages."""
    return m.info.get("scheme") or (m.info.get("native") or {}).get("kind") or "its positional mechanism"


def check_supported(m: EvalModel, lengths: list[int], what: str) -> None:
    """The converted model must run every length plainly: a clear LengthError otherwise."""
    past_limit(m.name, mechanism(m), m.max_length, lengths, what)
