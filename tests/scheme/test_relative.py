"""Query-dependent relative schemes (Transformer-XL ``xl``, NEZHA ``nezha``): the kernel's chunked relative
logits against a plain computation (arbitrary positions, every dtype, gradients), memory linear in N,
the zero start, the decode-time table, the kernel checks, the CLI and a fine-tune with PoSE.
The test matrix (tests/adapters/test_matrix.py) covers every architecture against tests/reference.py."""

from __future__ import annotations

import pytest
import torch

import retrofit
from retrofit import kernels
from retrofit.cli import main
from retrofit.foundation.errors import OptionError
from retrofit.kernels import Call, Relative, call, chunked, cpu_flash, cpu_flash_band, sdpa_relative_dims
from retrofit.patch.conversion import set_kernel
from retrofit.scheme.sinusoidal import frequencies, sinusoids

from ..tiny import NATIVE, TINY, ids, train_step


def plain_relative(q, k, v, rel_q, rel_keys, positions, scaling, window=None):
    """softmax(q.k * s + rel_q[i] . rel_keys[pos_i - pos_j] * s) over causal keys, written out in float64."""
    q, k, v, rel_q, rel_keys = (t.double() for t in (q, k, v, rel_q, rel_keys))
    Tq, Tk = q.shape[-2], k.shape[-2]
    i, j = torch.arange(Tk - Tq, Tk)[:, None], torch.arange(Tk)[None, :]
    dist = (positions[i] - positions[j]).clamp(min=0)  # (Tq, Tk)
    keys = rel_keys.expand(q.shape[1], -1, -1)[:, dist]  # (H, Tq, Tk, D)
    scores = (q @ k.transpose(-1, -2) + torch.einsum("bhid,hijd->bhij", rel_q, keys)) * scaling
    allowed = (j <= i) & ((i - j < window) if window else True)
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v


def _inputs(B=2, H=3, T=40, D=8, n=200, seed=0, dtype=torch.float32, shared=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v, rel_q = (torch.randn(B, H, T, D, generator=g).to(dtype) for _ in range(4))
    rel_keys = torch.randn(1 if shared else H, n, D, generator=g).to(dtype)
    return q, k, v, rel_q, rel_keys


@pytest.mark.parametrize("positions", ["slots", "skips"])
@pytest.mark.parametrize("shared", [False, True])
def test_chunked_relative_logits_equal_the_plain_computation(monkeypatch, positions, shared):
    """Several chunks (a small chunk budget), consecutive slots and PoSE-like skips between positions."""
    monkeypatch.setattr(call, "CHUNK_ELEMENTS", 2 * 3 * 2 * 40 * 9)  # ~9 rows per chunk
    q, k, v, rel_q, rel_keys = _inputs(shared=shared)
    pos = (
        torch.arange(40)
        if positions == "slots"
        else torch.cat([torch.arange(10), torch.arange(60, 75), torch.arange(170, 185)])
    )
    rel = Relative(rel_q, rel_keys, None if positions == "slots" else pos)
    out, kernel = kernels.attend(Call(q, k, v, scaling=0.35, relative=rel))
    assert kernel == "chunked"
    torch.testing.assert_close(out.double(), plain_relative(q, k, v, rel_q, rel_keys, pos, 0.35), atol=1e-5, rtol=1e-5)


def test_relative_logits_with_a_window_and_a_cached_prefix():
    q, k, v, rel_q, rel_keys = _inputs(T=40)
    qs, rq = q[:, :, -7:], rel_q[:, :, -7:]  # 7 new queries over 40 keys (33 cached)
    out, _ = kernels.attend(Call(qs, k, v, scaling=0.35, q_start=33, window=12, relative=Relative(rq, rel_keys)))
    ref = plain_relative(qs, k, v, rq, rel_keys, torch.arange(40), 0.35, window=12)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,atol", [(torch.bfloat16, 3e-2), (torch.float16, 4e-3)])
def test_relative_logits_in_half_precision(dtype, atol):
    q, k, v, rel_q, rel_keys = _inputs(dtype=dtype)
    out, _ = kernels.attend(Call(q, k, v, scaling=0.35, relative=Relative(rel_q, rel_keys)))
    assert out.dtype == dtype
    ref = plain_relative(q, k, v, rel_q, rel_keys, torch.arange(40), 0.35)
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=atol)


