"""RoPE (Su et al.): rotary q/k, rotate-half convention, with PI / NTK / YaRN / dynamic rescaling.

Inverse frequencies come from transformers' own ``ROPE_INIT_FUNCTIONS`` (linear, yarn, dynamic);
static NTK-aware scaling (bloc97) has no transformers function and is the default init with
``theta * factor ** (d / (d - 2))``. On a model that already has RoPE, the defaults are the
model's own theta and rotary fraction, so ``convert(model, "rope", scaling="yarn", factor=4)``
rescales it.

Two training-free ways to read past native without rescaling (``extension``; each scores far keys by a second
view of the same rotation, merged per query-key pair by distance, ``far_reach`` / ``far_positions``):

- ``self_extend`` (SelfExtend, Jin et al., ICML 2024): a key at distance d < w (the neighbour window) keeps its
  exact positions; a farther one is scored with the query at ``floor(i / G) + w - w / G`` and the key at
  ``floor(j / G)``, G the group size, so no relative position past ``(N - w) * G + w`` is ever new to the model.
- ``string`` (STRING, An et al., 2024, arXiv 2410.18745): its position matrix ``P[i, j] = i - j`` for d < S (the
  shift) and ``i - j - S + W`` for d >= S (W the local window): the query of the far view sits at ``i - S + W``,
  its keys where they are. The distances past S reuse the well-trained ones from W on.

A model with rope parameters per layer type (gemma3: local sliding layers at theta 10k, global layers at
1M): the options apply to the global layers; the other layers keep their own rotation exactly (a sliding
layer never sees a distance past its window), as the model's own long-context configs do.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from ..foundation.errors import OptionError
from .kinds import RotaryScheme
from .options import option
from .spec import ModelSpec

log = logging.getLogger(__name__)

SCALINGS = ("none", "linear", "ntk", "yarn", "dynamic")
EXTENSIONS = ("none", "self_extend", "string")
STRING_WINDOW = 128  # STRING's local window W by default (the paper's), at most native / 8
TABLE_POSITIONS = 1 << 16  # consecutive positions below this read cos/sin from a table (32 MiB at rot_dim 128)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope_config(rot_dim: int, rope_type: str, theta: float, factor: float, native: int, opts):
    """A minimal transformers config that ROPE_INIT_FUNCTIONS accept, for ``rot_dim`` rotating dims (written as
    a head of rot_dim dims that all rotate: the same frequencies as transformers' int(head_dim * fraction))."""
    from transformers import PretrainedConfig

    params = {"rope_type": rope_type, "rope_theta": theta, "partial_rotary_factor": 1.0, "factor": factor}
    if rope_type == "yarn":
        params.update(original_max_position_embeddings=native, beta_fast=opts.beta_fast, beta_slow=opts.beta_slow)
        if opts.attention_factor is not None:
            params["attention_factor"] = opts.attention_factor
    cfg = PretrainedConfig()
    cfg.rope_parameters = params
    cfg.head_dim = rot_dim
    cfg.hidden_size = rot_dim
    cfg.num_attention_heads = 1
    cfg.max_position_embeddings = int(native * factor) if rope_type in ("yarn", "linear") else native
    return cfg


def rotating_dims(spec: ModelSpec, fraction: float) -> int:
    """How many of each head's dims rotate: the model's own count where it states one (MLA's qk_rope_head_dim),
    else int(head_dim * fraction) as transformers computes it."""
    native = spec.native_rope or {}
    if native.get("rot_dims") and fraction == native.get("fraction"):
        return int(native["rot_dims"])
    return int(spec.head_dim * fraction)


class RoPE(RotaryScheme):
    fixed_because = "RoPE's rotation frequencies are fixed (no learned part)"
    shift_invariant = True

    @dataclass
    class Options:
        theta: float | None = option(None, "rotary base; default: the model's own, else 10000")
        fraction: float | None = option(
            None, "fraction of each head's dims that rotate; default: the model's own, else 1.0"
        )
        scaling: str = option("none", "context rescaling: none | linear (PI) | ntk | yarn | dynamic", SCALINGS)
        factor: float = option(
            1.0, "new length / native length: the rescaling factor (scaling), or the length extension serves"
        )
        native_length: int | None = option(None, "the length the positions were trained on; default: the model's")
        beta_fast: float = option(32.0, "YaRN: high-frequency boundary (rotations)")
        beta_slow: float = option(1.0, "YaRN: low-frequency boundary (rotations)")
        attention_factor: float | None = option(None, "YaRN: attention temperature; default 0.1*ln(factor)+1")
        extension: str = option(
            "none",
            "training-free reach without rescaling, far keys through a second view: none | self_extend (SelfExtend: "
            "grouped positions past the neighbour window) | string (STRING: distances past the shift reuse those "
            "from the window on); factor sets the length it serves",
            EXTENSIONS,
        )
        group: int | None = option(
            None, "self_extend: group size G; default: the least that serves factor x native, at least 2"
        )
        window: int | None = option(
            None,
            "self_extend: the neighbour window w, exact positions below it (default native / 4); string: the local "
            "window W where the shifted distances start (default 128, at most native / 8)",
        )
        shift: int | None = option(
            None,
            "string: the shift S, distances from S on read d - S + W; default the paper's 0.33 x the length served, "
            "raised to (factor - 1) x native + W (the far view within native where it can) and capped at native - W "
            "(the near view within native; from about 2x on the cap wins and the far view reads up to native + 2W)",
        )

    @classmethod
    def resolve_defaults(cls, spec, opts):
        native = spec.native_rope or {}
        if opts.theta is None:
            opts.theta = float(native.get("theta", 10000.0))
        if opts.fraction is None:
            opts.fraction = float(native.get("fraction", 1.0))
        if opts.native_length is None:
            opts.native_length = spec.native_length
        if not 0 < opts.fraction <= 1:
            raise OptionError(f"option 'fraction' of scheme 'rope' must be in (0, 1]; got {opts.fraction}")
        if native.get("rot_dims") and opts.fraction != native.get("fraction"):
            raise OptionError(
                f"rope: this model rotates its own {native['rot_dims']} dims of each head (MLA's split-off rotary "
                "part); option 'fraction' cannot change them"
            )
        if rotating_dims(spec, opts.fraction) % 2:
            raise OptionError(f"rope: {opts.fraction} x head_dim {spec.head_dim} must give an even number of dims")
        if opts.theta <= 0 or opts.native_length <= 0:
            raise OptionError("rope: theta and native_length must be positive")
        _resolve_extension(opts)
        if opts.scaling == "none" and opts.factor != 1.0 and opts.extension == "none":
            raise OptionError("rope: factor != 1 needs a scaling (linear, ntk, yarn or dynamic) or an extension")
        if opts.scaling != "none" and opts.factor < 1.0:
            raise OptionError(f"rope: factor must be >= 1; got {opts.factor}")
        return opts

    def __init__(self, spec: ModelSpec, options):
        super().__init__(spec, options)
        self.rot_dim = rotating_dims(spec, options.fraction)
        # MLA (deepseek_v3 and kin) puts the rotary part at the end of each head, after the dims without positions
        self.at_end = bool((spec.native_rope or {}).get("at_end", False))
        # GPT-J-style models (cohere, glm, ...) rotate the pairs (2i, 2i + 1), not (i, i + rot_dim / 2): a fact
        # of the model, read by its adapter (``quirks``), never an option
        self.interleaved = bool((spec.native_rope or {}).get("interleaved", False))
        # nanochat's rotate_half is (x2, -x1): its pairs turn by -angle (a fact of the model, as above)
        self.turn = -1.0 if (spec.native_rope or {}).get("reversed") else 1.0
        self.rotation_depends_on_length = options.scaling == "dynamic"
        # SelfExtend's far keys sit at floor(j / G): the cache keeps keys unrotated (both views read them)
        self.keys_reread = options.extension == "self_extend"
        native = spec.native_rope or {}
        same_base = options.theta == native.get("theta") and options.fraction == native.get("fraction")
        if native.get("own_temperature") and not (options.scaling == "none" and same_base):
            raise OptionError(
                f"rope: this model's attention scale holds a temperature of its own native rope scaling "
                f"(mscale_all_dim={native['own_temperature']:g}, DeepSeek's YaRN); rescaling it would apply a "
                "second one: refused rather than converted silently wrong (keep its rotation, or convert to "
                "another scheme)"
            )
        self.zero_from = native.get("zero_from")  # "proportional" rope: frequencies from this index stay 0
        inv_freq, self.attention_scaling = self._init_frequencies(spec, options)
        inv_freq = self._keep_zeros(inv_freq)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.kept, self.layer_kept = self._kept_layer_types(spec)

    @staticmethod
    def _kept_layer_types(spec: ModelSpec):
        """Per-layer-type rope: ({type: a RoPE with that type's own rotation}, {layer: its type}) for the
        layers outside the global type; empty on a model with one rotation."""
        native = spec.native_rope or {}
        main, per = native.get("main_type"), native.get("by_layer_type") or {}
        kept = torch.nn.ModuleDict()
        for t, rope in per.items():
            if t != main:
                own = RoPE.Options(theta=rope["theta"], fraction=rope["fraction"])
                kept[t] = RoPE(dataclasses.replace(spec, native_rope=rope), RoPE.resolve_defaults(spec, own))
        layers = {i: t for i, t in enumerate(native.get("layer_types") or []) if t in kept}
        if kept:
            log.info(
                "rope: the %s layers keep their own rotation; the options apply to the %s layers", sorted(kept), main
            )
        return kept, layers

    def _init_frequencies(self, spec, o) -> tuple[torch.Tensor, float]:
        native = spec.native_rope or {}
        same_base = o.theta == native.get("theta") and o.fraction == native.get("fraction")
        if o.scaling == "none" and same_base and "inv_freq" in native:
            # keep the model's own frequencies exactly (including llama3/longrope-style native scaling)
            return native["inv_freq"].clone(), float(native.get("attention_scaling", 1.0))
        if native.get("rope_type", "default") not in ("default", None) and same_base:
            log.warning("rope: the model's native %r scaling is replaced by %r", native["rope_type"], o.scaling)
        if o.scaling in ("none", "ntk"):
            theta = o.theta * (o.factor ** (self.rot_dim / (self.rot_dim - 2)) if o.scaling == "ntk" else 1.0)
            return 1.0 / theta ** (torch.arange(0, self.rot_dim, 2, dtype=torch.float32) / self.rot_dim), 1.0
        if o.scaling == "dynamic":  # frequencies depend on the current length: see _frequencies
            return self._dynamic(o.native_length)
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        cfg = _rope_config(self.rot_dim, o.scaling, o.theta, o.factor, o.native_length, o)
        inv_freq, scale = ROPE_INIT_FUNCTIONS[o.scaling](cfg, None)
        return inv_freq, float(scale)

    def _dynamic(self, seq_len: int) -> tuple[torch.Tensor, float]:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        o = self.options
        cfg = _rope_config(self.rot_dim, "dynamic", o.theta, o.factor, o.native_length, o)
        # a tensor length, as transformers' dynamic_rope_update passes: the same float32 arithmetic
        inv_freq, scale = ROPE_INIT_FUNCTIONS["dynamic"](cfg, None, seq_len=torch.tensor(seq_len))
        return inv_freq, float(scale)

    def _keep_zeros(self, inv_freq: torch.Tensor) -> torch.Tensor:
        """The dims a "proportional" rope never rotated stay unrotated under any option."""
        if self.zero_from is None or self.zero_from >= inv_freq.numel():
            return inv_freq
        out = inv_freq.clone()
        out[self.zero_from :] = 0.0
        return out

    def frequencies(self, seq_len: int, device) -> torch.Tensor:
        """Inverse frequencies for a sequence of ``seq_len`` keys (only dynamic scaling depends on it)."""
        if self.options.scaling == "dynamic" and seq_len > self.options.native_length:
            return self._keep_zeros(self._dynamic(seq_len)[0]).to(device)
        return self.inv_freq.to(device)

    def _table(self, start: int, T: int, x: torch.Tensor):
        """cos, sin (T, rot_dim) in x's dtype for positions start..start+T-1, sliced from a table of the first
        positions (a power of two, at most TABLE_POSITIONS), built by ``cos_sin`` once per device, dtype and
        frequencies; None where it does not serve (frequencies that depend on the length, positions past it)."""
        end = start + T
        if self.rotation_depends_on_length or start < 0 or end > TABLE_POSITIONS:
            return None
        key = (x.device, x.dtype, self.inv_freq.data_ptr(), self.inv_freq._version, self.attention_scaling)
        table = self.__dict__.get("_cos_sin_table")
        if table is None or table[0] != key or table[1].shape[0] < end:
            n = min(TABLE_POSITIONS, max(1024, 1 << (end - 1).bit_length()))
            cos, sin = self.cos_sin(torch.arange(n, device=x.device), n)
            table = (key, cos.to(x.dtype), sin.to(x.dtype))
            self.__dict__["_cos_sin_table"] = table  # one table, not a buffer: never saved or moved
        return table[1][start:end], table[2][start:end]

    def cos_sin(self, pos: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (T, rot_dim) in fp32 for positions ``pos`` (T,)."""
        freqs = pos.to(torch.float32)[:, None] * self.frequencies(seq_len, pos.device)[None, :]  # (T, rot/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * (self.attention_scaling * self.turn)

    def rotate(self, layer, x, pos, seq_len: int | None = None, start: int | None = None):
        """x (B, H, T, D) rotated at positions pos (T,). ``start``: pos is ``start + arange(T)`` (consecutive
        positions), whose cos/sin are read from a table built once (a decoding step computes none)."""
        kept = self.layer_kept.get(layer)
        if kept is not None:  # a local layer of a per-layer-type model: its own rotation
            return self.kept[kept].rotate(layer, x, pos, seq_len, start)
        table = None if start is None else self._table(start, x.shape[-2], x)
        if table is None:
            cos, sin = self.cos_sin(pos, seq_len or int(pos.max()) + 1)
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        else:
            cos, sin = table
        if self.at_end:  # (..., D - rot) without positions, then (..., rot) that rotate
            xp, xr = x[..., : x.shape[-1] - self.rot_dim], x[..., x.shape[-1] - self.rot_dim :]
        else:
            xr, xp = x[..., : self.rot_dim], x[..., self.rot_dim :]
        if self.interleaved:  # pair i is dims (2i, 2i + 1): to halves, rotate, back
            xr = torch.cat((xr[..., 0::2], xr[..., 1::2]), dim=-1)
        if cos.requires_grad or sin.requires_grad:
            xr = xr * cos + rotate_half(xr) * sin
        else:  # the same products and sum in the same order, two of them in place: two full-size temporaries fewer
            xr = (xr * cos).add_(rotate_half(xr).mul_(sin))
        if self.interleaved:
            xr = torch.stack(xr.chunk(2, dim=-1), dim=-1).flatten(-2)  # (..., rot/2, 2) -> (..., rot)
        if not xp.shape[-1]:
            return xr
        return torch.cat((xp, xr) if self.at_end else (xr, xp), dim=-1)

    # ---- SelfExtend / STRING: the far view -------------------------------------------------
    def far_reach(self, layer: int) -> int | None:
        """Keys at distance >= this are scored through the far view (``far_positions``); None: one view (no
        extension, or a local layer of a per-layer-type model, which keeps its own rotation)."""
        o = self.options
        if o.extension == "none" or layer in self.layer_kept:
            return None
        return o.window if o.extension == "self_extend" else o.shift

    def far_positions(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The far view's positions of queries at absolute ``q_pos`` and keys at ``k_pos`` (None: the keys keep
        theirs, STRING). SelfExtend: ``floor(i / G) + w - w / G`` and ``floor(j / G)``; STRING: ``i - S + W``."""
        o = self.options
        if o.extension == "self_extend":
            G, w = o.group, o.window
            near = w - w / G  # a float where G does not divide w, as the authors' reference code computes it
            return torch.div(q_pos, G, rounding_mode="floor") + near, torch.div(k_pos, G, rounding_mode="floor")
        return q_pos - o.shift + o.window, None


def _resolve_extension(opts) -> None:
    """Check SelfExtend's and STRING's options and fill their defaults from the length served (factor x native)."""
    ext, native = opts.extension, opts.native_length
    given = [k for k in ("group", "window", "shift") if getattr(opts, k) is not None]
    if ext == "none":
        if given:
            raise OptionError(f"rope: option(s) {', '.join(given)} need extension self_extend or string")
        return
    if opts.scaling != "none":
        raise OptionError(f"rope: extension {ext} replaces rescaling; use scaling none (got {opts.scaling})")
    if opts.factor < 1.0:
        raise OptionError(f"rope: factor must be >= 1; got {opts.factor}")
    served = int(round(opts.factor * native))
    if ext == "self_extend":
        if opts.shift is not None:
            raise OptionError("rope: option 'shift' is STRING's; self_extend takes group and window")
        w = native // 4 if opts.window is None else opts.window
        if not 0 < w < native:
            raise OptionError(f"rope: self_extend's window must be in (0, native {native}); got {w}")
        need = max(2, -(-(served - w) // (native - w)))  # (N - w) * G + w >= served
        opts.window, opts.group = w, need if opts.group is None else opts.group
        if opts.group < 1:
            raise OptionError(f"rope: self_extend's group must be >= 1; got {opts.group}")
        return
    if opts.group is not None:
        raise OptionError("rope: option 'group' is SelfExtend's; string takes shift and window")
    w = min(STRING_WINDOW, max(1, native // 8)) if opts.window is None else opts.window
    # the paper's 0.33 of the length served, raised so that the far view reads no distance past native where it
    # can (served - native + W), and capped so that the near view never does (native - W): at 2x the far view
    # then reads up to native + W past its shift
    s = min(native - w, max(int(0.33 * served), served - native + w)) if opts.shift is None else opts.shift
    if not 0 < w < s:
        raise OptionError(f"rope: string needs 0 < window < shift; got window {w}, shift {s}")
    opts.window, opts.shift = w, s
