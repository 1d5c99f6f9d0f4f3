"""The lossless probe: a model claimed by its structure (not by a type this suite tests) is first converted
to the mechanism it already has (its own rotary, with its own frequencies) and must give back its own
logits; a model that does not is refused, never converted silently wrong.

The probe converts the model in place and reverts it (revert is exact, tested for every scheme), so it
costs two short forwards and no copy of the weights. Its tolerance is float noise measured on the spot:
the original's logits through transformers' eager attention against its own attention implementation."""

from __future__ import annotations

import hashlib
import logging

import torch

from ..foundation.errors import UnsupportedArchitectureError

log = logging.getLogger(__name__)
LENGTH = 64  # tokens of the probe (at most the native length), more to cross a sliding window up to WINDOW_REACH
WINDOW_REACH = 512
_PASSED: dict[str, float] = {}  # config fingerprint -> the difference measured when it passed


def fingerprint(model) -> str:
    blob = f"{type(model).__qualname__}|{model.config.to_json_string(use_diff=False)}|{next(model.parameters()).dtype}"
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def own_mechanism(adapter) -> tuple[str, dict]:
    """The scheme and options that reproduce the model's native positions."""
    if adapter.native_kind == "rope":
        return "rope", {}
    if adapter.native_kind == "alibi":  # Press et al.'s slopes; Falcon adds them before the score scaling
        return "alibi", dict(getattr(adapter, "native_alibi", {}))
    if adapter.native_kind == "sinusoidal":  # a fixed table: the sinusoids themselves (its layout, unscaled)
        return "sinusoidal", {}
    return "extend", {"length": adapter.spec().native_length, "init": "copy"}


def _output(model, x: torch.Tensor) -> torch.Tensor:
    """The model's logits, or a bare base model's last hidden state (an embedding model has no head)."""
    out = model(x)
    logits = getattr(out, "logits", None)
    return (logits if logits is not None else out.last_hidden_state).float()


HALF = (torch.float16, torch.bfloat16)


@torch.no_grad()
def lossless(model, adapter, convert, revert, set_attn) -> float:
    """Require ``model``'s logits back after converting it to its own mechanism; returns the difference.
    ``convert(model, scheme, options)``, ``revert(model)`` and ``set_attn(model, name)`` are core's (passed in:
    no import circle).

    A half-precision model is probed in float32 (its weights upcast, then put back bit for bit) where the fp32
    copy fits in its device's free memory: at half precision its own path rounds the scores (gemma2's eager
    softcap in bf16) and the float noise hides differences that matter (cohere's pairs, read the wrong way, pass
    in bf16 on a tiny model); where it does not fit, at its own precision, said in the log.
    Raises UnsupportedArchitectureError naming the difference."""
    key = fingerprint(model)
    if key in _PASSED:
        return _PASSED[key]
    if next(model.parameters()).dtype not in HALF:
        return _lossless(model, adapter, convert, revert, set_attn, key)
    if not _fits_in_fp32(model):
        log.warning("lossless probe: %s at its own precision (an fp32 copy does not fit)", model.config.model_type)
        return _lossless(model, adapter, convert, revert, set_attn, key)
    dtypes = {t: t.dtype for t in (*model.parameters(), *model.buffers())}
    try:
        model.float()
        return _lossless(model, adapter, convert, revert, set_attn, key)
    finally:
        for t, dtype in dtypes.items():
            t.data = t.data.to(dtype)


def _fits_in_fp32(model) -> bool:
    """Would upcasting the model's half-precision weights to float32 fit in its device's free memory (with a
    quarter to spare)?"""
    import os

    extra = 2 * sum(t.numel() for t in model.parameters() if t.dtype in HALF)  # bytes: 2 more per element
    device = next(model.parameters()).device
    try:
        if device.type == "cuda":
            free = torch.cuda.mem_get_info(device)[0]
        else:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, RuntimeError, AttributeError):
        return False
    return extra * 1.25 <= free


def _lossless(model, adapter, convert, revert, set_attn, key) -> float:
    was_training = model.training
    model.eval()
    spec = adapter.spec()
    device = next(model.parameters()).device
    windows = [s.window for s in adapter.attention_layers() if s.window and s.window <= WINDOW_REACH]
    n = max(2, min(max([LENGTH] + [w + 8 for w in windows]), spec.native_length or LENGTH))  # past every window
    vocab = model.get_input_embeddings().weight.shape[0]
    x = torch.randint(3, max(4, vocab), (1, n), generator=torch.Generator().manual_seed(0)).to(device)
    attn = model.config._attn_implementation
    try:
        before = _output(model, x)
        set_attn(model, "eager")
        eager = _output(model, x)
    except Exception as e:
        raise UnsupportedArchitectureError(
            f"{model.config.model_type} ({type(model).__name__}): the lossless probe could not run the original on "
            f"{n} random tokens with its own and with eager attention: {type(e).__name__}: {e}"
        ) from e
    finally:
        set_attn(model, attn)
        model.train(was_training)
    model.eval()
    noise = (eager - before).abs().max().item()
    scheme, options = own_mechanism(adapter)
    try:
        convert(model, scheme, options)
        after = _output(model, x)
    except Exception as e:
        raise UnsupportedArchitectureError(
            f"{model.config.model_type} ({type(model).__name__}): the lossless probe could not convert it to its "
            f"own {scheme}: {type(e).__name__}: {e}"
        ) from e
    finally:
        if getattr(model, "_retrofit_state", None) is not None:
            revert(model)
        model.train(was_training)
    diff = (after - before).abs().max().item()
    tol = max(1e-5 * max(1.0, before.abs().max().item()), 4 * noise)
    if not diff <= tol:
        raise UnsupportedArchitectureError(
            f"{model.config.model_type} ({type(model).__name__}): the lossless probe failed: converted to its own "
            f"{scheme}, its logits differ from the original's by {diff:.3g} (tolerance {tol:.2g}, from float noise "
            f"{noise:.2g}); no declared quirk explains it, so it is refused rather than converted silently wrong"
        )
    log.info(
        "lossless probe: %s converted to its own %s: logits within %.2g (tolerance %.2g)",
        model.config.model_type,
        scheme,
        diff,
        tol,
    )
    _PASSED[key] = diff
    return diff