def test_gradients_through_checkpointed_chunks_equal_the_plain_computation(monkeypatch):
    monkeypatch.setattr(call, "CHUNK_ELEMENTS", 2 * 3 * 2 * 40 * 9)
    leaves = [t.requires_grad_() for t in _inputs()]
    out, _ = kernels.attend(Call(*leaves[:3], scaling=0.35, relative=Relative(leaves[3], leaves[4])))
    grads = torch.autograd.grad(out.pow(2).sum(), leaves)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref = plain_relative(*ref_leaves, torch.arange(40), 0.35)
    ref_grads = torch.autograd.grad(ref.pow(2).sum(), ref_leaves)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double(), r, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_each_chunk_scores_its_own_distances_only(monkeypatch):
    """Memory linear in N: no (H, N, N) term; each chunk's per-distance logits span at most C + Tc - 1."""
    seen = []
    real = chunked.relative_logits

    def spy(rel_q, rel, q_pos, k_pos, scaling, dtype):
        out = real(rel_q, rel, q_pos, k_pos, scaling, dtype)
        seen.append((rel_q.shape[-2], len(k_pos), out.shape))
        return out

    monkeypatch.setattr(chunked, "relative_logits", spy)
    monkeypatch.setattr(call, "CHUNK_ELEMENTS", 1 << 18)
    N = 2048
    q, k, v, rel_q, rel_keys = _inputs(B=1, H=2, T=N, D=4, n=N)
    kernels.attend(Call(q, k, v, scaling=0.5, relative=Relative(rel_q, rel_keys)))
    assert len(seen) > 8 and max(c for c, _, _ in seen) * N * 2 * 2 <= 1 << 18
    assert all(shape == (1, 2, c, tc) for c, tc, shape in seen)


def test_xl_starts_as_the_content_term_alone_and_its_terms_are_live():
    """init zero: W_R, u, v = 0, so xl equals nope; moving u or W_R changes the logits."""
    x = ids(1, 3 * NATIVE)
    with torch.no_grad():
        torch.manual_seed(0)
        nope = retrofit.convert(TINY["gpt2"](), "nope")(x).logits
        torch.manual_seed(0)
        model = retrofit.convert(TINY["gpt2"](), "xl")
        torch.testing.assert_close(model(x).logits, nope)
        for name in ("u", "proj"):
            p = getattr(model.retrofit_positions, name)
            p.normal_(0, 0.5)
            assert not torch.allclose(model(x).logits, nope, atol=1e-3), f"{name} has no effect"
            p.zero_()
    assert retrofit.describe(model)["last_kernel"] == "chunked"


def test_xl_decode_table_is_rebuilt_when_the_projection_changes():
    """The inference cache of r = W_R R must follow W_R (an optimizer step, a load) and grow with the length."""
    model = retrofit.convert(TINY["llama"](), "xl", init="random").eval()
    s = model.retrofit_positions
    with torch.no_grad():
        first = s.relative_keys(0, 10, torch.float32, torch.device("cpu")).clone()
        longer = s.relative_keys(0, 50, torch.float32, torch.device("cpu"))
        torch.testing.assert_close(longer[:, :10], first)
        s.proj.mul_(2)
        torch.testing.assert_close(s.relative_keys(0, 10, torch.float32, torch.device("cpu")), 2 * first)


def test_generate_with_cache_equals_recompute_past_the_native_length():
    model = retrofit.convert(TINY["gpt2"](), "xl", init="random").eval()
    x = ids(1, NATIVE)
    with torch.no_grad():
        out = model.generate(x, max_new_tokens=2 * NATIVE, do_sample=False, use_cache=True)
        assert out.shape[1] == 3 * NATIVE
        full = model(out[:, :-1]).logits
    assert torch.equal(full[0, NATIVE - 1 :].argmax(-1), out[0, NATIVE:])


