"""T5 and Shaw through the band kernel (``cpu-flash-band``, ``src/retrofit/kernels/cpu_flash_band.py``): the far keys
through the stock CPU flash kernel, the last K keys as an explicit band, merged by log-sum-exp. Exact against a plain fp64
softmax with the bias from the papers' equations (T5's buckets from transformers' own
``T5Attention._relative_position_bucket``), forward and backward including the bias table's gradient,
in each dtype; kernel selection; and a converted model trains, decodes and reloads on it."""

from __future__ import annotations

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

import retrofit
from retrofit import kernels
from retrofit.kernels import Call, cpu_flash_band

from ..tiny import TINY, ids, train_step


def _reference(q, k, v, scaling, table):
    """softmax(q.k * scaling + table[h, min(i - j, K)]) over causal keys, in fp64."""
    N, K = q.shape[-2], table.shape[-1] - 1
    d = torch.arange(N)[:, None] - torch.arange(N)[None, :]
    s = q.double() @ k.double().transpose(-1, -2) * scaling + table.double()[:, d.clamp(0, K)]
    return s.masked_fill(d < 0, float("-inf")).softmax(-1) @ v.double()


def _inputs(B, H, N, D, K, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=g).to(dtype).requires_grad_() for _ in range(3))
    table = (torch.randn(H, K + 1, generator=g) * 3).requires_grad_()
    return q, k, v, table


def _grads(out, leaves, weight):
    return torch.autograd.grad((out.double() * weight).sum(), leaves)


def _matches_the_plain_softmax(N, K):
    """The band kernel's output and gradients (q, k, v and the table) against the fp64 softmax, 2 x 3 heads of 8."""
    q, k, v, table = _inputs(2, 3, N, 8, K)
    out = cpu_flash_band.attend_band(q, k, v, scaling=0.35, band=table)
    ref = _reference(q, k, v, 0.35, table)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)
    weight = torch.randn(out.shape, dtype=torch.float64)
    got = _grads(out, (q, k, v, table), weight)
    want = _grads(ref, (q, k, v, table), weight)
    for name, a, b in zip("q k v table".split(), got, want):
        assert float((a.double() - b).abs().max()) <= 2e-5 * max(1.0, float(b.abs().max())), name


@pytest.mark.parametrize(
    "N,K,rows", [(40, 16, 8), (16, 16, 8), (200, 16, 8), (203, 16, 8), (300, 40, 16), (130, 128, 128), (700, 128, 128)]
)
def test_band_matches_the_plain_softmax_forward_and_backward(monkeypatch, N, K, rows):
    """Shorter than the reach, exactly the reach, several blocks, a ragged last block, windows of 3+ tiles."""
    monkeypatch.setattr(cpu_flash_band, "ROWS", rows)
    monkeypatch.setattr(cpu_flash_band, "GROUP_ELEMENTS", 1)  # the band's windows block by block
    monkeypatch.setattr(cpu_flash_band, "SCORE_ELEMENTS", 1)  # the bias gradient too (the models' tests: groups)
    _matches_the_plain_softmax(N, K)


@pytest.mark.parametrize("N,K,rows", [(700, 128, 256), (300, 40, 64), (90, 16, 32), (64, 16, 32)])
def test_long_blocks_read_far_keys_without_a_mask(monkeypatch, N, K, rows):
    """Blocks of ``SPLIT_ROWS`` rows or more read the keys at the reach or further from all their queries without a
    mask (T5's band is 0 there), the rest of the keys before them with it: exact against the plain softmax, forward
    and backward with the table's gradient; the unmasked calls ran (where a block has such keys)."""
    from retrofit.kernels import cpu_flash, cpu_flash_mask

    monkeypatch.setattr(cpu_flash_mask, "SPLIT_ROWS", rows)
    monkeypatch.setattr(cpu_flash_mask, "square_rows", lambda H, Tk: rows)
    unmasked = []
    real_forward, real_backward = cpu_flash.forward, cpu_flash.backward

    def forward(q, k, v, scaling, mask=None, causal=True):
        unmasked.append(mask is None and not causal)
        return real_forward(q, k, v, scaling, mask, causal)

    def backward(dout, qkv, merged, scaling, mask=None, causal=True):
        unmasked.append(mask is None and not causal)
        return real_backward(dout, qkv, merged, scaling, mask, causal)

    monkeypatch.setattr(cpu_flash, "forward", forward)
    monkeypatch.setattr(cpu_flash, "backward", backward)
    _matches_the_plain_softmax(N, K)
    far_blocks = sum(1 for s in range(rows, N, rows) if s - K + 1 > 0)  # blocks with keys K or more before them all
    assert sum(unmasked) == 2 * far_blocks  # one forward and one backward call each
    assert far_blocks > 0 or N <= rows


