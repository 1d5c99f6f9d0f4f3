"""The attention kernels as one ordered table (``KERNELS``): each row names what runs, says whether it serves a
call (or why not) and runs it. ``patch/attention.py`` builds one ``Call`` per attention call and hands it to
``attend`` with the model's kernel choice (``RetrofitState.kernel``, saved with the checkpoint):

- ``auto``: the first row that serves the call (and that auto finds worth it: flex only for long calls);
- a row's name: that row, or an error saying why it cannot serve the call. A call with no positional term
  (RoPE, absolute, no positions) takes the first row that serves it whatever the choice: the choice is about
  how the positional term runs.

A call with a positional term runs with denormals flushed on CPU (``denormal.py``). The kernel that ran is
recorded per call (``describe(model)["last_kernel"]``). A new kernel is one module here (``serves(call)``,
``run(call)``, optionally ``worth(call)``) and one row: the row imports it.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..foundation.errors import OptionError
from ..foundation.task import with_article
from . import denormal
from .call import Call, Far, Relative, Unavailable  # noqa: F401  (the record patch/attention.py builds)

SHARED = ("call", "cpu_flash", "denormal")  # what the kernels' modules share: no row's
POSITION_FREE = ("none", "rotary", "absolute")  # scheme kinds with no positional term in the scores
BIAS = ("bias",)
RELATIVE = ("relative",)


def _always(call: Call) -> bool:
    return True


@dataclass(frozen=True)
class Kernel:
    """One row of the table: the kernel's module (its name, ``-`` as ``_``) gives ``serves(call)``, ``run(call)``
    and, where auto should pass some calls on, ``worth(call)``; the row says the rest."""

    name: str
    kinds: tuple[str, ...]  # the scheme kinds a model may name it for
    doc: str
    grouped: bool = False  # takes grouped-query keys (Hkv < H) as they are
    scores: bool = False  # applies the model's own score terms (softcap, sinks): the others never serve such a call
    bidirectional: bool = False  # serves keys after the query (an encoder's attention): the others never do
    two_view: bool = False  # serves a second view for the far keys (SelfExtend, STRING): the others never do
    plain: bool = False  # adds no positional term to the scores: serves only a call without one
    cuda: bool = False  # runs on CUDA only
    serves: Callable[[Call], str | None] = field(init=False, repr=False)  # None: it serves the call; else why not
    run: Callable[[Call], torch.Tensor] = field(init=False, repr=False)  # the call's output (B, H, Tq, D)
    worth: Callable[[Call], bool] = field(init=False, repr=False)  # auto takes it only where this holds too

    def __post_init__(self):
        module = importlib.import_module(f"{__name__}.{self.name.replace('-', '_')}")  # registration: this row
        object.__setattr__(self, "serves", module.serves)
        object.__setattr__(self, "run", module.run)
        object.__setattr__(self, "worth", getattr(module, "worth", _always))

    def why_not(self, call: Call) -> str | None:
        """None when this row serves ``call``; else why not. What the row says of itself (its kinds, its device,
        the terms it applies) is read here, so a row that cannot serve a call is passed over without asking
        its module."""
        if call.scored and not self.scores:
            return f"the model's {call.scored}, which this kernel does not apply"
        if not call.causal and not self.bidirectional:
            return "bidirectional attention (keys after the query), which this kernel does not serve"
        if call.far is not None and not self.two_view:
            return "a second rotary view for the far keys (SelfExtend, STRING), which this kernel does not serve"
        if call.positional and self.plain:
            return "a positional term in the scores, which this kernel does not add"
        if self.cuda and not call.q.is_cuda:
            return "a call off CUDA, where this kernel does not run"
        return self.serves(call)


KERNELS = (
    Kernel(
        "sdpa",
        POSITION_FREE,
        "stock SDPA: no positional term in the scores",
        grouped=True,
        bidirectional=True,
        plain=True,
    ),
    Kernel(
        "flash-attn-alibi",
        BIAS,
        "ALiBi through FlashAttention 2's alibi_slopes (CUDA, fp16/bf16, no padding)",
        cuda=True,
    ),
    Kernel(
        "sdpa-alibi-dims",
        BIAS,
        "ALiBi as extra q/k dimensions through the stock fused SDPA kernel, forward and backward (auto: not for "
        "a decoding step)",
    ),
    Kernel(
        "cpu-flash-band",
        BIAS,
        "T5/Shaw: the band's bias by distance as a strided mask of the CPU flash op (CPU, no dropout)",
    ),
    Kernel(
        "cpu-flash-mask",
        BIAS,
        "any bias as the CPU flash op's float mask, block by block (CPU, no dropout)",
    ),
    Kernel(
        "flex",
        BIAS,
        "compiled flex_attention, the bias as a score_mod (CUDA; CPU inference)",
    ),
    Kernel(
        "sdpa-relative-dims",
        RELATIVE,
        "Transformer-XL: the projected sinusoid's term as extra q/k dimensions through the stock fused SDPA kernel "
        "(auto: not for a decoding step)",
    ),
    Kernel(
        "cpu-flash-relative-band",
        RELATIVE,
        "NEZHA: a relative table flat past a reach as cpu-flash-band's far square plus a band whose "
        "query-dependent term is the CPU flash op's mask (CPU, no dropout)",
    ),
    Kernel(
        "cpu-flash-two-view",
        ("rotary",),
        "SelfExtend/STRING: each key once through the view its distance picks, CPU flash op pieces merged by "
        "log-sum-exp (CPU, inference, no padding)",
        grouped=True,
        two_view=True,
    ),
    Kernel(
        "chunked",
        POSITION_FREE + BIAS + RELATIVE,
        "query-chunked SDPA with each chunk's own bias or relative logits (scores written out where the model "
        "softcaps its logits, has attention sinks or scores far keys through a second view): serves every call",
        scores=True,
        bidirectional=True,
        two_view=True,
    ),
)
BY_NAME = {p.name: p for p in KERNELS}
CHOICES = ("auto", *BY_NAME)  # what a model's kernel may be


def check(kernel: str, kind: str | None = None) -> str:
    """A kernel choice, validated where it is set (convert, ``set_kernel``, the CLI): its current name, for a
    scheme of ``kind``. OptionError for an unknown name or a kernel that cannot serve such a scheme."""
    if kernel not in CHOICES:
        raise OptionError(f"kernel must be one of {', '.join(CHOICES)}; got {kernel!r}")
    if kernel != "auto" and kind is not None and kind not in BY_NAME[kernel].kinds:
        raise OptionError(
            f"kernel {kernel!r} ({BY_NAME[kernel].doc}) cannot serve {with_article(kind)} scheme; use kernel auto or chunked"
        )
    return kernel


def choose(call: Call, kernel: str = "auto") -> Kernel:
    """The row that runs ``call`` for a model whose kernel choice is ``kernel`` (already ``check``ed)."""
    if kernel == "auto" or not call.positional:
        return next(p for p in KERNELS if p.why_not(call) is None and p.worth(call))
    row = BY_NAME[kernel]
    why = row.why_not(call)
    if why is not None:
        raise RuntimeError(f"the {kernel} kernel cannot serve this call: {why}; use kernel auto or chunked")
    return row


def attend(call: Call, kernel: str = "auto") -> tuple[torch.Tensor, str]:
    """(output (B, H, Tq, D), the kernel that ran): one call per group of rows that share a shift where rows sit
    at different positions (``Call.row_shifts``; the kernel is the last group's)."""
    if call.row_shifts is None:
        return _flushed(call, kernel)
    out, ran = torch.empty_like(call.q), ""
    for moved in call.row_shifts.unique().tolist():
        idx = (call.row_shifts == moved).nonzero()[:, 0]
        out[idx], ran = _flushed(call.rows(idx, call.bias_at(moved)), kernel)
    return out, ran


def _flushed(call: Call, kernel: str) -> tuple[torch.Tensor, str]:
    """A call with a bias or a relative term runs with denormals flushed, forward and backward
    (``denormal.attend``: on CPU, from ``denormal.MIN_SCORES`` scores on; a call below that never enters it)."""
    q, k = call.q, call.k
    if (call.bias is None and call.relative is None) or q.device.type != "cpu":
        return _attend(call, kernel)
    if q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2] < denormal.MIN_SCORES:
        return _attend(call, kernel)

    def run(q, k, v):
        return _attend(dataclasses.replace(call, q=q, k=k, v=v), kernel)

    return denormal.attend(run, call.q, call.k, call.v)


def _attend(call: Call, kernel: str) -> tuple[torch.Tensor, str]:
    """``attend`` without the flush. Auto goes on to the last row (chunked) when the chosen one cannot run in
    this process (``Unavailable``: flex without a compiler, or after it failed)."""
    row = choose(call, kernel)
    if not row.grouped:
        call = call.full_heads()
    try:
        return row.run(call), row.name
    except Unavailable as e:
        if kernel != "auto":
            raise
        return KERNELS[-1].run(call), f"{KERNELS[-1].name} ({e.label})"


def help_text() -> str:
    """The kernel choices for ``--help``, from the table."""
    lines = ["kernels (--kernel): auto takes the first of these that serves each call; a name forces that kernel"]
    lines += [f"  {p.name}: {p.doc}" for p in KERNELS]
    return "\n".join(lines)
