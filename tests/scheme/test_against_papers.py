"""The full menu (issue 3): each scheme against its paper or a transformers oracle, each new adapter
against the unconverted model with the native mechanism edited by hand, and the learned parameters
as ordinary parameters (optimizer, save/load, PEFT). The architecture x scheme matrix is test_matrix.py."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.distilbert.modeling_distilbert import create_sinusoidal_embeddings
from transformers.models.t5.modeling_t5 import T5Attention

import retrofit
from retrofit.scheme import ModelSpec
from retrofit.scheme.alibi import alibi_slopes
from retrofit.scheme.fire import FIRE
from retrofit.scheme.shaw import ShawClipped
from retrofit.scheme.sinusoidal import Sinusoidal
from retrofit.scheme.t5 import T5Buckets

from ..tiny import NATIVE, TINY, ids

SPEC = ModelSpec(
    num_layers=2,
    num_heads=8,
    num_kv_heads=8,
    head_dim=16,
    hidden_size=128,
    native_length=64,
    native_kind="learned_absolute",
    embedding_rms=0.02,
)
H = SPEC.num_heads


def make(cls, **options):
    return cls(SPEC, cls.parse_options(SPEC, options))


def grid(n, start=0):
    """Broadcast index tensors as the chunked kernel passes them: h (H,1,1), q (1,n,1), k (1,1,n)."""
    pos = torch.arange(start, start + n)
    return torch.arange(H)[:, None, None], pos[None, :, None], pos[None, None, :]


def causal(n):
    return (torch.arange(n)[:, None] >= torch.arange(n)[None, :]).expand(H, n, n)


def alibi_bias(n, start=0):
    h, q, k = grid(n, start)
    return -torch.tensor(alibi_slopes(H))[:, None, None] * (q - k).float()


# ---------------------------------------------------------------------------------------------
# T5 buckets
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (8, 20), (33, 500)])
def test_t5_buckets_match_transformers(num_buckets, max_distance):
    s = make(T5Buckets, num_buckets=num_buckets, max_distance=max_distance)
    i = torch.arange(0, 3000)[:, None]
    j = torch.tensor([0, 1, 5, 17, 2999])[None, :]
    oracle = T5Attention._relative_position_bucket(
        j - i, bidirectional=False, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(s.bucket(i - j), oracle)


def test_t5_bias_is_a_gather_and_starts_close_to_alibi():
    s = make(T5Buckets)  # 32 buckets, max_distance 128
    h, q, k = grid(200)
    b = s.bias(1, h, q, k)  # (H, 200, 200)
    bucket = T5Attention._relative_position_bucket(k - q, bidirectional=False, num_buckets=32, max_distance=128)[0]
    assert torch.equal(b, s.table[1][:, bucket])
    # 0-d tensors (FlexAttention's score_mod) give the same value
    assert torch.equal(s.bias(1, torch.tensor(3), torch.tensor(150), torch.tensor(7)), b[3, 150, 7])
    # exact buckets (offsets < 16) are ALiBi exactly; larger offsets keep the recency ordering
    alibi = alibi_bias(200)
    near = causal(200) & ((q - k) < 16)
    torch.testing.assert_close(b[near], alibi[near].float())
    row = b[:, 199, :].flip(-1)  # offsets 0..199 from the last query
    assert (row[:, 1:] <= row[:, :-1] + 1e-6).all(), "bias must not increase with distance"
    # each bucket's value is -slope x (the mean offset in the bucket) within max_distance
    d = torch.arange(129)
    bd = T5Attention._relative_position_bucket(-d, bidirectional=False, num_buckets=32, max_distance=128)
    for bucket_id in bd.unique().tolist():  # over buckets (test only)
        mean = d[bd == bucket_id].double().mean()
        torch.testing.assert_close(s.table[0, :, bucket_id].double(), -torch.tensor(alibi_slopes(H)).double() * mean)
    assert make(T5Buckets, init="zero").table.abs().sum() == 0


def test_t5_parameter_count_is_independent_of_length():
    assert make(T5Buckets).table.shape == (2, H, 32)
    assert make(T5Buckets, per_layer=False).table.shape == (1, H, 32)


# ---------------------------------------------------------------------------------------------
# Shaw clipped offsets
# ---------------------------------------------------------------------------------------------
def test_shaw_matches_the_paper_and_starts_as_clipped_alibi():
    k_clip = 20
    s = make(ShawClipped, max_distance=k_clip)
    with torch.no_grad():
        s.table.copy_(torch.randn_like(s.table))
    h, q, k = grid(60)
    b = s.bias(0, h, q, k)
    # paper: a_ij = w[clip(j - i, -k, k)], w indexed -k..k; our table stores w[0], w[-1], ..., w[-k]
    w = torch.cat([s.table[0].flip(-1), torch.zeros(H, k_clip)], -1)  # (H, 2k+1): w[-k..0], then (unused) w[1..k]
    paper = w[:, (k - q)[0].clamp(-k_clip, k_clip) + k_clip]  # (H, 60, 60)
    m = causal(60)
    assert torch.equal(b[m], paper.expand(H, 60, 60)[m])
    fresh = make(ShawClipped, max_distance=k_clip)
    b = fresh.bias(0, h, q, k)
    alibi = alibi_bias(60)
    near = m & ((q - k) <= k_clip)
    torch.testing.assert_close(b[near], alibi[near].float())
    far = m & ((q - k) > k_clip)
    torch.testing.assert_close(
        b[far], (-torch.tensor(alibi_slopes(H)).float()[:, None, None] * k_clip).expand(H, 60, 60)[far]
    )
    assert fresh.bias(0, torch.tensor(2), torch.tensor(59), torch.tensor(0)) == b[2, 59, 0]


# ---------------------------------------------------------------------------------------------
# FIRE
# ---------------------------------------------------------------------------------------------
def fire_paper(s, li, n):
    """The paper's appendix code (Li et al., 2023), with the scheme's parameters as its nn.Linear weights."""
    mlp = torch.nn.Sequential(torch.nn.Linear(1, s.options.width), torch.nn.ReLU(), torch.nn.Linear(s.options.width, H))
    with torch.no_grad():
        mlp[0].weight.copy_(s.w1[li][:, None]), mlp[0].bias.copy_(s.b1[li])
        mlp[2].weight.copy_(s.w2[li]), mlp[2].bias.copy_(s.b2[li])
    positions = torch.arange(n, dtype=torch.float)
    rel_distance = positions[:, None] - positions[None, :]
    threshold = (
        torch.abs(s.threshold_scale[li] * s.options.threshold)
        if s.options.learned_threshold
        else torch.tensor(float(s.options.threshold))
    )
    pos_normalizer = torch.max(positions, threshold)[:, None]
    rel_distance = torch.log(torch.abs(s.c[li] * rel_distance) + 1)
    pos_normalizer = torch.log(torch.abs(s.c[li] * pos_normalizer) + 1) + 1e-6
    return mlp((rel_distance / pos_normalizer).unsqueeze(-1)).permute(2, 0, 1)  # (H, n, n)


@pytest.mark.parametrize("learned_threshold", [True, False])
def test_fire_matches_the_paper(learned_threshold):
    s = make(FIRE, init="random", learned_threshold=learned_threshold)
    with torch.no_grad():
        s.c.fill_(0.3)
        if learned_threshold:
            s.threshold_scale.fill_(0.7)
    n = 3 * SPEC.native_length  # past the threshold: the normaliser grows with the query position
    b = s.bias(1, *grid(n))
    m = causal(n)
    paper = fire_paper(s, 1, n)
    torch.testing.assert_close(b[m], paper.detach()[m], atol=1e-5, rtol=1e-5)
    # the piecewise-linear evaluation has the MLP's gradients (c and the threshold included)
    weight = torch.randn(H, n, n) * m
    (gc,) = torch.autograd.grad((paper * weight).sum(), s.c)
    params = [s.c, s.w1, s.b1, s.w2, s.b2] + ([s.threshold_scale] if learned_threshold else [])
    ours = torch.autograd.grad((b * weight).sum(), params)
    torch.testing.assert_close(ours[0], gc, atol=1e-3, rtol=1e-4)
    assert all(g[1].abs().sum() > 0 for g in [(p, gp) for p, gp in zip(params, ours)])
    assert torch.allclose(s.bias(1, torch.tensor(5), torch.tensor(150), torch.tensor(20)), b[5, 150, 20], atol=1e-6)


def test_fire_starts_close_to_alibi_and_learns_its_threshold():
    s = make(FIRE)  # threshold = native length (64)
    n = SPEC.native_length
    b = s.bias(0, *grid(n))
    m = causal(n)
    err = (b - alibi_bias(n))[m].abs()
    assert err.max() < 0.01, f"FIRE init is {err.max():.4f} from ALiBi (whose bias reaches {alibi_slopes(H)[0] * n})"
    # beyond the threshold FIRE interpolates: bounded by the value at the threshold, still monotone in distance
    far = s.bias(0, *grid(4 * n))[:, -1, :].flip(-1)  # (H, offsets 0..4n-1)
    assert (far[:, 1:] <= far[:, :-1] + 1e-4).all()
    assert (far.min(-1).values >= s.mlp(0, torch.tensor(1.0)) - 1e-4).all(), (
        "bounded by f(1), the bias at the threshold"
    )
    b.sum().backward()
    assert all(p.grad is not None for p in (s.w1, s.w2, s.c))
    loss = s.bias(0, *grid(2 * n)).sum()  # queries past the threshold see it
    loss.backward()
    assert s.threshold_scale.grad is not None and s.threshold_scale.grad.abs().sum() > 0
    assert torch.equal(make(FIRE, init="random").w2, make(FIRE, init="random").w2), "init must be deterministic"


# ---------------------------------------------------------------------------------------------
# every bias is a valid FlexAttention score_mod (evaluated under vmap over b, h, q, kv)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls,options", [(T5Buckets, {}), (ShawClipped, {"max_distance": 8}), (FIRE, {})])
def test_bias_works_as_a_score_mod(cls, options):
    from torch.nn.attention.flex_attention import _vmap_for_bhqkv

    s = make(cls, **options)
    score_mod = lambda score, b, h, q, kv: score + s.bias(1, h, q, kv)  # noqa: E731
    fn = _vmap_for_bhqkv(score_mod, prefix=(0,))
    n = 40
    with torch.no_grad():
        out = fn(torch.zeros(1, H, n, n), torch.arange(1), torch.arange(H), torch.arange(n), torch.arange(n))
        ref = s.bias(1, *grid(n))
    m = causal(n)
    torch.testing.assert_close(out[0][m], ref[m], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# sinusoidal and NoPE
# ---------------------------------------------------------------------------------------------
def test_sinusoids_match_transformers_and_default_scale():
    s = make(Sinusoidal)
    table = torch.empty(300, SPEC.hidden_size)
    create_sinusoidal_embeddings(300, SPEC.hidden_size, table)  # DistilBERT's: sin on even, cos on odd dims
    torch.testing.assert_close(
        s.embed(torch.arange(300)[None], torch.float32)[0], table * s.options.scale, atol=2e-5, rtol=0
    )
    assert math.isclose(s.options.scale, math.sqrt(2) * 0.02)
    rms = s.embed(torch.arange(4096)[None], torch.float32).pow(2).mean().sqrt()
    assert abs(rms - 0.02) < 2e-3, "default scale: the sinusoids' RMS equals the token embeddings'"
    assert make(Sinusoidal, scale=1.0).options.scale == 1.0


@pytest.mark.parametrize(
    "model_type,table",
    [("gpt2", "transformer.wpe"), ("gpt_neo", "transformer.wpe"), ("opt", "model.decoder.embed_positions")],
)
def test_position_table_families_equal_a_hand_edited_table(model_type, table):
    """sinusoidal == the unconverted model with its table rows set to the sinusoids (OPT: row p + 2 = PE(p));
    nope == the unconverted model with a zero table. Checks the offset, GPT-Neo's window and unscaled scores."""
    x = ids(2, NATIVE - 4)
    for scheme in ("sinusoidal", "nope"):
        model, edited = TINY[model_type](), TINY[model_type]()
        edited.load_state_dict(model.state_dict())
        retrofit.convert(model, scheme)
        weight = edited.get_submodule(table).weight
        offset = weight.shape[0] - NATIVE
        with torch.no_grad():
            if scheme == "nope":
                weight.zero_()
            else:
                weight[offset:] = model.retrofit_positions.embed(torch.arange(NATIVE)[None], weight.dtype)[0]
            torch.testing.assert_close(model(x).logits, edited(x).logits, atol=2e-5, rtol=1e-4)