@pytest.mark.parametrize("dtype,atol", [(torch.bfloat16, 3e-2), (torch.float16, 4e-3)])
def test_band_keeps_half_inputs_at_their_own_rounding(dtype, atol):
    q, k, v, table = _inputs(1, 4, 600, 16, 128, dtype)
    out = cpu_flash_band.attend_band(q, k, v, scaling=0.25, band=table)
    assert out.dtype == dtype
    ref = _reference(q, k, v, 0.25, table)
    assert float((out.double() - ref).abs().max()) <= atol


def test_t5_band_is_the_t5_bucket_bias_of_transformers():
    """The scheme's band, read at min(i - j, K), equals its own bias and T5's bucketed table everywhere."""
    model = retrofit.convert(TINY["gpt2"](), "t5")
    scheme = retrofit.patch.conversion._state(model).scheme()
    table = scheme.table[1]  # (H, num_buckets)
    values = scheme.distance_band(1)
    K = values.shape[-1] - 1
    d = torch.arange(3 * K)
    buckets = T5Attention._relative_position_bucket(
        -d, bidirectional=False, num_buckets=scheme.options.num_buckets, max_distance=scheme.options.max_distance
    )
    torch.testing.assert_close(values[:, d.clamp(max=K)], table[:, buckets], atol=0, rtol=0)
    h = torch.arange(table.shape[0])[:, None, None]
    own = scheme.bias(1, h, d[None, :, None], torch.zeros(1, 1, 1, dtype=torch.long))[..., 0]
    torch.testing.assert_close(values[:, d.clamp(max=K)], own, atol=0, rtol=0)


@pytest.mark.parametrize("scheme", ["t5", "shaw"])
def test_every_band_scheme_declares_its_band_truthfully(scheme):
    model = retrofit.convert(TINY["llama"](), scheme, init="zero" if scheme == "shaw" else "alibi")
    s = retrofit.patch.conversion._state(model).scheme()
    with torch.no_grad():
        s.table.normal_()
    values = s.distance_band(0)
    K = values.shape[-1] - 1
    i, j = torch.arange(3 * K)[:, None], torch.arange(3 * K)[None, :]
    h = torch.arange(values.shape[0])[:, None, None]
    full = s.bias(0, h, i[None], j[None])
    causal = (i >= j).expand_as(full[0])
    torch.testing.assert_close(full[:, causal], values[:, (i - j).clamp(0, K)][:, causal], atol=0, rtol=0)


def test_kernel_selection():
    q = torch.randn(1, 2, 64, 8)
    table = torch.zeros(2, 5)
    bias = lambda h, i, j: table[h, (i - j).clamp(0, 4)]  # noqa: E731

    def choose(kernel="auto", q=q, **hints):
        return kernels.choose(Call(q, k=torch.randn(1, 2, 64, 8), v=q, scaling=0.3, bias=bias, **hints), kernel).name

    padding = torch.ones(1, 64, dtype=torch.bool)
    padding[0, 3] = False
    assert choose(band=table) == "cpu-flash-band"
    assert choose("cpu-flash-band", band=table) == "cpu-flash-band"
    # a decoding step, padding: the mask kernel (the band's far square needs the whole causal square)
    assert choose(q=q[:, :, -1:], band=table, q_start=63) == "cpu-flash-mask"
    assert choose(band=table, key_padding=padding) == "cpu-flash-mask"
    assert choose(band=table, row_scale=torch.ones(1, 64)) == "cpu-flash-mask"
    with pytest.raises(RuntimeError, match="not full causal self-attention"):
        choose("cpu-flash-band", q=q[:, :, -1:], band=table, q_start=63)
    assert choose(band=table, dropout=0.1) == "chunked"  # dropout
    assert choose("chunked", band=table) == "chunked"
    assert choose() == "cpu-flash-mask"  # FIRE: no band


