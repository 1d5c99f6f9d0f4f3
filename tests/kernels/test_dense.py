"""Any bias through the CPU flash kernel block by block (kernel ``cpu-flash-mask``,
``src/retrofit/kernels/cpu_flash_mask.py``): exact against a plain fp64 softmax with an arbitrary per-(head, query, key) bias table, forward and backward
(q, k, v and the table the bias is read from), with a cache offset, a window, padding, a per-row
temperature and half inputs; FIRE models train on it with the chunked kernel's gradients; blocks stay
bounded; a frozen bias costs no score recompute. A bias of the distance alone (``Call.distance_only``) runs as one
table read through strided views, exact with its gradients; FIRE takes that route only before its threshold."""

from __future__ import annotations

import pytest
import torch

import retrofit
from retrofit import kernels
from retrofit.kernels import Call
from retrofit.kernels import cpu_flash_mask as dense
from retrofit.patch.conversion import set_kernel

from ..tiny import NATIVE, TINY, ids


def _reference(q, k, v, scaling, table, q_start=0, window=None, padding=None, row_scale=None):
    """softmax(q.k * scaling + table[h, i, j] (x row_scale[b, i])) over the visible keys, fp64."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    i = torch.arange(q_start, q_start + Tq)[:, None]
    j = torch.arange(Tk)[None, :]
    b = table.double()[:, q_start : q_start + Tq, :Tk][None]  # (1, H, Tq, Tk)
    if row_scale is not None:
        b = b * row_scale.double()[:, None, :, None]
    s = q.double() @ k.double().transpose(-1, -2) * scaling + b
    ok = (j <= i)[None, None]
    if window:
        ok = ok & (i - j < window)
    if padding is not None:
        ok = (ok & padding[:, None, None, :]) | (i == j)
    return s.masked_fill(~ok, float("-inf")).softmax(-1) @ v.double()


def _inputs(B, H, Tq, Tk, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g).to(dtype).requires_grad_()
    k, v = (torch.randn(B, H, Tk, D, generator=g).to(dtype).requires_grad_() for _ in range(2))
    table = (torch.randn(H, Tk, Tk, generator=g) * 2).requires_grad_()  # bias[h, i, j]: no structure at all
    return q, k, v, table


def _bias(table):
    return lambda h, i, j: table[h, i, j]  # (H, 1, 1), (1, C, 1), (1, 1, Tc) -> (H, C, Tc)


def _check_grads(out, ref, leaves, tol=2e-5):
    weight = torch.randn(out.shape, dtype=torch.float64)
    got = torch.autograd.grad((out.double() * weight).sum(), leaves)
    want = torch.autograd.grad((ref * weight).sum(), leaves)
    for name, a, b in zip("q k v table".split(), got, want):
        assert float((a.double() - b).abs().max()) <= tol * max(1.0, float(b.abs().max())), name


@pytest.mark.parametrize("Tq,Tk,rows", [(40, 40, 8), (37, 37, 8), (8, 8, 8), (5, 45, 8), (1, 30, 8), (300, 300, 128)])
def test_dense_matches_the_plain_softmax_forward_and_backward(monkeypatch, Tq, Tk, rows):
    """Several blocks, a ragged last block, one block, a cached prefix (Tq < Tk), one decoding query."""
    monkeypatch.setattr(dense, "ROWS", rows)
    q, k, v, table = _inputs(2, 3, Tq, Tk, 8)
    out = dense.attend_dense(Call(q, k, v, scaling=0.35, bias=_bias(table), bias_params=(table,), q_start=Tk - Tq))
    ref = _reference(q, k, v, 0.35, table, q_start=Tk - Tq)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)
    _check_grads(out, ref, (q, k, v, table))


def test_dense_with_window_padding_and_row_scale(monkeypatch):
    monkeypatch.setattr(dense, "ROWS", 8)
    q, k, v, table = _inputs(2, 3, 30, 30, 8, seed=1)
    padding = torch.ones(2, 30, dtype=torch.bool)
    padding[0, :7] = False  # left padding in the first row
    row_scale = torch.rand(2, 30, generator=torch.Generator().manual_seed(2)) + 0.5
    kw = dict(window=11, key_padding=padding, row_scale=row_scale)
    out = dense.attend_dense(Call(q, k, v, scaling=0.3, bias=_bias(table), bias_params=(table,), **kw))
    ref = _reference(q, k, v, 0.3, table, window=11, padding=padding, row_scale=row_scale)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)
    _check_grads(out, ref, (q, k, v, table))


@pytest.mark.parametrize("dtype,atol", [(torch.bfloat16, 3e-2), (torch.float16, 4e-3)])
def test_dense_scores_half_inputs_in_fp32(dtype, atol):
    q, k, v, table = _inputs(1, 4, 300, 300, 16, dtype)
    out = dense.attend_dense(Call(q, k, v, scaling=0.25, bias=_bias(table), bias_params=(table,)))
    assert out.dtype == dtype
    assert float((out.double() - _reference(q, k, v, 0.25, table)).abs().max()) <= atol


def test_blocks_stay_bounded_and_a_frozen_bias_costs_no_score_recompute(monkeypatch):
    """Every block's mask holds at most max_rows x Tk entries per head; without a parameter that needs a
    gradient the backward is the flash kernel's alone (no recomputed scores)."""
    shapes, recomputed = [], []
    real_mask, real_grad = dense.block_bias, dense._probabilities
    monkeypatch.setattr(dense, "block_bias", lambda *a, **kw: shapes.append(a[2].C) or real_mask(*a, **kw))
    monkeypatch.setattr(dense, "_probabilities", lambda *a: recomputed.append(1) or real_grad(*a))
    q, k, v, table = _inputs(1, 2, 100, 100, 8)
    frozen = table.detach()
    out = dense.attend_dense(Call(q, k, v, scaling=0.3, bias=_bias(frozen), bias_params=(frozen,)), max_rows=16)
    out.sum().backward()
    assert max(shapes) == 16 and len(shapes) == 2 * 7 and not recomputed  # 7 blocks, forward + backward
    ref = _reference(q, k, v, 0.3, frozen)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)
    flash = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    learned = table.detach().clone().requires_grad_()  # the bias learns: P and dS once per block, for all
    dense.attend_dense(
        Call(q, k, v, scaling=0.3, bias=_bias(learned), bias_params=(learned,)), max_rows=16
    ).sum().backward()
    assert len(recomputed) == 7 and learned.grad is not None
    for x, g in zip((q, k, v), flash):
        torch.testing.assert_close(x.grad, g, atol=1e-6, rtol=1e-5)


