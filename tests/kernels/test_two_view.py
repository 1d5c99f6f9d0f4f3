"""The two-view kernels (SelfExtend, STRING: ``kernels.Far``): the CPU flash kernel (its near band in blocks of
several sizes) and the chunked kernel against attention written out densely, on calls with a cache, blocks smaller
and larger than the reach, rows left over after the last whole block, grouped keys, keys in other layouts."""

from __future__ import annotations

import pytest
import torch

from retrofit.kernels import Call, Far, attend
from retrofit.kernels import cpu_flash_two_view as two_view


def _dense(q, k, v, fq, fk, reach, q_start, scaling):
    i = (q_start + torch.arange(q.shape[-2]))[:, None]
    j = torch.arange(k.shape[-2])[None, :]
    s = torch.where(i - j >= reach, fq @ fk.transpose(-1, -2), q @ k.transpose(-1, -2)) * scaling
    return s.masked_fill(j > i, float("-inf")).softmax(-1) @ v


CASES = [  # (B, H, Tq, Tk, reach, q_start)
    (1, 2, 700, 700, 300, 0),  # a head of 300 rows, a band of 400
    (2, 3, 600, 600, 50, 0),  # a head of 50, a band of 550
    (1, 2, 1, 900, 300, 899),  # one decoding step
    (2, 2, 1, 40, 50, 39),  # a decoding step inside the head (every key near)
    (1, 2, 37, 500, 100, 463),  # a chunk after a cache
    (1, 2, 100, 130, 50, 30),  # a chunk after a cache shorter than the reach: head with the cached keys, band, far
    (1, 2, 300, 300, 1000, 0),  # no far key at all
    (1, 2, 70, 70, 1, 0),  # a reach of 1: the near view is the diagonal
]


@pytest.mark.parametrize("kernel,block", [("auto", 32), ("auto", 1024), ("auto", 64), ("auto", 7), ("chunked", None)])
@pytest.mark.parametrize("B,H,Tq,Tk,reach,q_start", CASES)
def test_two_view_kernels_equal_dense_attention(monkeypatch, B, H, Tq, Tk, reach, q_start, kernel, block):
    """Band blocks of the default size, larger than the rows (all rows left over), larger than the reach (50)
    and tiny ones; the chunked kernel (scores written out)."""
    if block:
        monkeypatch.setattr(two_view, "BAND", block)
    g = torch.Generator().manual_seed(Tq + reach)
    q, fq = (torch.randn(B, H, Tq, 16, generator=g) for _ in range(2))
    k, v, fk = (torch.randn(B, H, Tk, 16, generator=g) for _ in range(3))
    out, ran = attend(Call(q, k, v, 0.25, q_start=q_start, far=Far(fq, fk, reach)), kernel)
    assert ran == ("cpu-flash-two-view" if kernel == "auto" else "chunked")
    torch.testing.assert_close(out, _dense(q, k, v, fq, fk, reach, q_start, 0.25), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("grouped_op", [True, False])
def test_grouped_keys_padding_and_gradients_take_the_chunked_kernel(monkeypatch, grouped_op):
    """Grouped keys as they are where the CPU flash op takes them, repeated per head where it does not."""
    from retrofit.kernels import cpu_flash

    assert cpu_flash.takes_grouped()  # the pinned PyTorch's op reads Hkv < H
    monkeypatch.setattr(cpu_flash, "takes_grouped", lambda: grouped_op)
    q, fq = torch.randn(1, 4, 64, 8), torch.randn(1, 4, 64, 8)
    k, v, fk = torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8)
    ref = _dense(q, *(x.repeat_interleave(2, 1) for x in (k, v)), fq, fk.repeat_interleave(2, 1), 20, 0, 0.3)
    out, kernel = attend(Call(q, k, v, 0.3, far=Far(fq, fk, 20)))
    assert kernel == "cpu-flash-two-view"
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    pad = torch.ones(1, 64, dtype=torch.bool)
    pad[0, :3] = False
    assert attend(Call(q, k, v, 0.3, key_padding=pad, far=Far(fq, fk, 20)))[1] == "chunked"
    q.requires_grad_(True)
    assert attend(Call(q, k, v, 0.3, far=Far(fq, fk, 20)))[1] == "chunked"


@pytest.mark.parametrize("layout", ["heads_last", "cache_slice", "dims_strided"])
def test_the_band_reads_keys_in_place_whatever_their_strides(layout):
    """The band's windows are strided views of k and v: keys laid out (B, T, H, D) and seen transposed, or the
    first Tk rows of a longer cache, read the same keys as contiguous ones; keys whose head dim is not of unit
    stride (laid out (B, H, D, T)) are made contiguous first."""
    g = torch.Generator().manual_seed(3)
    q, fq = (torch.randn(2, 4, 90, 8, generator=g) for _ in range(2))
    k, v, fk = (torch.randn(2, 2, 150, 8, generator=g) for _ in range(3))
    if layout == "heads_last":
        k2, v2 = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
    elif layout == "cache_slice":
        k2, v2 = (torch.cat([x, torch.randn(2, 2, 40, 8, generator=g)], 2)[:, :, :150] for x in (k, v))
    else:
        k2, v2 = (x.transpose(-1, -2).contiguous().transpose(-1, -2) for x in (k, v))
    assert k2.stride() != k.stride()
    ref = _dense(q, *(x.repeat_interleave(2, 1) for x in (k, v)), fq, fk.repeat_interleave(2, 1), 25, 60, 0.3)
    out, ran = attend(Call(q, k2, v2, 0.3, q_start=60, far=Far(fq, fk, 25)))
    assert ran == "cpu-flash-two-view"
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_read_as_the_float32_kernel(dtype):
    """bf16 / fp16 q, k, v (the band's mask in their dtype): within their rounding of the fp32 dense attention."""
    g = torch.Generator().manual_seed(5)
    q, fq = (torch.randn(1, 4, 150, 16, generator=g) for _ in range(2))
    k, v, fk = (torch.randn(1, 2, 150, 16, generator=g) for _ in range(3))
    ref = _dense(q, *(x.repeat_interleave(2, 1) for x in (k, v)), fq, fk.repeat_interleave(2, 1), 40, 0, 0.25)
    half = [x.to(dtype) for x in (q, k, v, fq, fk)]
    out, ran = attend(Call(*half[:3], 0.25, far=Far(*half[3:], 40)))
    assert ran == "cpu-flash-two-view" and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)