@pytest.mark.parametrize(
    "scheme,kernel_name",
    [("xl", "flex"), ("nezha", "cpu-flash-mask"), ("xl", "sdpa-alibi-dims"), ("rope", "cpu-flash-band")],
)
def test_a_kernel_that_cannot_serve_the_scheme_is_refused_at_convert(scheme, kernel_name):
    model = TINY["gpt2"]()
    with pytest.raises(OptionError, match=f"kernel '{kernel_name}'"):
        retrofit.convert(model, scheme, kernel=kernel_name)
    assert getattr(model, "_retrofit_state", None) is None  # nothing half-done


def test_nezha_clips_its_offsets():
    s = retrofit.convert(TINY["gpt2"](), "nezha", max_distance=5).retrofit_positions
    keys = s.relative_keys(0, 12, torch.float32, torch.device("cpu"))  # (1, 12, D)
    assert keys.shape[0] == 1 and torch.equal(keys[0, 5], keys[0, 11]) and not torch.equal(keys[0, 4], keys[0, 5])


def test_cli_converts_to_xl_and_the_checkpoint_reloads(tmp_path):
    src = tmp_path / "src"
    TINY["gpt2"]().save_pretrained(src)
    out = tmp_path / "xl"
    assert main(["convert", str(src), "--to", "xl", "--option", "init=random", "--out", str(out)]) == 0
    model = retrofit.load(out)
    assert retrofit.describe(model)["scheme"] == "xl" and model.retrofit_positions.options.init == "random"
    x = ids(1, 2 * NATIVE)
    again = retrofit.load(out)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, again(x).logits)


# The fused relative kernels (sdpa-relative-dims: Transformer-XL; cpu-flash-relative-band: NEZHA) against chunked.


def _xl_leaves(B=2, H=3, T=40, D=8, dim=6, seed=0):
    """q, k, v, the position query and W_R (H * D, dim), fp32 leaves."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, rel_q = (torch.randn(B, H, T, D, generator=g) for _ in range(4))
    return [t.requires_grad_() for t in (q, k, v, rel_q, torch.randn(H * D, dim, generator=g) * 0.5)]


def _xl_relative(rel_q, W, n, positions=None):
    """Transformer-XL's term: keys r_d = W_R R(d) per head, with its factorisation."""
    H, D = rel_q.shape[1], rel_q.shape[-1]
    dim = W.shape[-1]
    keys = (sinusoids(torch.arange(n), dim) @ W.float().T).to(W.dtype).view(n, H, D).transpose(0, 1)
    return Relative(rel_q, keys, positions, sinusoid=(W.view(H, D, dim), frequencies(dim, 10000.0)))


def _nezha_table(H, n, K, D, shared):
    """A table flat from distance K on: NEZHA's clipped sinusoids (shared) or a random one per head."""
    d = torch.arange(n).clamp(max=K)
    return sinusoids(-d, D)[None] if shared else torch.randn(H, K + 1, D)[:, d]


def _same_as_chunked(kernel_name, call_of, leaves, atol=1e-5):
    """The call on ``kernel_name`` and on chunked: the same output and gradients of every leaf."""
    results = []
    for name in (kernel_name, "chunked"):
        out, kernel = kernels.attend(call_of(), name)
        assert kernel == name
        results.append((out, torch.autograd.grad(out.pow(2).sum(), leaves)))
    (out, grads), (ref, ref_grads) = results
    torch.testing.assert_close(out, ref, atol=atol, rtol=1e-4)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=atol, rtol=1e-4)


PADDING = torch.ones(2, 40, dtype=torch.bool).index_fill_(1, torch.arange(6), False)  # row 0: 6 pads on the left
PADDING[1] = True