def test_long_key_spans_take_fewer_rows_per_block(monkeypatch):
    """The block's rows shrink (to MIN_ROWS at least) as the keys grow, so a block's mask stays near
    BLOCK_ELEMENTS whatever the length; the result is the same softmax."""
    monkeypatch.setattr(dense, "BLOCK_ELEMENTS", 2 * 160 * 64)  # 2 heads x 160 keys x 64 rows
    monkeypatch.setattr(dense, "MIN_ROWS", 16)
    assert dense.block_rows(2, 160) == 64 and dense.block_rows(2, 1000) == 16 and dense.block_rows(2, 10) == dense.ROWS
    shapes = []
    real_mask = dense.block_bias
    monkeypatch.setattr(dense, "block_bias", lambda *a, **kw: shapes.append(a[2].C) or real_mask(*a, **kw))
    q, k, v, table = _inputs(1, 2, 160, 160, 8)
    out = dense.attend_dense(Call(q, k, v, scaling=0.3, bias=_bias(table), bias_params=(table,)))
    assert max(shapes) == 64 and len(shapes) == 3  # 160 queries: 64 + 64 + 32
    _check_grads(out, _reference(q, k, v, 0.3, table), (q, k, v, table))


def test_kernel_attend_picks_dense_on_cpu_for_a_bias_without_structure():
    q, k, v, table = _inputs(1, 2, 64, 64, 8)
    out, kernel = kernels.attend(Call(q, k, v, scaling=0.3, bias=_bias(table), bias_params=(table,)))
    assert kernel == "cpu-flash-mask"
    torch.testing.assert_close(out.double(), _reference(q, k, v, 0.3, table), atol=2e-6, rtol=1e-5)
    _, kernel = kernels.attend(Call(q, k, v, scaling=0.3, bias=_bias(table), dropout=0.1))
    assert kernel == "chunked"  # dropout: the chunked kernel (CPU SDPA's dropout)


@pytest.mark.parametrize(
    "scheme,options",
    [
        ("fire", {}),
        ("t5", {"temperature": 0.4, "temperature_length": 8}),
        ("alibi", {"temperature": 0.4, "temperature_length": 8}),
    ],
)
def test_a_model_trains_on_dense_with_the_chunked_gradients(scheme, options, user_kernel):
    """FIRE (its bias reads the query's position), T5 with a temperature, ALiBi in bf16 with a temperature:
    the model's loss and every trainable parameter's gradient (the position module's included) equal the
    chunked kernel's."""
    dtype = torch.bfloat16 if scheme == "alibi" else torch.float32  # bf16 ALiBi + temperature: no fused q side
    model = retrofit.convert(TINY["gpt2"]().to(dtype), scheme, **options)
    x = ids(2, 3 * NATIVE)
    grads = {}
    for kernel in ("auto", "chunked"):
        set_kernel(model, kernel)
        model.zero_grad()
        loss = model(x, labels=x).loss
        loss.backward()
        grads[kernel] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        if kernel == "auto":
            assert set(retrofit.patch.conversion._state(model).kernels) == {"cpu-flash-mask"}
            retrofit.patch.conversion._state(model).kernels.clear()
    (la, ga), (lc, gc) = grads["auto"], grads["chunked"]
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(la, lc, atol=tol, rtol=tol)
    assert ga.keys() == gc.keys() and any(n.startswith("retrofit_positions") for n in ga) == (scheme != "alibi")
    for n in ga:
        scale = max(1.0, float(gc[n].abs().max()))
        assert float((ga[n].float() - gc[n].float()).abs().max()) <= tol * scale, n