def test_gpt_neo_keeps_local_windows():
    model = TINY["gpt_neo"]()
    retrofit.convert(model, "alibi")
    windows = [blk.attn.attention._retrofit_layer.window for blk in model.transformer.h]
    assert windows == [None, model.config.window_size]


@pytest.mark.parametrize("model_type", ["llama", "gpt_neox"])
def test_rotary_families_add_sinusoids_to_the_token_embeddings(model_type):
    model = TINY[model_type]()
    retrofit.convert(model, "sinusoidal")
    x = ids(1, 20)
    pe = model.retrofit_positions.embed(torch.arange(20)[None], torch.float32)
    tokens = model.get_input_embeddings().weight[x]  # (1, 20, E), bypassing the hooked module
    with torch.no_grad():
        hooked = model(x).logits
        by_hand = model(inputs_embeds=tokens + pe).logits  # inputs_embeds skip the embedding module (and its hook)
        plain = model(inputs_embeds=tokens).logits
    torch.testing.assert_close(hooked, by_hand)
    assert not torch.allclose(hooked, plain, atol=1e-4)
    retrofit.revert(model)
    assert not model.get_input_embeddings()._forward_hooks


def test_absolute_positions_follow_position_ids():
    model = TINY["llama"]()
    retrofit.convert(model, "sinusoidal")
    x = ids(1, 10)
    with torch.no_grad():
        plain = model(x).logits
        shifted = model(x, position_ids=torch.arange(5, 15)[None]).logits
    assert not torch.allclose(plain, shifted, atol=1e-4), "explicit position_ids must be used"