@pytest.mark.parametrize(
    "case", ["full", "full in blocks", "padding", "window", "prefix", "decode", "prefix+window+padding", "positions"]
)
def test_xl_dims_kernel_equals_chunked(monkeypatch, case):
    """Forward and gradients of q, k, v, the position query and W_R; the window and padding cases in
    several blocks of queries (a small chunk budget); the full square's backward in one block of queries, or in
    blocks of 16 (the last one short)."""
    monkeypatch.setattr(call, "CHUNK_ELEMENTS", 3 * 40 * 9)
    if case == "full in blocks":
        monkeypatch.setattr(sdpa_relative_dims, "ROWS", 16)
    leaves = _xl_leaves()
    q, k, v, rel_q, W = leaves
    start = {"prefix": 33, "decode": 39, "prefix+window+padding": 30}.get(case, 0)
    pos = torch.cat([torch.arange(10), torch.arange(60, 75), torch.arange(170, 185)]) if case == "positions" else None
    n = 185 if pos is not None else 40

    def call_of():
        rel = _xl_relative(rel_q[:, :, start:], W, n, pos)
        return Call(
            q[:, :, start:],
            k,
            v,
            scaling=0.35,
            q_start=start,
            relative=rel,
            key_padding=PADDING if "padding" in case else None,
            window=12 if "window" in case else None,
        )

    _same_as_chunked("sdpa-relative-dims", call_of, leaves)


def test_xl_dims_kernel_in_half_precision():
    q, k, v, rel_q, W = (t.detach().to(torch.bfloat16) for t in _xl_leaves())
    rel = _xl_relative(rel_q, W, 40)
    out, _ = kernels.attend(Call(q, k, v, scaling=0.35, relative=rel), "sdpa-relative-dims")
    ref = plain_relative(q, k, v, rel_q, rel.keys, torch.arange(40), 0.35)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("rows,K,T", [(4, 5, 40), (128, 64, 300), (8, 10, 100), (8, 10, 11)])
def test_nezha_band_kernel_equals_chunked(monkeypatch, shared, rows, K, T):
    """Forward and gradients of q, k, v and the position query (as NEZHA: the query itself, and apart), with
    blocks of ``rows`` queries: the first blocks alone, the rest batched; a reach of a block or several."""
    monkeypatch.setattr(cpu_flash_band, "ROWS", rows)
    leaves = [t.requires_grad_() for t in _inputs(T=T)[:4]]
    q, k, v, rel_q = leaves
    table = _nezha_table(3, T, K, 8, shared)
    for rq, used in ((q, leaves[:3]), (rel_q, leaves)):
        _same_as_chunked(
            "cpu-flash-relative-band", lambda: Call(q, k, v, scaling=0.35, relative=Relative(rq, table, reach=K)), used
        )


def test_auto_takes_the_fused_relative_kernels_where_they_serve():
    xl = _xl_leaves()
    q, k, v, rel_q, W = (t.detach() for t in xl)
    table = _nezha_table(1, 40, 5, 8, True)

    def xl_call(s=0, **kw):
        return Call(
            q[:, :, s:],
            k,
            v,
            scaling=0.35,
            q_start=s,  # noqa: E731
            relative=_xl_relative(rel_q[:, :, s:], W, 40),
            **kw,
        )

    def nezha_call(s=0, keys=table, K=5, **kw):
        return Call(
            q[:, :, s:],
            k,
            v,
            scaling=0.35,
            q_start=s,  # noqa: E731
            relative=Relative(q[:, :, s:], keys, reach=K),
            **kw,
        )

    assert kernels.choose(xl_call()).name == "sdpa-relative-dims"
    assert kernels.choose(xl_call(20, key_padding=PADDING, window=12)).name == "sdpa-relative-dims"
    assert kernels.choose(xl_call(39)).name == "chunked"  # a decoding step: the cache's dims every step cost more
    assert kernels.choose(xl_call(dropout=0.1)).name == "sdpa-relative-dims"
    assert kernels.choose(nezha_call()).name == "cpu-flash-relative-band"
    for refused in (
        nezha_call(30),
        nezha_call(key_padding=PADDING),
        nezha_call(window=12),
        nezha_call(dropout=0.1),
        nezha_call(keys=_nezha_table(1, 40, 45, 8, True), K=45),  # no key past the reach
        Call(q, k, v, scaling=0.35, relative=Relative(q, table, torch.arange(40), reach=5)),
    ):
        assert kernels.choose(refused).name == "chunked"
    with torch.enable_grad():
        learned = table.clone().requires_grad_()  # a table needing a gradient per distance
        assert kernels.choose(nezha_call(keys=learned)).name == "chunked"


