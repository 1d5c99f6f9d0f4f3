"""``train.positions``: the positions a training block receives, from its recipe section to each step's placement.

``PositionsConfig`` is the section (its keys, their help and the checks that need only it and the block length);
``Placer`` is what a fine-tune builds from it: it checks the model against it, says whether it is active (the one
place "positions are on" is written) and hands ``patch/`` each step's ``Placement``. The methods:

- **random_offset**: every position of a block shifted by k drawn in [0, random_offset];
- **native_fade_steps**: the native mechanism mixed back in, fading out over the first steps;

- **PoSE** (Zhu et al., 2023, arXiv 2309.10400): the block is split into ``chunks`` contiguous
  pieces; piece c is shifted by a skip u_c, the skips drawn uniformly from [0, target - L] and
  sorted, so positions stay strictly increasing and the block spans up to the target length while
  each piece keeps its local order.
- **randomized** (Ruoss et al., 2023, "Randomized Positional Encodings"): a sorted uniform random
  subset of L distinct positions of [0, target).
- **endprompt** (EndPrompt, arXiv 2605.14589: short sequences whose final segment sits near the target): the
  block's first ``L - s`` tokens keep positions 0 .. L - s - 1, its last ``s = L // 4`` tokens end within ``s``
  positions of the target, so every step holds distances close to the target length itself.

Offsets and methods are drawn from a seeded ``random.Random`` per step: the same recipe gives the same positions,
on every process and after a resume.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..foundation.errors import LengthError, RecipeError
from ..foundation.schema import field_help as _help
from ..foundation.seeds import derive

if TYPE_CHECKING:
    import torch

    from ..patch.attention import Placement

log = logging.getLogger(__name__)

METHODS = ("none", "pose", "randomized", "endprompt")


@dataclass
class PositionsConfig:
    random_offset: int = _help(
        "Random start offsets: each step draws k in [0, random_offset] and trains on positions k..k+L "
        "(randomized positional encodings; no effect on distance-only schemes: alibi, rope, t5, shaw, nope). 0 = off.",
        0,
        minimum=0,
    )
    native_fade_steps: int = _help(
        "Fade the native positional mechanism out over the first N steps (mix 1 - step/N of it back in) "
        "instead of dropping it at once. 0 = off.",
        0,
        minimum=0,
    )
    method: str = _help(
        "Teach positions beyond the block: 'pose' (PoSE: the block's chunks shifted by sorted random skips), "
        "'randomized' (a sorted random subset of [0, target_length)) or 'endprompt' (the block's last quarter "
        "placed to end near target_length, the rest at 0..: EndPrompt); all span target_length. 'none' = off.",
        "none",
    )
    target_length: int = _help("The length 'method' prepares for (positions are drawn from [0, target_length)).", 0)
    pose_chunks: int = _help("PoSE: chunks per block, each with its own skip (the paper uses 2).", 2, minimum=1)

    @property
    def active(self) -> bool:
        """Whether the section asks for anything (the one place "positions are on" is written)."""
        return bool(self.random_offset or self.native_fade_steps or self.method != "none")

    def check(self, block_length: int) -> None:
        """What the section rules out by itself and with the block length (a RecipeError naming the key)."""
        if self.method not in METHODS:
            raise RecipeError(f"'train.positions.method' must be one of {', '.join(METHODS)}; got {self.method!r}")
        if self.method == "none":
            if self.target_length:
                raise RecipeError(
                    "'train.positions.target_length' is read by 'train.positions.method' (pose, randomized or "
                    "endprompt), which is 'none'"
                )
            return
        if self.target_length <= block_length:
            raise RecipeError(
                f"'train.positions.method: {self.method}' needs 'train.positions.target_length' greater than "
                f"'data.block_length' ({block_length}); got {self.target_length}"
            )
        if self.random_offset or self.native_fade_steps:
            raise RecipeError(
                f"'train.positions.method: {self.method}' cannot be combined with random_offset or native_fade_steps"
            )


def pose(length: int, target: int, chunks: int, rng: random.Random) -> torch.Tensor:
    """(length,) strictly increasing positions in [0, target): ``chunks`` pieces, each shifted by a sorted skip."""
    import torch  # here, not at the top: the recipe's checks read METHODS without torch

    chunks = max(1, min(chunks, length))
    bounds = [round(c * length / chunks) for c in range(chunks + 1)]
    skips = sorted(rng.randint(0, target - length) for _ in range(chunks))
    pieces = [torch.arange(bounds[c], bounds[c + 1]) + skips[c] for c in range(chunks)]
    return torch.cat(pieces)


def randomized(length: int, target: int, rng: random.Random) -> torch.Tensor:
    """(length,) a sorted uniform random subset of [0, target)."""
    import torch

    return torch.tensor(sorted(rng.sample(range(target), length)), dtype=torch.long)


def endprompt(length: int, target: int, rng: random.Random) -> torch.Tensor:
    """(length,) strictly increasing positions: the body at 0 .. length - s - 1, the last s = length // 4 tokens as
    one piece ending at target - 1 - j, j drawn uniformly from [0, s]."""
    import torch

    s = max(1, length // 4)
    end = target - 1 - rng.randint(0, min(s, target - length))  # the final segment's last position
    body = torch.arange(length - s)  # (L - s,)
    return torch.cat([body, torch.arange(end - s + 1, end + 1)])  # (L,)


def draw(method: str, length: int, target: int, chunks: int, seed: int, step: int) -> torch.Tensor | None:
    """This step's positions (None for method "none"); the same (seed, step) always gives the same ones."""
    if method == "none":
        return None
    rng = random.Random(derive(seed, step * 7 + 1))
    if method == "pose":
        return pose(length, target, chunks, rng)
    if method == "randomized":
        return randomized(length, target, rng)
    if method == "endprompt":
        return endprompt(length, target, rng)
    raise ValueError(f"positions method must be one of {METHODS}; got {method!r}")


