"""Native export: every mapping's exported folder loads with plain transformers and equals the patched model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import transformers as tf

import retrofit
from retrofit.foundation.errors import RetrofitError
from retrofit.foundation.run_folder import EXPORT_RECORD as EXPORT_FILE
from retrofit.native_export import TOLERANCE, per_head_qkv

from ..tiny import NATIVE, TINY, ids

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

LONG = 4 * NATIVE  # every check runs past the native length

# (architecture, scheme, options, expected target class)
CASES = [
    ("gpt2", "alibi", {"scale_bias": True}, "FalconForCausalLM"),
    ("gpt2", "rope", {}, "GPTNeoXForCausalLM"),
    ("gpt2", "rope", {"fraction": 0.25, "theta": 500.0, "scaling": "yarn", "factor": 2.0}, "GPTNeoXForCausalLM"),
    ("gpt2", "nope", {}, "GPT2LMHeadModel"),
    ("gpt2", "sinusoidal", {}, "GPT2LMHeadModel"),
    ("gpt_neo", "nope", {}, "GPTNeoForCausalLM"),
    ("opt", "sinusoidal", {}, "OPTForCausalLM"),
    ("llama", "rope", {"scaling": "linear", "factor": 2.0}, "LlamaForCausalLM"),
    ("llama", "rope", {"scaling": "yarn", "factor": 4.0}, "LlamaForCausalLM"),
    ("llama", "rope", {"scaling": "ntk", "factor": 4.0}, "LlamaForCausalLM"),
    ("llama", "rope", {"scaling": "dynamic", "factor": 2.0}, "LlamaForCausalLM"),
    ("qwen3", "rope", {"scaling": "yarn", "factor": 2.0}, "Qwen3ForCausalLM"),
    ("gpt_neox", "rope", {"scaling": "yarn", "factor": 2.0}, "GPTNeoXForCausalLM"),
]


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits


@pytest.mark.parametrize(
    "arch,scheme,options,target", CASES, ids=[f"{a}-{s}-{'-'.join(map(str, o.values()))}" for a, s, o, _ in CASES]
)
def test_export_equals_patched_model_past_native_length(tmp_path, arch, scheme, options, target):
    model = retrofit.convert(TINY[arch](), scheme, **options)
    result = retrofit.export(model, tmp_path / "out", native=True, max_length=LONG)
    assert result["target"] == target and result["exact"] and result["max_abs_logit_diff"] <= TOLERANCE
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "retrofit" not in cfg and "auto_map" not in cfg and cfg.get("_attn_implementation") != "retrofit"
    record = json.loads((tmp_path / "out" / EXPORT_FILE).read_text())
    assert (
        record["mapping"] == f"{retrofit.describe(model)['architecture']}+{scheme}"
        and record["versions"]["transformers"] == tf.__version__
    )
    plain = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(plain).__name__ == target
    x = ids(2, LONG, seed=1)
    assert torch.allclose(logits(plain, x), logits(model, x), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("arch,options", [("llama", {"scaling": "yarn", "factor": 4.0}), ("gpt2", {"scaling": "none"})])
def test_equivalence_check_is_sensitive_to_the_positions(tmp_path, arch, options):
    """The exported model is not just the original: with its positions dropped, the logits differ."""
    original = TINY[arch]()
    x = ids(1, LONG)
    before = logits(original, x) if arch != "gpt2" else None
    model = retrofit.convert(original, "rope", **options)
    retrofit.export(model, tmp_path / "out")
    plain = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    if before is not None:
        assert (logits(plain, x) - before).abs().max() > 1e-3
    if arch == "gpt2":  # a NeoX without rotation (fraction 0) would differ from the patched model
        cfg = plain.config
        cfg.rope_parameters["partial_rotary_factor"] = 0.0
        unrotated = tf.GPTNeoXForCausalLM(cfg).eval()
        unrotated.load_state_dict(plain.state_dict())
        assert (logits(unrotated, x) - logits(model, x)).abs().max() > 1e-3


def test_export_loads_without_retrofit_installed(tmp_path):
    """A subprocess in which `import retrofit` fails loads each export and reproduces the saved logits."""
    x = ids(1, LONG, seed=2)
    dirs = []
    for arch, scheme, options in [
        ("gpt2", "alibi", {"scale_bias": True}),
        ("gpt2", "rope", {}),
        ("llama", "rope", {"scaling": "yarn", "factor": 4.0}),
    ]:
        model = retrofit.convert(TINY[arch](), scheme, **options)
        out = tmp_path / f"{arch}-{scheme}"
        retrofit.export(model, out)
        torch.save({"ids": x, "logits": logits(model, x)}, out / "expected.pt")
        dirs.append(str(out))
    code = (
        "import sys; sys.modules['retrofit'] = None\n"
        "import torch, transformers\n"
        "for d in sys.argv[1:]:\n"
        "    exp = torch.load(d + '/expected.pt')\n"
        "    m = transformers.AutoModelForCausalLM.from_pretrained(d).eval()\n"
        "    with torch.no_grad():\n"
        "        diff = (m(input_ids=exp['ids'], use_cache=False).logits - exp['logits']).abs().max().item()\n"
        "    assert diff <= 1e-4, (d, diff)\n"
        "    try:\n"
        "        import retrofit\n"
        "        raise SystemExit('retrofit importable')\n"
        "    except ImportError:\n"
        "        pass\n"
        "print('ok', len(sys.argv) - 1)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, *dirs],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ok 3" in run.stdout


# ------------------------------------------------------------------ Falcon specifics ----------
def test_falcon_export_is_exact_only_below_its_bf16_bias_range(tmp_path):
    model = retrofit.convert(TINY["gpt2"](), "alibi", scale_bias=True)
    result = retrofit.export(model, tmp_path / "out", check_length=300)
    assert not result["exact"] and result["exact_below"] == 258
    assert any("bfloat16" in n for n in result["notes"])
    assert result["ppl"] is None and "no tokenizer" in result["ppl_note"]
    edge = retrofit.export(model, tmp_path / "edge", check_length=257)  # positions 0..256: exact in bfloat16
    assert edge["exact"] and edge["max_abs_logit_diff"] <= TOLERANCE


def test_exports_advertise_the_same_reach_as_the_checkpoint(tmp_path):
    """ALiBi has no length limit: the checkpoint and its Falcon export both say so (transformers'
    VERY_LARGE_INTEGER), instead of the old table's size or an invented 8192."""
    model = retrofit.convert(TINY["gpt2"](), "alibi", scale_bias=True)
    retrofit.save(model, tmp_path / "ck")
    retrofit.export(model, tmp_path / "falcon", check_length=64)
    saved = json.loads((tmp_path / "ck" / "config.json").read_text())
    falcon = json.loads((tmp_path / "falcon" / "config.json").read_text())
    assert saved["n_positions"] == falcon["max_position_embeddings"] == retrofit.patch.conversion.UNBOUNDED
    assert saved["retrofit"]["base_config"]["n_positions"] == NATIVE  # what load restores to build the table


