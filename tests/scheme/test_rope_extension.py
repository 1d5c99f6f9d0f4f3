"""SelfExtend and STRING (options of the rope scheme): against attention written from the papers' position
matrices on transformers' own LLaMA, generate with cache against recompute, a left-padded batch against each
prompt alone, save and reload, the CLI, and the refusals."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AttentionInterface

import retrofit
from retrofit.cli import main
from retrofit.foundation.errors import OptionError, RetrofitError
from retrofit.patch.attention import Placement

from ..tiny import NATIVE, TINY, ids

LENGTH = 4 * NATIVE + 9  # past native: both views score


def _position_matrix(extension: str, opts: dict, T: int):
    """The papers' position pairs: (query position, key position) of each (i, j) for the far view, and where it
    applies. SelfExtend (Jin et al. 2024, eq. 3-4): d < w exact; else floor(i/G) + w - w/G and floor(j/G).
    STRING (An et al. 2024, eq. 5): d < S exact; else relative position d - S + W."""
    i, j = torch.arange(T)[:, None].double(), torch.arange(T)[None, :].double()
    d = i - j
    if extension == "self_extend":
        G, w = opts["group"], opts["window"]
        qp, kp = torch.floor(i / G) + w - w / G, torch.floor(j / G)
        return (qp - kp).expand(T, T), d >= w
    S, W = opts["shift"], opts["window"]
    return (d - S + W).expand(T, T), d >= S


def _reference(extension: str, opts: dict, inv_freq: torch.Tensor):
    """An attention function for transformers' own LLaMA (q and k come rotated at i and j): the far pairs'
    logits re-rotated by their position from the matrix above, one (i, j) at a time in float64, then a plain
    causal softmax."""

    def attend(module, q, k, v, mask, scaling=None, dropout=0.0, **kw):
        B, H, T, D = q.shape
        k, v = (x.repeat_interleave(H // x.shape[1], dim=1).double() for x in (k, v))
        q = q.double()
        rel, far = _position_matrix(extension, opts, T)
        near = q @ k.transpose(-1, -2)  # (B, H, T, T): relative position i - j, as rotated
        # the far logit with q, k unrotated: (R(a) q)^T (R(b) k) = (R(i) q)^T R((i - j) - (a - b)) (R(j) k)
        delta = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).double() - rel  # (T, T)
        ang = delta[..., None] * inv_freq.double()  # (T, T, D/2)
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)  # (T, T, D)
        k1, k2 = k.chunk(2, -1)
        rot_half = torch.cat([-k2, k1], -1)  # (B, H, T, D)
        # R(delta_ij) k_j for every pair: (B, H, T, T, D)
        rk = k[:, :, None] * cos + rot_half[:, :, None] * sin
        far_scores = (q[:, :, :, None, :] * rk).sum(-1)
        s = torch.where(far, far_scores, near) * (scaling or D**-0.5)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        out = s.softmax(-1) @ v
        return out.transpose(1, 2).float().contiguous(), None

    return attend


CASES = [
    ("self_extend", {"group": 4, "window": 8}),
    ("self_extend", {"group": 3, "window": 8}),  # G does not divide w: a fractional query position
    ("string", {"shift": 20, "window": 4}),
]


@pytest.mark.parametrize("kernel", ["auto", "chunked"])
@pytest.mark.parametrize("extension,opts", CASES, ids=["se-4-8", "se-3-8", "string-20-4"])
def test_equals_attention_written_from_the_papers_position_matrix(extension, opts, kernel):
    original = TINY["llama"]()
    inv_freq = original.model.rotary_emb.inv_freq.clone()
    name = f"ref_{extension}_{'_'.join(map(str, opts.values()))}"
    AttentionInterface.register(name, _reference(extension, opts, inv_freq))
    ref_model = copy.deepcopy(original)
    ref_model.config._attn_implementation = name
    model = retrofit.convert(original, "rope", extension=extension, kernel=kernel, **opts)
    x = ids(1, LENGTH)
    with torch.no_grad():
        ref = ref_model(x).logits
        out = model(x).logits
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    assert retrofit.describe(model)["last_kernel"] == ("cpu-flash-two-view" if kernel == "auto" else "chunked")
    retrofit.revert(model)
    with torch.no_grad():
        plain = model(x).logits
    assert (plain - ref).abs().max() > 1e-3  # the far view changes what the plain rotation gives


@pytest.mark.parametrize(
    "model_type,extension",
    [
        ("llama", "self_extend"),
        ("llama", "string"),
        ("gpt_neox", "self_extend"),
        ("gptj", "string"),
        ("gpt2", "self_extend"),
    ],
    ids=["llama-se", "llama-string", "neox-partial-se", "gptj-interleaved-string", "gpt2-se"],
)
def test_cache_left_padding_and_save_reload(model_type, extension, tmp_path):
    """generate() with a cache equals recompute, a left-padded batch equals each prompt alone and save -> reload
    keeps the logits, past native, on a full rotation (llama), a partial one (gpt_neox), interleaved pairs (gptj)
    and a learned-absolute model given rope (gpt2)."""
    # the user's default kernel: the CPU flash kernel where it serves (no padding), the chunked kernel elsewhere
    model = retrofit.convert(TINY[model_type](), "rope", extension=extension, factor=4.0, kernel="auto")
    o = model.retrofit_positions.options
    assert o.window and (o.group or o.shift)  # defaults filled from factor x native
    # generate() with a cache equals recompute, past native
    x = ids(1, 3 * NATIVE)
    with torch.no_grad():
        full = model(x).logits
        out = model(x[:, : 2 * NATIVE], use_cache=True)
        steps, cache = [out.logits], out.past_key_values
        for t in range(2 * NATIVE, 3 * NATIVE):
            out = model(x[:, t : t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.past_key_values
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=2e-5, rtol=1e-4)
    # a left-padded batch equals each prompt alone (SelfExtend's groups read absolute positions)
    prompts = [ids(1, 3 * NATIVE + 5, seed=1), ids(1, 2 * NATIVE - 3, seed=2)]
    width = prompts[0].shape[1]
    batch, mask = torch.zeros(2, width, dtype=torch.long), torch.zeros(2, width, dtype=torch.long)
    for r, p in enumerate(prompts):
        batch[r, width - p.shape[1] :], mask[r, width - p.shape[1] :] = p[0], 1
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        together = model.generate(batch, attention_mask=mask, **kw)
        for r, p in enumerate(prompts):
            alone = model.generate(p, attention_mask=torch.ones_like(p), **kw)
            assert torch.equal(together.sequences[r, width:], alone.sequences[0, p.shape[1] :])
            torch.testing.assert_close(
                torch.stack(together.logits)[:, r], torch.stack(alone.logits)[:, 0], atol=1e-4, rtol=1e-3
            )
        cached = model.generate(prompts[0], max_new_tokens=5, do_sample=False, pad_token_id=0, use_cache=True)
        plain = model.generate(prompts[0], max_new_tokens=5, do_sample=False, pad_token_id=0, use_cache=False)
    assert torch.equal(cached, plain)
    # save -> reload: the same options and logits
    retrofit.save(model, tmp_path / "m")
    back = retrofit.load(tmp_path / "m")
    assert back.retrofit_positions.options == o
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, full)


def test_defaults_follow_the_papers_and_the_length_served():
    se = retrofit.convert(TINY["llama"](), "rope", extension="self_extend", factor=2.0).retrofit_positions.options
    assert (se.window, se.group) == (NATIVE // 4, 3)  # (32 - 8) * 3 + 8 = 80 >= 64 > (32 - 8) * 2 + 8
    st = retrofit.convert(TINY["llama"](), "rope", extension="string").retrofit_positions.options
    assert (st.shift, st.window) == (int(0.33 * NATIVE), NATIVE // 8)  # the paper's 0.33 of the length served
    st2 = retrofit.convert(TINY["llama"](), "rope", extension="string", factor=2.0).retrofit_positions.options
    assert st2.shift == NATIVE - NATIVE // 8  # 2x: the near view kept within native (the far one then reads W past)
    st3 = retrofit.convert(TINY["llama"](), "rope", extension="string", factor=1.5).retrofit_positions.options
    assert st3.shift == NATIVE // 2 + NATIVE // 8  # both views within native


@pytest.mark.parametrize(
    "opts,words",
    [
        ({"extension": "string", "group": 2}, "group"),
        ({"extension": "self_extend", "shift": 4}, "shift"),
        ({"extension": "self_extend", "scaling": "yarn", "factor": 2.0}, "replaces rescaling"),
        ({"group": 4}, "need extension"),
        ({"extension": "string", "shift": 4, "window": 8}, "window < shift"),
        ({"extension": "self_extend", "window": NATIVE}, "window"),
    ],
)
def test_bad_options_are_refused_by_name(opts, words):
    with pytest.raises(OptionError, match=words):
        retrofit.convert(TINY["llama"](), "rope", **opts)


def test_a_forced_single_view_kernel_is_refused_at_convert():
    with pytest.raises(RuntimeError, match="second rotary view"):
        retrofit.convert(TINY["llama"](), "rope", extension="string", factor=2.0, kernel="sdpa")


def test_the_cli_converts_with_the_extension(tmp_path, capsys):
    src = tmp_path / "src"
    TINY["llama"]().save_pretrained(src)
    out = tmp_path / "out"
    args = ["convert", str(src), "--to", "rope", "--option", "extension=self_extend", "--option", "factor=2"]
    assert main([*args, "--out", str(out)]) == 0
    back = retrofit.load(out)
    assert back.retrofit_positions.options.extension == "self_extend"
    assert back.retrofit_positions.options.group == 3


def test_training_positions_are_refused():
    model = retrofit.convert(TINY["llama"](), "rope", extension="string", factor=2.0)
    state = model._retrofit_state
    state.placement = Placement(positions=torch.arange(3 * NATIVE) * 2)
    with pytest.raises(RetrofitError, match="training-free"):
        model(ids(1, 3 * NATIVE))


def test_the_native_export_refuses_by_name(tmp_path):
    from retrofit.native_export import export

    model = retrofit.convert(TINY["llama"](), "rope", extension="string", factor=2.0)
    with pytest.raises(RetrofitError, match="extension 'string'"):
        export(model, tmp_path / "n", native=True)


def test_mla_with_narrower_values_runs_through_the_chunked_kernel():
    """DeepSeek's values are narrower than its queries and keys (v_head_dim < qk width): the CPU flash op takes
    equal widths only, so the user's default kernel sends such calls to the chunked kernel."""
    import transformers as tf

    from ..adapters.test_structure import MLA, tiny

    model = tiny(tf.DeepseekV3Config, tf.DeepseekV3ForCausalLM, {**MLA, "v_head_dim": 12})
    retrofit.convert(model, "rope", extension="string", factor=4.0, kernel="auto")
    with torch.no_grad():
        out = model(ids(1, 3 * NATIVE)).logits
    assert torch.isfinite(out).all() and retrofit.describe(model)["last_kernel"] == "chunked"


def test_a_sliding_window_layer_keeps_its_exact_positions():
    """A layer that reads at most its window never reaches past native: no far view there (gemma2's local
    layers, Mistral's window), so its logits within the window are the plain rotation's."""
    plain = TINY["mistral"]()
    plain.config.sliding_window = NATIVE // 2
    x = ids(1, 3 * NATIVE)
    ext = copy.deepcopy(plain)
    retrofit.convert(plain, "rope")
    retrofit.convert(ext, "rope", extension="self_extend", window=4, group=2)
    with torch.no_grad():
        torch.testing.assert_close(ext(x).logits, plain(x).logits)
