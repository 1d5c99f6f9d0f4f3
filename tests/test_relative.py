"""Query-dependent relative schemes (Transformer-XL ``xl``, NEZHA ``nezha``): the kernel's chunked relative
logits against a plain computation (arbitrary positions, every dtype, gradients), memory linear in N,
the zero start, the decode-time table, the kernel checks, the CLI and a fine-tune with PoSE.
The test matrix (tests/test_matrix.py) covers every architecture against tests/reference.py."""

from __future__ import annotations

import pytest
import torch

import retrofit
from retrofit import kernels
from retrofit.kernels import Call, Relative, call, chunked
from retrofit.cli import main
from retrofit.errors import OptionError

from .tiny import NATIVE, TINY, ids


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
    pos = torch.arange(40) if positions == "slots" else torch.cat([torch.arange(10), torch.arange(60, 75), torch.arange(170, 185)])
    rel = Relative(rel_q, rel_keys, None if positions == "slots" else pos)
    out, path = kernels.attend(Call(q, k, v, scaling=0.35, relative=rel))
    assert path == "chunked"
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


def test_each_chunk_scores_its_own_distances_only(monkeypatch):
    """Memory linear in N: no (H, N, N) term; each chunk's per-distance logits span at most C + Tc - 1."""
    seen = []
    real = chunked.relative_logits

    def spy(rel_q, rel_keys, q_pos, k_pos, scaling, dtype):
        out = real(rel_q, rel_keys, q_pos, k_pos, scaling, dtype)
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
    assert retrofit.describe(model)["attention_path"] == "chunked"


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


@pytest.mark.parametrize("scheme,kernel_name", [("xl", "flex"), ("nezha", "cpu-flash-mask"), ("xl", "sdpa-alibi-dims"),
                                                ("rope", "cpu-flash-band")])
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
