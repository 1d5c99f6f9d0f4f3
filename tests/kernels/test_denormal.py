"""Denormals flushed around the biased kernels only (forward and backward, every intra-op thread), the
user's setting restored after, and the flush changes no output or gradient beyond rounding."""

from __future__ import annotations

import pytest
import torch

from retrofit import kernels
from retrofit.kernels import denormal

pytestmark = pytest.mark.skipif(not denormal.supported(), reason="this CPU cannot flush denormals")


@pytest.fixture(autouse=True)
def _small_calls_flush_too(monkeypatch):
    monkeypatch.setattr(denormal, "MIN_SCORES", 0)


def _alibi(q, k, v, **kw):
    slopes = torch.tensor([0.5, 0.25])
    call = kernels.Call(q, k, v, q.shape[-1] ** -0.5, slopes=slopes, bias=lambda h, i, j: -slopes[h] * (i - j), **kw)
    return kernels.attend(call)


class _Spy(torch.autograd.Function):
    """Records whether the calling thread flushes when the backward reaches the kernel."""

    seen: list[bool] = []

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        _Spy.seen.append(denormal.is_flushing())
        return g


def test_scoped_forward_and_backward_and_restored(monkeypatch):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 8, requires_grad=True) for _ in range(3))
    seen = []

    def spied(q, k, v, **kw):
        seen.append(denormal.is_flushing())
        out, path = _alibi(q, k, v, **kw)
        return _Spy.apply(out), path

    _Spy.seen = []
    assert not denormal.is_flushing()
    out, _ = denormal.attend(spied, q, k, v)
    assert seen == [True] and not denormal.is_flushing()  # on in the forward, off after it
    out.sum().backward()
    assert _Spy.seen == [True] and not denormal.is_flushing()  # on in the kernel's backward, off after
    out, _ = denormal.attend(spied, q, k, v, flush=False)
    assert seen == [True, False]
    monkeypatch.setattr(denormal, "MIN_SCORES", 2 * 64 * 64 + 1)  # a call this small runs as it is
    out, _ = denormal.attend(spied, q, k, v)
    assert seen == [True, False, False]


def test_user_setting_left_alone():
    torch.set_flush_denormal(True)
    try:
        with denormal.flushing():
            assert denormal.is_flushing()
        assert denormal.is_flushing()  # already on: still on
    finally:
        torch.set_flush_denormal(False)
    with denormal.flushing():
        pass
    assert not denormal.is_flushing()


@pytest.mark.skipif(
    torch.get_num_threads() < 2 or denormal._libgomp() is None,
    reason="needs 2+ intra-op threads and torch on libgomp (the pool's flush goes through it)",
)
def test_every_intra_op_thread():
    x = torch.full((1 << 16,), 2.0**-140)  # split over the threads
    with denormal.flushing():
        assert bool(((x * 1.0) == 0).all())
    assert bool(((x * 1.0) != 0).all())


def test_denormals_carry_no_weight(monkeypatch):
    """Steep heads over 1k keys: outputs and gradients with and without the flush agree to rounding."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 1024, 16, requires_grad=True) for _ in range(3))
    results = []
    for flag in ("1", "0"):
        monkeypatch.setenv("RETROFIT_FLUSH_DENORMAL", flag)
        out, _ = denormal.attend(_alibi, q, k, v)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        results.append((out.detach(), *grads))
    for a, b in zip(*results):
        assert (a - b).abs().max() <= 1e-6 * max(1.0, float(b.abs().max()))
