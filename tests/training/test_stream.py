"""Streaming fine-tune data (src/retrofit/training/stream.py): local json/jsonl/parquet/txt through the same
``datasets`` streaming path a Hub corpus takes, per-rank parts, exact resume mid-stream, budgets, bad input."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
import yaml

from retrofit.data.specs import streams as rdata_streams
from retrofit.foundation.errors import DataError, RecipeError
from retrofit.training import finetune, stream
from retrofit.training.recipe import Recipe

from ..procs import crash_after_first_checkpoint, final_weights, override, run_ranks

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

STDLIB = Path(sysconfig.get_paths()["stdlib"])
ROOT = Path(__file__).resolve().parents[2]


class Bytes:
    """A byte-level tokenizer (what tiny-gpt2 uses): one token per UTF-8 byte, EOS 256."""

    eos_token_id = 256

    def __call__(self, texts, add_special_tokens=False):
        if isinstance(texts, str):
            return {"input_ids": list(texts.encode())}
        return {"input_ids": [list(t.encode()) for t in texts]}


def _texts(n=40, seed=0):
    import random

    rng = random.Random(seed)
    files = sorted(STDLIB.glob("*.py"))[:n]
    return [f.read_text()[: rng.randint(50, 900)] for f in files]


def _jsonl(path: Path, texts, field="text"):
    path.write_text("".join(json.dumps({field: t, "n": i}) + "\n" for i, t in enumerate(texts)))
    return path


def _source(files, **data):
    d = Recipe.from_dict({"model": {"name_or_path": "x"}, "output_dir": "x", "data": {"files": files, **data}}).data
    return stream.StreamSource.of(d)


# ---- packing and positions -----------------------------------------------------------------
@pytest.mark.parametrize("packing", [True, False])
def test_resuming_from_any_position_gives_the_same_blocks(packing):
    docs = _texts(12)
    tok = Bytes()
    whole = list(stream.pack(iter(docs), tok, 64, packing, stream.Position()))
    assert len(whole) > 20
    for k in range(0, len(whole) - 1, 3):
        at = whole[k][1]
        rest = list(stream.pack(iter(docs[at.document :]), tok, 64, packing, at))
        assert [b.tolist() for b, _ in rest] == [b.tolist() for b, _ in whole[k + 1 :]], k
        assert [p for _, p in rest] == [p for _, p in whole[k + 1 :]]


def test_packing_puts_eos_between_documents_and_drops_nothing():
    docs = ["ab", "cde", "f"]
    blocks = [b.tolist() for b, _ in stream.pack(iter(docs), Bytes(), 3, True, stream.Position())]
    assert sum(blocks, []) == [97, 98, 256, 99, 100, 101, 256, 102, 256]


# ---- formats: one path ----------------------------------------------------------------------
def test_jsonl_parquet_and_text_files_stream_the_same_tokens(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = _texts(10)
    _jsonl(tmp_path / "a.jsonl", texts)
    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet")
    txt = tmp_path / "txt"
    txt.mkdir()
    for i, t in enumerate(texts):
        (txt / f"{i:03d}.txt").write_text(t)
    got = []
    for files, streaming in [(str(tmp_path / "a.jsonl"), None), (str(tmp_path / "a.parquet"), None), (str(txt), True)]:
        src = _source(files, streaming=streaming, shuffle_buffer=0, validation_documents=0)
        got.append([b.tolist() for b, _ in src.batches(Bytes(), 2, 64, True)])
    assert got[0] == got[1] == got[2] and len(got[0]) > 5


def test_streaming_default_follows_the_source():
    def d(**kw):
        return Recipe.from_dict({"model": {"name_or_path": "x"}, "output_dir": "x", "data": kw}).data

    assert rdata_streams(d(dataset="HuggingFaceFW/fineweb-edu"))
    assert not rdata_streams(d(dataset="shakespeare:train")) and not rdata_streams(d(dataset="stdlib"))
    assert not rdata_streams(d(files=str(STDLIB / "textwrap.py")))  # plain text: read whole, as before
    assert rdata_streams(d(files=str(STDLIB / "textwrap.py"), streaming=True))


# ---- per-rank parts ---------------------------------------------------------------------------
@pytest.mark.parametrize("shards", [1, 4])
def test_two_ranks_read_every_document_once(tmp_path, shards):
    texts = _texts(24)
    for s in range(shards):
        _jsonl(tmp_path / f"part{s}.jsonl", texts[s::shards])
    src = _source(str(tmp_path), validation_documents=3)
    src.validation(Bytes(), 64, True, 100)
    parts = [list(src.documents(rank, 2, seed=0, epoch=0)) for rank in (0, 1)]
    assert parts[0] and parts[1]
    first = texts[:3] if shards == 1 else texts[0:12:4]  # the stream's order: file by file
    assert src.held == {stream._digest(t) for t in first}
    assert sorted(parts[0] + parts[1]) == sorted(set(texts) - set(first))
    assert len(src.held) == 3 and not set(parts[0]) & set(parts[1])


# ---- fine-tunes ---------------------------------------------------------------------------------
def recipe(out, corpus, **over) -> dict:
    r = {
        "model": {"name_or_path": "tiny-gpt2"},
        "convert": {"scheme": "alibi", "options": {"kernel": "chunked"}},
        "data": {"files": str(corpus), "block_length": 64, "max_validation_blocks": 4, "shuffle_buffer": 16},
        "train": {
            "method": "lora",
            "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
            "steps": None,
            "batch_size": 2,
            "gradient_accumulation_steps": 2,
            "learning_rate": 3e-3,
            "warmup_steps": 2,
            "seed": 3,
        },
        "checkpoint": {"every": 3, "keep_last": 2},
        "output_dir": str(out),
    }
    r["data"]["max_tokens"] = 12 * 2 * 2 * 64
    return override(r, over)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", _texts(60))


@pytest.fixture(scope="module")
def streamed(tmp_path_factory, corpus):
    return finetune(recipe(tmp_path_factory.mktemp("st") / "run", corpus))


def test_budget_sets_the_steps_and_progress_counts_tokens(streamed):
    s = json.loads((streamed / "summary.json").read_text())
    assert s["steps"] == 12 and s["tokens"] == s["budget_tokens"] == 12 * 2 * 2 * 64
    log = [json.loads(x) for x in (streamed / "log.jsonl").read_text().splitlines()]
    assert [x["tokens"] for x in log if "loss" in x] == [256 * k for k in range(1, 13)]
    assert all(x["tokens_per_s"] > 0 for x in log if "loss" in x)
    assert s["val_loss_after"] < s["val_loss_before"]
    info = json.loads((streamed / "versions.json").read_text())
    assert info["train_stream"].startswith("1 json file") and info["validation_documents"] >= 1
    assert yaml.safe_load((streamed / "recipe.yaml").read_text())["train"]["steps"] == 12  # resolved


def test_killed_mid_stream_resumes_to_the_same_weights(streamed, corpus, tmp_path):
    out, path = tmp_path / "killed", tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe(out, corpus)))
    with crash_after_first_checkpoint():  # the stream's place is what the re-run must find
        finetune(path)
    assert not (out / "final").exists()
    resumed = finetune(path)
    s = json.loads((resumed / "summary.json").read_text())
    assert 0 < s["resumed_from_step"] < 12
    a, b = final_weights(streamed), final_weights(resumed)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)


def test_a_short_stream_stops_with_the_weights_saved_or_repeats(corpus, tmp_path, caplog):
    small = _jsonl(tmp_path / "small.jsonl", _texts(8))
    out = finetune(recipe(tmp_path / "stop", small, data__shuffle_buffer=0))
    s = json.loads((out / "summary.json").read_text())
    assert 0 < s["steps"] < 12 and s["stream_ended_early"]["steps_planned"] == 12
    assert (out / "final" / "model.safetensors").is_file()
    assert "the stream ended after" in caplog.text and "short of the" in caplog.text
    out = finetune(recipe(tmp_path / "repeat", small, data__on_short="repeat"))
    assert json.loads((out / "summary.json").read_text())["steps"] == 12


def test_two_processes_train_on_every_block_once(tmp_path):
    """Two CPU processes (gloo) stream one file to its end: the blocks they trained on, pooled, are the
    blocks of the corpus less the held-out documents, each once. Documents of exactly one block each."""
    texts = [f"{i:04d} " + "x" * 58 for i in range(30)]  # 63 bytes + EOS = one block of 64
    corpus = _jsonl(tmp_path / "c.jsonl", texts)
    out, path = tmp_path / "ddp", tmp_path / "r.yaml"
    path.write_text(
        yaml.safe_dump(
            recipe(
                out,
                corpus,
                data__packing=False,
                data__validation_documents=4,
                data__shuffle_buffer=8,
                data__max_tokens=None,
                train__steps=100,
                train__batch_size=1,
                train__gradient_accumulation_steps=1,
                train__rank_checksums=True,
                checkpoint__every=0,
            )
        )
    )
    assert run_ranks(str(path)) == [0, 0]
    seen = [(out / "rank_checksums" / f"rank{i}.blocks.txt").read_text().split() for i in (0, 1)]
    from transformers import AutoTokenizer

    from retrofit.data.specs import fingerprint

    tok = AutoTokenizer.from_pretrained(out / "final")
    want = [fingerprint(tok(t)["input_ids"] + [tok.eos_token_id]) for t in texts[4:]]
    assert all(len(tok(t)["input_ids"]) == 63 for t in texts)
    assert sorted(seen[0] + seen[1]) == sorted(want)  # none twice, none skipped
    assert abs(len(seen[0]) - len(seen[1])) <= 1
    assert (out / "rank_checksums" / "rank0.txt").read_text() == (out / "rank_checksums" / "rank1.txt").read_text()


# ---- bad input: clear, before any model loads --------------------------------------------------
def _fails(tmp_path, corpus, exc, words, **over):
    out = tmp_path / "bad"
    with pytest.raises(exc) as e:
        finetune(recipe(out, corpus, **over))
    for w in words:
        assert w in str(e.value), str(e.value)
    assert not out.exists(), "work started before the error"


def test_missing_field_is_a_data_error(tmp_path):
    corpus = _jsonl(tmp_path / "c.jsonl", _texts(3), field="content")
    _fails(tmp_path, corpus, DataError, ["no field 'text'", "content"])


def test_bad_inputs(tmp_path, corpus):
    _fails(tmp_path, tmp_path / "none" / "*.jsonl", DataError, ["no file matches"])
    _fails(
        tmp_path,
        corpus,
        RecipeError,
        ["max_documents", "max_tokens", "--set data.max_documents=null"],
        data__max_documents=3,
    )
    (tmp_path / "mixed").mkdir()
    _jsonl(tmp_path / "mixed" / "a.jsonl", ["x" * 100])
    (tmp_path / "mixed" / "b.txt").write_text("y" * 100)
    _fails(tmp_path, tmp_path / "mixed", DataError, ["mixes formats"])
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine"}\n{"text": oops\n')
    _fails(tmp_path, broken, DataError, ["cannot"])
    _fails(
        tmp_path,
        corpus,
        DataError,
        ["built-in", "stdlib"],
        data__files=None,
        data__dataset="stdlib",
        data__streaming=True,
    )
    with pytest.raises(RecipeError, match="data.max_tokens"):
        Recipe.from_dict(recipe(tmp_path / "x", corpus, data__max_tokens=None, train__steps=None))


def test_offline_hub_dataset_not_cached_is_exit_5_at_once(tmp_path):
    r = recipe(tmp_path / "out", "x", data__files=None, data__dataset="no-such-org/not-cached-corpus")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "RETROFIT_PROGRESS": "0"}
    res = subprocess.run(
        [sys.executable, "-m", "retrofit", "finetune", str(path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 5, res.stderr[-2000:]
    assert "no-such-org/not-cached-corpus" in res.stderr and "cache" in res.stderr
    assert "Retrying" not in res.stderr  # at once: offline is not retried (the cause, not the clock)
    assert not (tmp_path / "out").exists()


# ---- the shipped recipes: a real corpus, a budget with its arithmetic -------------------------------
HUB_RECIPES = (
    sorted(  # the language-model recipes (a classifier's or an embedding model's: tests/training/test_tasks.py)
        p
        for p in (ROOT / "recipes").glob("*.yaml")
        if not p.stem.startswith(("tiny", "quickstart", "study")) and "\ntask:" not in p.read_text()
    )
)


@pytest.mark.parametrize("path", HUB_RECIPES, ids=lambda p: p.stem)
def test_real_recipes_stream_a_general_corpus_on_a_stated_budget(path):
    r = Recipe.from_yaml(path)
    text = path.read_text()
    assert rdata_streams(r.data) and r.data.dataset == "HuggingFaceFW/fineweb-edu" and r.data.max_tokens
    from retrofit.training.recipe import tokens_per_step

    per = tokens_per_step(r.train, r.data.block_length, 1)
    assert r.train.steps == r.data.max_tokens // per  # steps, batch and block agree with the budget
    assert f"{r.train.steps:,} steps x {per:,} tokens" in text and "% " in text.split("# Budget:")[1]
    assert "# Data: FineWeb-Edu" in text and "ODC-By" in text and "--plan --processes 1" in text


def test_plan_prints_budget_time_and_memory(in_process, user_env, cache):
    path = ROOT / "recipes" / "smollm2-drope.yaml"  # a built-in model: its config reads offline
    res = in_process(
        ["retrofit", "finetune", str(path), "--plan", "--processes", "1"],
        ROOT,
        {**user_env, "RETROFIT_CACHE": str(cache)},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    r = Recipe.from_yaml(path)
    assert f"budget: {r.train.steps:,} steps" in res.stdout and "tokens per step" in res.stdout
    assert "time: " in res.stdout and "tokens/s per device" in res.stdout and "| ddp |" in res.stdout
    assert "on one A100" in path.read_text()


def test_plan_prints_the_budget_before_an_offline_model_fails(in_process, user_env):
    path = ROOT / "recipes" / "gpt2-t5-full.yaml"
    res = in_process(["retrofit", "finetune", str(path), "--plan", "--processes", "1"], ROOT, user_env)  # offline
    assert res.returncode == 5 and "budget: 5,493 steps" in res.stdout, (res.stdout, res.stderr[-1000:])
