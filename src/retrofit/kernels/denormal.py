"""Flush-to-zero around the biased attention kernels, forward and backward, restored after.

A steep positional bias (ALiBi, T5's and Shaw's bands, FIRE) makes many softmax probabilities underflow
gradually: they pass through the denormal range (below 1.2e-38 in fp32) on their way to zero, and x86
arithmetic on denormals is many times slower (on some Intel CPUs the train step of a biased model ran
well above stock until the kernels flushed them; AMD shows little; measured: docs/results.md, "Denormals").
A denormal probability carries no
weight: it is below 2^-126 of the row's largest term (1), far under fp32's 2^-24 rounding of the sum, and
the output and gradients are the same with it flushed (``tests/kernels/test_denormal.py``).

``torch.set_flush_denormal`` sets only the calling thread's MXCSR: the intra-op worker threads keep what
they inherited when they were created. ``flushing()`` therefore sets the calling thread through torch and
the OpenMP pool's threads through libgomp (one parallel region running ``fesetenv`` with the calling
thread's fenv), and on leaving sets every thread back to the calling thread's fenv from
before. Where the user had already turned flushing on, it leaves every thread as it is.

``attend(fn, q, k, v, ...)`` runs an attention call inside ``flushing()`` and, under grad, brackets it with
two identity autograd nodes: the one after the kernel turns flushing on when the backward reaches it,
the one before the kernel turns it back off once the kernel's gradients are done (and a callback at the
end of the backward restores it whatever happens in between). The process's setting outside these calls
is never changed.

Calls with fewer than ``MIN_SCORES`` scores (a decoding step: one query row) run as they are: their
denormals cost little, and waking the thread pool to set it costs more (per enter and exit, above all
with the pool's threads asleep; measured: docs/results.md, "Denormals", ``benchmarks/measure_denormal.json``).

``RETROFIT_FLUSH_DENORMAL=0`` turns all this off (``1``, the default: on). The table (``kernels.attend``) runs
a biased call on CPU through ``attend`` here.
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager

import torch

# what the process does (also what every benchmark records: ``foundation.versions.cpu_info``)
from ..foundation.versions import flush_enabled as enabled
from ..foundation.versions import flush_supported as supported
from ..foundation.versions import is_flushing

_pool = None  # (libgomp, GOMP_parallel, fesetenv, fegetenv) or False when unavailable
MIN_SCORES = 1 << 22  # B x H x Tq x Tk below this: no flush (12 heads of 512 x 512 are 3.1M)


def _libgomp():
    """The OpenMP runtime torch runs its intra-op threads on, if it is libgomp: (GOMP_parallel, fesetenv,
    fegetenv) through ctypes, or None."""
    global _pool
    if _pool is None:
        _pool = False
        try:
            path = next((line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line), None)
            if path:
                gomp, libm = ctypes.CDLL(path), ctypes.CDLL("libm.so.6")
                run = gomp.GOMP_parallel
                run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
                run.restype = None
                setenv = ctypes.cast(libm.fesetenv, ctypes.c_void_p)
                getenv = libm.fegetenv
                getenv.argtypes = [ctypes.c_void_p]
                _pool = (run, setenv, getenv)
        except (OSError, AttributeError):
            _pool = False
    return _pool or None


def _set(on: bool, env: ctypes.Array | None = None) -> ctypes.Array | None:
    """Set the calling thread's flushing; then every pool thread to the calling thread's fenv
    (``env``: that one instead). Returns the calling thread's fenv from before."""
    pool = _libgomp() if torch.get_num_threads() > 1 else None
    before = None
    if pool is not None:
        before = ctypes.create_string_buffer(64)  # fenv_t is 32 bytes on x86-64
        pool[2](before)
    torch.set_flush_denormal(on)
    if pool is not None:
        now = env
        if now is None:
            now = ctypes.create_string_buffer(64)
            pool[2](now)
        pool[0](pool[1], ctypes.addressof(now), torch.get_num_threads(), 0)
    return before


class _Scope:
    """One turn of flushing on, undone once."""

    def __init__(self):
        self.before = None
        self.active = False

    def on(self) -> None:
        if self.active or not enabled() or not supported() or is_flushing():
            return
        self.before = _set(True)
        self.active = True

    def off(self) -> None:
        if self.active:
            self.active = False
            _set(False, self.before)


@contextmanager
def flushing():
    """Denormals flushed to zero inside (every intra-op thread), the previous setting restored after."""
    scope = _Scope()
    scope.on()
    try:
        yield
    finally:
        scope.off()


class _After(torch.autograd.Function):
    """Identity after the kernel: its backward runs first, and turns flushing on for the kernel's backward."""

    @staticmethod
    def forward(ctx, scope, out):
        ctx.scope = scope
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        scope = ctx.scope
        scope.on()
        if scope.active:  # restored at the end of the backward whatever happens in between
            torch.autograd.Variable._execution_engine.queue_callback(scope.off)
        return None, grad


class _Before(torch.autograd.Function):
    """Identity before the kernel: its backward runs once the kernel's gradients are done: flushing off."""

    @staticmethod
    def forward(ctx, scope, *xs):
        ctx.scope = scope
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.scope.off()
        return None, *grads


def attend(fn, q, k, v, *, flush: bool = True, **kwargs):
    """``fn(q, k, v, **kwargs) -> (out, ...)`` with denormals flushed in its forward and backward
    (``flush`` False, a CUDA tensor, or a CPU that cannot flush: ``fn`` as it is)."""
    small = q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2] < MIN_SCORES
    if not flush or small or q.device.type != "cpu" or not enabled() or not supported():
        return fn(q, k, v, **kwargs)
    with flushing():
        if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
            return fn(q, k, v, **kwargs)
        scope = _Scope()
        q, k, v = _Before.apply(scope, q, k, v)
        out, *rest = fn(q, k, v, **kwargs)
        return _After.apply(scope, out), *rest
