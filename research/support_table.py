"""Write docs/support.md: every causal-LM model type of the installed transformers, tried as retrofit would
treat it. Each type is built as a tiny random model from its own config class (widths shrunk, layer
pattern kept), converted to ALiBi (the lossless probe runs first for a type claimed by its structure), given
the quick check (``quick_check``), and listed as converts, refused (with the reason the error gives), failed
(the check that failed) or not built tiny here.

    python research/support_table.py            # rewrites docs/support.md (a few minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import collections
import logging
import warnings
from pathlib import Path

import torch
import transformers as tf
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import retrofit
from harness import DOCS
from retrofit.adapters import ADAPTERS
from retrofit.foundation.errors import RetrofitError
from retrofit.models.builtin import TINY_LLAMA

SMALL = dict(
    vocab_size=128,
    **TINY_LLAMA,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    head_dim=16,
    moe_intermediate_size=32,
    num_local_experts=4,
    num_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    shared_expert_intermediate_size=32,
    qk_rope_head_dim=8,  # MLA (deepseek_v3 and kin): the split-off rotary part and the rest within the head
    qk_nope_head_dim=8,
    v_head_dim=16,
    kv_lora_rank=16,
    q_lora_rank=32,
)
PER_TYPE = {  # within the 16-dim head; mimo's rotary fraction 0.334 needs 24 dims for an even count
    "gptj": dict(rotary_dim=8),
    "codegen": dict(rotary_dim=8),
    "mimo_v2_flash": dict(head_dim=24, v_head_dim=24),
}
MAX_PARAMS = 15_000_000  # a config whose sizes did not shrink is not built


def tiny(model_type: str):
    """The type's model from its own config with SMALL's sizes, run once on 16 tokens; where that config
    refuses them or the model cannot run itself, again with its own layer count (a layer pattern tied to it,
    e.g. GPT-Neo's attention_types, a hybrid's attention layers among recurrent ones)."""
    cls = getattr(tf, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    default = tf.AutoConfig.for_model(model_type)
    error = None
    for drop in ((), ("num_hidden_layers",)):
        fixed = {k for k in SMALL if isinstance(p := getattr(type(default), k, None), property) and p.fset is None}
        small = {k: v for k, v in SMALL.items() if hasattr(default, k) and k not in drop and k not in fixed}
        small["is_decoder"] = True  # a causal LM (BERT-style classes are bidirectional without it)
        if hasattr(default, "qk_rope_head_dim"):  # MLA: its head dims are the split parts', not head_dim, and
            small.pop("head_dim", None)  # its keys are expanded to every head (as its released configs state)
            small["num_key_value_heads"] = small["num_attention_heads"]
        try:
            cfg = tf.AutoConfig.for_model(model_type, **{**small, **PER_TYPE.get(model_type, {})})
            with torch.device("meta"):
                n = sum(p.numel() for p in cls(cfg).parameters())
            if n > MAX_PARAMS:
                raise ValueError(f"its config did not shrink ({n / 1e6:.0f}M parameters)")
            model = cls(cfg).eval()
            with torch.no_grad():
                model(torch.randint(3, 100, (1, 16)))  # a tiny model that cannot run itself is not tried
            return model
        except Exception as e:  # again with the type's own layer count (a hybrid's pattern of layers)
            error = error or e
    raise error


def quick_check(model, native: int) -> None:
    """The issue's quick check on a tiny model, ALiBi on the default kernel: the patch is live (logits within the
    native length change; a native-ALiBi family is given RoPE for this one check), it runs at 4x native, generates
    with its cache as without, a left-padded batch equals each prompt alone, save -> reload gives the same logits,
    and revert gives the original's back. Raises AssertionError naming the check that failed."""
    import tempfile

    g = torch.Generator().manual_seed(0)
    x = torch.randint(3, 100, (2, 4 * native), generator=g)
    short = x[:1, : native // 2]
    with torch.no_grad():
        before = model(short).logits
        own_alibi = retrofit.describe(model)["native"]["kind"] == "alibi"
        retrofit.convert(model, "rope" if own_alibi else "alibi")
        assert not torch.allclose(model(short).logits, before, atol=1e-4), "live: the logits did not change"
        if own_alibi:
            retrofit.revert(model)
            retrofit.convert(model, "alibi", scale_bias=True)  # (ALiBi again: scaled, so that it differs)
        assert torch.isfinite(model(x).logits).all(), "4x native: non-finite logits"
        kw = dict(max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        a, b = model.generate(short, use_cache=True, **kw), model.generate(short, use_cache=False, **kw)
        assert torch.equal(a.sequences, b.sequences), "generate: with the cache differs from without"
        assert torch.allclose(torch.stack(a.logits), torch.stack(b.logits), atol=1e-4), "generate: cache logits"
        ids, mask = x[:, :native].clone(), torch.ones(2, native, dtype=torch.long)
        ids[1, :5], mask[1, :5] = 0, 0
        batch, solo = model(ids, attention_mask=mask).logits, model(ids[1:, 5:]).logits
        assert torch.allclose(batch[1, 5:], solo[0], atol=1e-4), "left padding: the padded row differs from alone"
        out = model(x).logits
        with tempfile.TemporaryDirectory() as d:
            retrofit.save(model, d)
            try:
                back = retrofit.load(d)(x).logits
            except Exception as e:
                raise AssertionError(f"save -> reload: {type(e).__name__}: {str(e).splitlines()[0][:100]}") from e
            assert torch.allclose(back, out, atol=1e-5), "save -> reload changed the logits"
        retrofit.revert(model)
        assert torch.equal(model(short).logits, before), "revert: not the original's logits"


def row(model_type: str) -> tuple[str, str]:
    torch.manual_seed(0)  # the same tiny weights every run: the table's figures repeat
    try:
        model = tiny(model_type)
    except Exception as e:
        return "not built", f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    try:
        arch = None
        with torch.no_grad():
            retrofit.convert(model, "alibi")  # the probe first, for a type claimed by its structure
            arch = retrofit.describe(model)["architecture"]
            retrofit.revert(model)
        quick_check(model, min(64, retrofit.describe(model)["native"]["length"] or 64))
    except RetrofitError as e:
        return ("refused" if arch is None else "failed"), str(e).split("; supported:")[0][:240]
    except Exception as e:
        return "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    by = (
        "by type"
        if model_type in {t for _n, c in ADAPTERS.items() for t in c.model_types}
        else "by structure, probe passed"
    )
    return "converts", f"{arch} adapter, {by}, quick check passed"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(DOCS / "support.md"))
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    rows = {t: row(t) for t in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)}
    count = collections.Counter(s for s, _ in rows.values())
    lines = [
        "# Which models retrofit converts",
        "",
        f"Generated by `python research/support_table.py` with transformers {tf.__version__}: every causal-LM model "
        "type, built as a tiny random model from its own config class and converted to ALiBi. A type the suite "
        "does not test by name is claimed by its structure and converted only after the lossless probe "
        "(converted to its own mechanism, its logits came back within float noise); a difference that matters is "
        "refused by name. A type counts as converting only when it also passes the quick check: the patch is live, "
        "it runs at 4x native, generates with its cache as without, a left-padded batch equals each prompt alone, "
        "save -> reload gives the same logits and revert gives the original's back.",
        "",
        f"**{count['converts']} of {len(rows)} types convert**; {count['refused']} are refused with the reason; "
        f"{count['not built']} could not be built tiny here (untried, not claimed); {count['failed']} failed.",
        "",
        "| model type | status | detail |",
        "|---|---|---|",
        *(f"| `{t}` | {s} | {d.replace('|', '/')} |" for t, (s, d) in rows.items()),
        "",
    ]
    Path(a.out).write_text("\n".join(lines))
    print(f"{count['converts']} of {len(rows)} convert; wrote {a.out}")


if __name__ == "__main__":
    main()