def test_a_kernel_is_refused_at_convert_where_it_cannot_serve_the_scheme():
    with pytest.raises(
        retrofit.foundation.errors.OptionError, match="kernel 'cpu-flash-band' .* cannot serve a rotary scheme"
    ):
        retrofit.convert(TINY["gpt2"](), "rope", kernel="cpu-flash-band")
    for scheme, options in (("fire", {}), ("t5", {"temperature": 0.3})):
        model = retrofit.convert(TINY["gpt2"](), scheme, kernel="cpu-flash-mask", **options)
        with torch.no_grad():
            model(ids(1, 20))
        assert retrofit.describe(model)["last_kernel"] == "cpu-flash-mask"


@pytest.mark.parametrize("scheme", ["t5", "shaw"])
def test_a_converted_model_trains_on_the_band_kernel_and_matches_chunked(scheme):
    torch.manual_seed(0)
    options = dict(num_buckets=16) if scheme == "t5" else {}
    model = retrofit.convert(TINY["gpt2"](), scheme, max_distance=16, **options)
    x = ids(2, 70)

    def step(kernel_name):
        return *train_step(model, kernel_name, x), retrofit.describe(model)["last_kernel"]

    loss_b, grads_b, path_b = step("cpu-flash-band")
    loss_c, grads_c, path_c = step("chunked")
    assert path_b == "cpu-flash-band" and path_c == "chunked"
    torch.testing.assert_close(loss_b, loss_c, atol=1e-6, rtol=1e-6)
    assert any("retrofit_positions" in n for n in grads_b), "the bias table gets no gradient"
    assert grads_b.keys() == grads_c.keys()
    for n in grads_c:
        torch.testing.assert_close(grads_b[n], grads_c[n], atol=2e-6, rtol=1e-4, msg=n)


def test_auto_takes_the_band_kernel_and_generate_with_cache_equals_recompute(user_kernel):
    model = retrofit.convert(TINY["llama"](), "t5", num_buckets=16, max_distance=16)
    x = ids(1, 50)
    with torch.no_grad():
        model(x)
        assert retrofit.describe(model)["last_kernel"] == "cpu-flash-band"
        kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        a = model.generate(x, use_cache=True, **kw)
        b = model.generate(x, use_cache=False, **kw)
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), atol=2e-5, rtol=1e-4)


def test_saved_band_model_reloads_with_the_same_logits(tmp_path):
    model = retrofit.convert(TINY["gpt2"](), "t5", kernel="auto")
    x = ids(1, 60)
    with torch.no_grad():
        before = model(x).logits
    retrofit.save(model, tmp_path / "m")
    loaded = retrofit.load(tmp_path / "m")
    with torch.no_grad():
        after = loaded(x).logits
    assert retrofit.describe(loaded)["last_kernel"] == "cpu-flash-band"
    torch.testing.assert_close(after, before, atol=0, rtol=0)


def test_a_window_that_reaches_every_key_is_no_window():
    """Mistral's 4k window over a 2k input masks nothing: the call keeps the band kernel and its result."""
    q, k, v, table = _inputs(1, 2, 40, 8, 16)
    bias = lambda h, i, j: table[h, (i - j).clamp(0, 16)]  # noqa: E731
    plain, ran = kernels.attend(Call(q, k, v, scaling=0.3, bias=bias, band=table))
    windowed, windowed_ran = kernels.attend(Call(q, k, v, scaling=0.3, bias=bias, band=table, window=40))
    assert ran == windowed_ran == "cpu-flash-band"
    torch.testing.assert_close(windowed, plain, atol=0, rtol=0)
    short, short_ran = kernels.attend(Call(q, k, v, scaling=0.3, bias=bias, band=table, window=39))
    assert short_ran == "cpu-flash-mask" and not torch.allclose(short, plain)