def test_gpt_neox_partial_rotary():
    """rope with the model's own settings is the native model; nope removes the rotary from the rotated dims only."""
    model, native = TINY["gpt_neox"](), TINY["gpt_neox"]()
    native.load_state_dict(model.state_dict())
    x = ids(2, 24)
    retrofit.convert(model, "rope")
    assert model.retrofit_positions.rot_dim == 4  # rotary_pct 0.25 of 16
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, native(x).logits, atol=2e-5, rtol=1e-4)
        retrofit.convert(model, "nope", force=True)
        native.gpt_neox.rotary_emb.inv_freq.zero_()  # cos = 1, sin = 0 on the rotated dims
        torch.testing.assert_close(model(x).logits, native(x).logits, atol=2e-5, rtol=1e-4)
    assert retrofit.describe(model)["trainable_position_parameters"] == 0


# ---------------------------------------------------------------------------------------------
# learned parameters are ordinary parameters
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "scheme,names", [("t5", {"table"}), ("shaw", {"table"}), ("fire", {"w1", "b1", "w2", "b2", "c", "threshold_scale"})]
)
def test_learned_parameters_train_save_and_load(scheme, names, tmp_path):
    model = TINY["gpt2"]()
    retrofit.convert(model, scheme)
    params = {n.split(".", 1)[1]: p for n, p in model.named_parameters() if n.startswith("retrofit_positions.")}
    assert set(params) == names and all(p.requires_grad for p in params.values())
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = {n: p.detach().clone() for n, p in params.items()}
    x = ids(2, NATIVE)
    model(x, labels=x).loss.backward()
    opt.step()
    assert any(not torch.equal(before[n], p) for n, p in params.items()), "the optimizer must reach the scheme"
    with torch.no_grad():
        logits = model(x).logits
    retrofit.save(model, tmp_path / "m")
    loaded = retrofit.load(tmp_path / "m")
    for n, p in loaded.retrofit_positions.named_parameters():
        assert torch.equal(p, params[n])
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, logits)


def test_peft_modules_to_save_trains_the_scheme():
    peft = pytest.importorskip("peft")
    model = TINY["llama"]()
    retrofit.convert(model, "t5")
    cfg = peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"], modules_to_save=["retrofit_positions"])
    pm = peft.get_peft_model(model, cfg)
    trainable = {n for n, p in pm.named_parameters() if p.requires_grad}
    assert any("retrofit_positions" in n and n.endswith("table") for n in trainable)
    x = ids(1, 16)
    pm(input_ids=x, labels=x).loss.backward()
    active = pm.base_model.model.retrofit_positions.modules_to_save["default"]
    assert active.table.grad is not None and active.table.grad.abs().sum() > 0