def _distance_inputs(B, Tk, Tq, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 3, Tq, 8, generator=g).requires_grad_()
    k, v = (torch.randn(B, 3, Tk, 8, generator=g).requires_grad_() for _ in range(2))
    per_distance = (torch.randn(3, Tk, generator=g) * 2).requires_grad_()  # bias[h, i - j]
    return q, k, v, per_distance


@pytest.mark.parametrize(
    "B,Tq,Tk,rows,window",
    [(2, 40, 40, 8, None), (1, 37, 37, 8, None), (2, 5, 45, 8, None), (1, 1, 30, 8, None), (2, 300, 300, 128, None),
     (2, 30, 30, 8, 11)],
)  # fmt: skip
def test_a_distance_bias_runs_as_one_table_exactly(monkeypatch, B, Tq, Tk, rows, window):
    """Several blocks (each a rectangle before it and its causal square), a ragged last one, a cached prefix, one
    decoding query, a window: the table route's output and gradients (q, k, v and the per-distance values, summed along each block's diagonals) against the plain
    fp64 softmax; with a frozen bias its backward is the flash kernel's and gives the same q, k, v gradients."""
    monkeypatch.setattr(dense, "ROWS", rows)
    monkeypatch.setattr(dense, "MIN_ROWS", rows)  # the table route's blocks too (square_rows: MIN_ROWS)
    monkeypatch.setattr(dense, "SQUARE_ELEMENTS", 0)
    q, k, v, per_distance = _distance_inputs(B, Tk, Tq)
    i, j = torch.arange(Tk)[:, None], torch.arange(Tk)[None, :]
    for learned in (True, False):
        full = per_distance[:, (i - j).clamp(min=0)]  # (H, Tk, Tk)
        ref = _reference(q, k, v, 0.35, full, q_start=Tk - Tq, window=window)
        table = per_distance if learned else per_distance.detach()
        kw = dict(bias=lambda h, i, j: table[h, (i - j).clamp(min=0)], bias_params=(table,), distance_only=True)
        call = Call(q, k, v, scaling=0.35, q_start=Tk - Tq, window=window, **kw)
        assert dense.by_distance(call)
        out = dense.attend_distance(call)
        torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)
        _check_grads(out, ref, (q, k, v, per_distance) if learned else (q, k, v))


def test_fire_reads_its_bias_per_distance_before_its_threshold_only(monkeypatch):
    """Within the threshold FIRE's calls take the table route (its normaliser is psi(L) for every query) and the
    model's loss and gradients equal the chunked kernel's; past it, the block-by-block mask."""
    routes = []
    real = dense.attend_distance
    monkeypatch.setattr(dense, "attend_distance", lambda *a, **kw: routes.append(1) or real(*a, **kw))
    model = retrofit.convert(TINY["gpt2"](), "fire")
    grads = {}
    for kernel in ("auto", "chunked"):
        set_kernel(model, kernel)
        model.zero_grad()
        x = ids(2, NATIVE)
        loss = model(x, labels=x).loss
        loss.backward()
        grads[kernel] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert routes and retrofit.describe(model)["last_kernel"] == "chunked"
    (la, ga), (lc, gc) = grads["auto"], grads["chunked"]
    torch.testing.assert_close(la, lc, atol=1e-5, rtol=1e-5)
    assert any(n.startswith("retrofit_positions") for n in ga)
    for n in gc:
        assert float((ga[n] - gc[n]).abs().max()) <= 1e-4 * max(1.0, float(gc[n].abs().max())), n
    routes.clear()
    set_kernel(model, "auto")
    with torch.no_grad():
        model(ids(1, NATIVE + 8))
    assert not routes and retrofit.describe(model)["last_kernel"] == "cpu-flash-mask"


def test_fire_decodes_and_generates_on_dense():
    model = retrofit.convert(TINY["gpt2"]().eval(), "fire", kernel="cpu-flash-mask")
    x = ids(1, 2 * NATIVE)
    with torch.no_grad():
        out = model.generate(x, max_new_tokens=NATIVE, do_sample=False, use_cache=True)
        full = model(out[:, :-1]).logits
    assert retrofit.describe(model)["last_kernel"] == "cpu-flash-mask"
    assert torch.equal(full[0, 2 * NATIVE - 1 :].argmax(-1), out[0, 2 * NATIVE :])


@pytest.mark.parametrize(
    "H,Tk,rows", [(12, 1024, 256), (12, 2048, 256), (12, 4096, 256), (12, 8192, 1024), (64, 8192, 512)]
)
def test_the_table_route_takes_short_blocks_below_long_keys(H, Tk, rows):
    """256 query rows per block below ``LONG_KEYS`` keys (the (H, C, C) square mask, built in the forward and the
    backward, stays small), 1,024 from there on (fewer passes over long rectangles), capped by the square's size."""
    assert dense.square_rows(H, Tk) == rows
    assert H * rows * rows <= dense.SQUARE_ELEMENTS