def test_falcon_slopes_match_for_non_power_of_two_heads():
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    from retrofit.scheme.alibi import alibi_slopes

    for heads in (4, 6, 12, 20):
        falcon = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float32).view(heads, 2)[:, 1]
        ours = torch.tensor(alibi_slopes(heads)).bfloat16().float()  # Falcon rounds its slopes to bfloat16
        assert torch.equal(falcon, ours), heads


def test_per_head_qkv_layout():
    """GPT-2 [q | k | v] columns -> rows [q_0, k_0, v_0, q_1, ...] (Falcon / GPT-NeoX)."""
    E, H = 8, 2
    w = torch.arange(E * 3 * E, dtype=torch.float32).view(E, 3 * E)  # Conv1D (in, out)
    rows = per_head_qkv(w, H)  # (3E, E)
    D = E // H
    for h in range(H):
        for s in range(3):  # q, k, v
            assert torch.equal(
                rows[h * 3 * D + s * D : h * 3 * D + (s + 1) * D], w[:, s * E + h * D : s * E + (h + 1) * D].T
            )


# ------------------------------------------------------------------ errors -------------------
def test_alibi_without_scale_bias_is_refused_with_the_fix(tmp_path):
    model = retrofit.convert(TINY["gpt2"](), "alibi")
    with pytest.raises(RetrofitError, match="scale_bias=true.*approximate.*retrofit.load"):
        retrofit.export(model, tmp_path / "never-written")
    assert not (tmp_path / "never-written").exists()