@pytest.fixture
def fresh_narrow_tables():
    """The XL kernel's kept tables emptied before and after (a test that patches ``compressed`` leaves none)."""
    sdpa_relative_dims._narrow.cache_clear()
    yield
    sdpa_relative_dims._narrow.cache_clear()


def test_xl_angles_table_compressed_to_fp32_rounding():
    """Over 512 positions the keys' sines and cosines (64 dims) hold in fewer directions: every row within half an
    ulp of 1 in fp32 (2^-24), a width of a multiple of 8; never in float64 (no rounding to hide it in), nor where
    no fewer dims hold it (a long span of positions)."""
    freqs = frequencies(64, 10000.0)
    for pos in (torch.arange(512), torch.arange(512) + 100_000, torch.cat([torch.arange(200), torch.arange(312)])):
        table = sdpa_relative_dims._table(freqs, pos, torch.float64)
        basis = sdpa_relative_dims.compressed(table, torch.float32)
        assert basis is not None and basis.shape[1] % 8 == 0 and basis.shape[1] < 64
        assert float((table @ basis @ basis.T - table).norm(dim=-1).max()) <= 2**-24
        assert sdpa_relative_dims.compressed(table, torch.float64) is None
    wide = sdpa_relative_dims._table(freqs, torch.arange(20_000), torch.float64)
    assert sdpa_relative_dims.compressed(wide, torch.float32) is None