@dataclass
class Placer:
    """``train.positions`` at work in one fine-tune: built from the section, the block length and the run's seed.
    ``check(model, scheme)`` (once, after converting) says what the model rules out; ``apply(base, step)`` places
    each step's blocks on the converted base model (``step=None``: as the model reads them, for validation)."""

    config: PositionsConfig
    block_length: int
    seed: int
    fade_offset_cap: int | None = None  # set by check(): the largest offset while the native mechanism fades in

    @classmethod
    def of(cls, train, block_length: int) -> "Placer":
        """The placer of a recipe's ``train`` section (its ``positions`` and ``seed``) for blocks of ``block_length``."""
        return cls(train.positions, block_length, train.seed)

    @property
    def active(self) -> bool:
        return self.config.active

    @property
    def reach(self) -> int:
        """The length a block's positions span: the method's target, else the block itself."""
        return self.config.target_length or self.block_length

    def check(self, model, scheme: str | None) -> None:
        """The block plus the largest offset must fit what the model accepts. While the native mechanism fades in,
        the native table bounds positions: the largest offset allowed then is kept (offsets are clamped to it
        during the fade). ``scheme``: the recipe's ``convert.scheme``."""
        from ..patch.conversion import describe, max_length
        from ..scheme import SCHEMES

        pos, L = self.config, self.block_length
        info = describe(model)
        limit = info.get("max_length")
        if pos.method != "none":
            if limit is not None and pos.target_length > limit:
                raise LengthError(
                    f"'train.positions.target_length' = {pos.target_length} exceeds the {limit} positions the "
                    "model accepts"
                )
            if SCHEMES.get(info["scheme"]).kind == "none":
                log.warning(
                    "train.positions.method = %s has no effect on %r: it reads no positions", pos.method, info["scheme"]
                )
            log.info("positions: %s, blocks of %d spread over [0, %d)", pos.method, L, pos.target_length)
        if limit is not None and L + pos.random_offset > limit:
            # the scheme says how far it reads (Scheme.max_length(): a stretched table its rows, relative schemes
            # no limit); an unconverted model reads its native length
            reach = (
                f"the reach of scheme {info['scheme']!r}"
                if info["converted"]
                else "its native length; 'convert.scheme' reads further"
            )
            raise LengthError(
                f"'data.block_length' = {L} + 'train.positions.random_offset' = {pos.random_offset} exceeds the "
                f"{limit} positions the model accepts ({reach})"
            )
        if not pos.native_fade_steps:
            self._warn_if_offset_is_a_no_op(scheme)
            self.fade_offset_cap = None
            return
        fade_limit = max_length(model, fading=True)
        if fade_limit is not None and L > fade_limit:
            raise LengthError(
                f"'data.block_length' = {L} exceeds the {fade_limit} native positions; "
                "'train.positions.native_fade_steps' needs blocks the native mechanism can read"
            )
        self.fade_offset_cap = None if fade_limit is None else fade_limit - L

    def _warn_if_offset_is_a_no_op(self, scheme: str | None) -> None:
        """A uniform shift of every position cannot change a scheme whose scores depend only on i - j
        (measured: docs/finetune.md, "Position augmentation")."""
        from ..scheme.registry import SCHEMES

        shift_invariant = scheme in SCHEMES and getattr(SCHEMES.get(scheme), "shift_invariant", False)
        if self.config.random_offset and shift_invariant:
            log.warning(
                "train.positions.random_offset = %d has no effect on %r: its attention depends only on "
                "distances, and the offset shifts every position of a block alike (it matters only while "
                "native_fade_steps fades an absolute table out)",
                self.config.random_offset,
                scheme,
            )

    def at(self, step: int) -> Placement:
        """This step's placement (the same on every process and on resume)."""
        from ..patch.attention import Placement

        pos = self.config
        if pos.method != "none":
            return Placement(
                positions=draw(pos.method, self.block_length, pos.target_length, pos.pose_chunks, self.seed, step)
            )
        offset = random.Random(derive(self.seed, step)).randint(0, pos.random_offset) if pos.random_offset else 0
        fade = max(0.0, 1.0 - step / pos.native_fade_steps) if pos.native_fade_steps else 0.0
        if fade > 0 and self.fade_offset_cap is not None:
            offset = min(offset, self.fade_offset_cap)
        return Placement(offset=offset, native_fade=fade)

    def apply(self, base, step: int | None) -> torch.Tensor | None:
        """Place step ``step``'s blocks on ``base`` (None: reset, as the model reads them); returns the drawn
        positions of a method (else None). Nothing is set when the section is off."""
        from ..patch.attention import Placement
        from ..patch.conversion import place

        if not self.active:
            return None
        placement = Placement() if step is None else self.at(step)
        place(base, placement)
        return placement.positions