def test_approximate_falcon_export_says_so_and_measures_perplexity(tmp_path):
    """scale_bias=False has no exact target; approximate=True writes Falcon anyway, with exact False and the
    perplexity of both models on real text (a character tokenizer over the tiny vocabulary)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {chr(c): c - 29 for c in range(32, 127)} | {"<pad>": 0, "<s>": 1, "<unk>": 2}  # ids 3..97
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>")
    model = retrofit.convert(TINY["gpt2"](), "alibi")
    result = retrofit.export(model, tmp_path / "out", approximate=True, tokenizer=tok)
    assert result["target"] == "FalconForCausalLM" and not result["exact"] and result["exact_below"] is None
    assert any("after the 1/sqrt(d) scaling" in n for n in result["notes"])
    assert result["max_abs_logit_diff"] > TOLERANCE
    ppl = result["ppl"]
    assert ppl["tokens"] == 2 * LONG and ppl["patched"] > 1 and ppl["exported"] > 1 and ppl["relative_diff"] != 0
    assert (tmp_path / "out" / "tokenizer.json").exists()


@pytest.mark.parametrize("arch,scheme", [("gpt2", "t5"), ("gpt2", "fire"), ("llama", "alibi")])
def test_pairs_without_a_native_architecture_point_to_retrofit_load(tmp_path, arch, scheme):
    model = retrofit.convert(TINY[arch](), scheme)
    with pytest.raises(RetrofitError, match=r"no native architecture.*gpt2\+alibi.*retrofit.load"):
        retrofit.export(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unconverted_model_and_fine_tune_controls_are_refused(tmp_path):
    with pytest.raises(RetrofitError, match="not converted"):
        retrofit.export(TINY["gpt2"](), tmp_path / "a")
    model = retrofit.convert(TINY["gpt2"](), "rope")
    retrofit.set_position_controls(model, native_fade=0.5)
    with pytest.raises(RetrofitError, match="position controls"):
        retrofit.export(model, tmp_path / "b")


def test_llama_fraction_change_is_refused(tmp_path):
    model = retrofit.convert(TINY["llama"](), "rope", fraction=0.5)
    with pytest.raises(RetrofitError, match="fraction"):
        retrofit.export(model, tmp_path / "out")


# ------------------------------------------------------------------ run dirs and CLI ---------
def test_run_dir_with_final_and_retrofit_format(tmp_path):
    model = retrofit.convert(TINY["gpt2"](), "rope")
    retrofit.save(model, tmp_path / "run" / "final")
    result = retrofit.export(tmp_path / "run", tmp_path / "native")
    assert result["source"] == str(tmp_path / "run" / "final") and result["exact"]
    kept = retrofit.export(tmp_path / "run", tmp_path / "rf", native=False)
    assert kept["target"] == "retrofit"
    x = ids(1, LONG)
    assert torch.allclose(logits(retrofit.load(tmp_path / "rf"), x), logits(model, x), atol=1e-5)


def test_cli_export(tmp_path, capsys):
    from retrofit.cli import main

    retrofit.save(retrofit.convert(TINY["gpt2"](), "nope"), tmp_path / "ckpt")
    rc = main(["export", str(tmp_path / "ckpt"), "--native", "--out", str(tmp_path / "out"), "--max-length", "100"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["target"] == "GPT2LMHeadModel" and printed["check_length"] == 100
    assert tf.AutoConfig.from_pretrained(tmp_path / "out").n_positions == 100
    retrofit.save(retrofit.convert(TINY["gpt2"](), "t5"), tmp_path / "t5")
    assert main(["export", str(tmp_path / "t5"), "--native", "--out", str(tmp_path / "t5-out")]) == 2
    assert "retrofit.load" in capsys.readouterr().err


def test_bfloat16_model_exports_in_its_dtype(tmp_path):
    model = retrofit.convert(TINY["gpt2"](), "rope").to(torch.bfloat16)
    result = retrofit.export(model, tmp_path / "out")
    assert result["dtype"] == "bfloat16" and result["exact"]
    assert any("float32 only" in n for n in result["notes"])
    plain = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert plain.dtype == torch.bfloat16


def test_falcon_exact_range_is_stated_once_as_the_code_has_it():
    """The range was 256, 257 or 258 tokens depending on the document (issue 32 item 11): docs/export.md states
    it from the constant the export uses; the other documents link there and give no number of their own."""
    import re
    from pathlib import Path

    from retrofit.native_export.gpt2 import FALCON_BF16_EXACT

    root = Path(__file__).resolve().parents[2]
    export_md = (root / "docs" / "export.md").read_text()
    assert f"inputs of up to **{FALCON_BF16_EXACT - 1}\n  tokens**" in export_md
    assert f"`exact_below: {FALCON_BF16_EXACT}`" in export_md and 'id="falcon-exact-range"' in export_md
    for doc in [root / "README.md", *(root / "docs").glob("*.md")]:
        if doc.name == "export.md":
            continue
        text = doc.read_text()
        assert not re.search(r"exact (only )?(below|up to|under) 25\d", text), doc
        if "bfloat16" in text and "Falcon" in text:
            assert "export.md#falcon-exact-range" in text, doc


def test_an_export_outside_export_is_what_push_and_the_card_find(tmp_path, capsys):
    """``retrofit export RUN --native --out RUN/native`` (not RUN/export): the manifest records where, so push
    uploads the native weights at the root and the card loads them without retrofit."""
    from retrofit.cli import main
    from retrofit.foundation import run_folder
    from retrofit.publishing.cards import render_card

    run = tmp_path / "run"
    retrofit.save(retrofit.convert(TINY["gpt2"](), "rope"), run / "final")
    assert main(["export", str(run), "--native", "--out", str(run / "native")]) == 0
    assert json.loads((run / run_folder.MANIFEST).read_text())["export"] == "native"
    assert run_folder.export_dir(run) == run / "native" and run_folder.published_layout(run) == {"": run / "native"}
    capsys.readouterr()
    assert main(["push", str(run), "--repo", "user/name", "--dry-run"]) == 0
    assert "native weights" in capsys.readouterr().out
    card = render_card(run)
    assert (
        f"`{run / 'native'}/` holds a native transformers checkpoint" in card and "Native export: not run" not in card
    )