def test_xl_compression_keeps_the_fewest_steps_whose_rows_hold_to_fp32_rounding():
    """A table whose singular values straddle 2^-24 at a step: a row moving 1.1 x 2^-24 must stay (r = 32, not 24),
    rows moving 0.9-0.6 x 2^-24 may go (r = 32, not 40). Distinct values: each direction is one row's."""
    small = [1.1, *torch.linspace(0.9, 0.6, 8).tolist()]  # in units of 2^-24
    s = torch.tensor([1.0] * 24 + [x * 2**-24 for x in small] + [0.0] * 31, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    table = torch.diag(s) @ q.T  # (64, 64): row k moves by s_k once direction k goes
    assert sdpa_relative_dims.compressed(table, torch.float32).shape == (64, 32)


@pytest.mark.parametrize("placed", [False, True])
def test_xl_square_on_a_compressed_table_is_as_exact_as_at_full_width(monkeypatch, fresh_narrow_tables, placed):
    """The causal square on the narrower table (live: q's width below D + dim) at positions 0 .. N - 1: its output
    and every gradient as close to float64's (chunked) as the square at full width is (within float noise of it, no
    further). At given positions (PoSE) the square keeps the full width (no SVD a call)."""
    widths, real = [], sdpa_relative_dims._CausalSquare.forward

    def spy(ctx, qx, *rest):
        widths.append(qx.shape[-1])
        return real(ctx, qx, *rest)

    monkeypatch.setattr(sdpa_relative_dims._CausalSquare, "forward", staticmethod(spy))
    pos = torch.cat([torch.arange(300), torch.arange(212)]) if placed else None
    n = 300 if placed else 512

    def run(kernel, leaves):
        q, k, v, rel_q, W = leaves
        out, _ = kernels.attend(Call(q, k, v, scaling=0.35, relative=_xl_relative(rel_q, W, n, pos)), kernel)
        return [out, *torch.autograd.grad(out.pow(2).sum(), leaves)]

    leaves = _xl_leaves(B=1, H=2, T=512, D=8, dim=64)
    ref = run("chunked", [t.detach().double().requires_grad_() for t in leaves])
    narrow = run("sdpa-relative-dims", leaves)
    assert widths == [8 + 64] if placed else widths and all(w < 8 + 64 for w in widths)
    sdpa_relative_dims._narrow.cache_clear()
    monkeypatch.setattr(sdpa_relative_dims, "compressed", lambda table, dtype: None)
    full = run("sdpa-relative-dims", leaves)
    assert widths[-1] == 8 + 64
    for a, b, r in zip(narrow, full, ref):
        assert float((a.double() - r).abs().max()) <= 2 * float((b.double() - r).abs().max()) + 1e-7


def test_the_fused_relative_kernels_hold_no_n_by_n_tensor(monkeypatch):
    """Memory linear in N: the dims kernel runs the causal square in blocks of queries (forward and backward, no
    mask); the band kernel's masks span a window of keys per block (never every key)."""
    N = 1024
    masks, blocks = [], []
    real_forward, real_blocks = cpu_flash.forward, sdpa_relative_dims._blocks

    def spy(q, k, v, scaling, mask=None, causal=True):
        masks.append(None if mask is None else tuple(mask.shape))
        return real_forward(q, k, v, scaling, mask, causal)

    def spy_blocks(k, angles, qx):
        for h, s, e, kx in real_blocks(k, angles, qx):
            blocks.append((h.stop - h.start, e - s, kx.shape[-2]))
            yield h, s, e, kx

    monkeypatch.setattr(cpu_flash, "forward", spy)
    monkeypatch.setattr(sdpa_relative_dims, "_blocks", spy_blocks)
    leaves = _xl_leaves(B=1, H=2, T=N, D=4, dim=4)
    q, k, v, rel_q, W = leaves
    out, kernel = kernels.attend(Call(q, k, v, scaling=0.5, relative=_xl_relative(rel_q, W, N)))
    out.sum().backward()
    assert kernel == "sdpa-relative-dims" and masks == []  # no mask, no flash op: the square's own blocks
    assert len(blocks) == 2 * N // sdpa_relative_dims.ROWS  # forward and backward, each block once
    assert max(rows for _, rows, _ in blocks) == sdpa_relative_dims.ROWS < N  # a block's scores: ROWS x keys
    kernels.attend(Call(q, k, v, scaling=0.5, relative=Relative(q, _nezha_table(1, N, 64, 4, True), reach=64)))
    assert masks and all(m is None or m[-1] * m[-2] <= 128 * 256 for m in masks)


@pytest.mark.parametrize(
    "scheme,options,kernel",
    [
        ("xl", {"init": "random", "dim": 6}, "sdpa-relative-dims"),
        ("nezha", {"max_distance": 8}, "cpu-flash-relative-band"),
    ],
)
@pytest.mark.slow
def test_a_converted_model_trains_on_the_fused_relative_kernel_and_matches_chunked(
    user_kernel, scheme, options, kernel
):
    """Loss and every parameter's gradient (xl's u, v, W_R included) equal chunked's; generate with the
    cache equals recompute on auto."""
    torch.manual_seed(0)
    model = retrofit.convert(TINY["gpt2"](), scheme, **options)
    x = ids(2, 70)

    def step(kernel_name):
        return *train_step(model, kernel_name, x), set(retrofit.patch.conversion._state(model).kernels)

    loss_f, grads_f, kernels_f = step("auto")
    assert retrofit.describe(model)["last_kernel"] == kernel
    retrofit.patch.conversion._state(model).kernels.clear()
    loss_c, grads_c, kernels_c = step("chunked")
    assert kernels_f >= {kernel} and kernels_c == {"chunked"}
    torch.testing.assert_close(loss_f, loss_c, atol=1e-6, rtol=1e-6)
    assert grads_f.keys() == grads_c.keys()
    if scheme == "xl":
        assert {"retrofit_positions.u", "retrofit_positions.v", "retrofit_positions.proj"} <= grads_f.keys()
    for n in grads_c:
        torch.testing.assert_close(grads_f[n], grads_c[n], atol=1e-5, rtol=1e-4, msg=n)
    set_kernel(model, "auto")
    prompt = ids(1, NATIVE)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=NATIVE, do_sample=False, use_cache=True)
        full = model(out[:, :-1]).logits
    assert retrofit.describe(model)["last_kernel"] == kernel  # the recompute: full causal attention
    assert torch.equal(full[0, NATIVE - 1 :].argmax(-1), out[0, NATIVE:])
