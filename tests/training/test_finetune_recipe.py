"""Recipe schema: strict validation, overrides, shipped recipes, --help. No model needed."""

from pathlib import Path

import pytest

from retrofit.foundation.errors import RecipeError
from retrofit.training.recipe import Recipe, TrainConfig, iter_keys

RECIPES = sorted(
    p for p in (Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml") if not p.name.startswith("study-")
)  # study-*.yaml: `retrofit study` grids (tests/study/test_study_cli.py)
BASE = {"model": {"name_or_path": "tiny-gpt2"}, "data": {"files": "x.txt"}, "output_dir": "out"}


def test_shipped_recipes_exist():
    names = {p.stem for p in RECIPES}
    expected = {
        "gpt2-alibi-lora",
        "gpt2-rope-lora",
        "gpt2-t5-full",
        "gpt_neo-alibi-lora",
        "opt-alibi-lora",
        "llama-yarn-lora",
        "smollm2-alibi-lora",
    }
    assert expected <= names
    assert any(n.startswith("tiny-") for n in names)


# `retrofit run` recipes add these sections (validated by retrofit.pipeline.stages); the rest is a fine-tune recipe.
PIPELINE_SECTIONS = {"eval", "export", "card", "push"}


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_recipe_validates(path):
    import yaml

    raw = yaml.safe_load(path.read_text())
    r = Recipe.from_dict({k: v for k, v in raw.items() if k not in PIPELINE_SECTIONS})
    assert r.output_dir and r.model.name_or_path and r.train.steps > 0
    assert Recipe.from_dict(r.to_dict()) == r  # the resolved form round-trips


def test_overrides_parse_as_yaml_scalars():
    r = Recipe.from_dict(
        BASE,
        [
            "train.steps=200",
            "data.block_length=512",
            "train.learning_rate=2e-4",
            "data.files=[a.txt, b.txt]",
            "convert.options.theta=500000",
            "train.mixed_precision=no",
        ],
    )
    assert r.train.steps == 200 and r.data.block_length == 512 and r.train.learning_rate == 2e-4
    assert r.data.files == ["a.txt", "b.txt"] and r.convert.options == {"theta": 500000}
    assert r.train.mixed_precision == "no"


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.stepz=3", ["train.stepz", "train.steps"]),
        ("model.nme=x", ["model.nme"]),
        ("train.steps=ten", ["train.steps", "integer"]),
        ("train.steps=2.5", ["train.steps", "integer"]),
        ("train.gradient_checkpointing=1", ["train.gradient_checkpointing"]),
        ("train.method=qlora", ["train.method", "lora"]),
        ("train.lora.r=[8]", ["train.lora.r"]),
        ("train=3", ["train", "mapping"]),
        ("train.steps=0", ["train.steps", "> 0"]),
        ("train.steps=-5", ["train.steps", "> 0"]),
        ("data.block_length=1", ["data.block_length"]),
        ("data.validation_fraction=1.5", ["data.validation_fraction"]),
        ("data.dataset=wikitext", ["data.dataset", "data.files"]),
        ("model.name_or_path=null", ["model.name_or_path"]),
        ("output_dir=null", ["output_dir"]),
        ("train.objective=distill", ["convert.scheme"]),
        ("checkpoint.resume=/nonexistent/ckpt", ["checkpoint.resume"]),
    ],
)
def test_bad_keys_and_types_name_the_key(override, words):
    with pytest.raises(RecipeError) as e:
        Recipe.from_dict(BASE, [override])
    for w in words:
        assert w in str(e.value)


def test_missing_recipe_file_and_bad_yaml(tmp_path):
    with pytest.raises(RecipeError, match="not found"):
        Recipe.from_yaml(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("train: [\n")
    with pytest.raises(RecipeError, match="YAML"):
        Recipe.from_yaml(tmp_path / "bad.yaml")


def test_every_key_has_help_and_is_in_cli_help():
    from retrofit.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["finetune"]
    text = sub.format_help()
    keys = list(iter_keys())
    assert len(keys) > 40
    for key, _tp, _default, help_text in keys:
        assert help_text, key
        assert f"  {key}  (" in text, key
    for key in ("model.name_or_path", "data.files", "data.block_length", "output_dir", "train.steps"):
        assert key in {k for k, *_ in keys}


def test_cli_check_prints_resolved_recipe(capsys):
    from retrofit.cli import main

    assert main(["finetune", str(RECIPES[0]), "--set", "train.steps=7", "--check"]) == 0
    assert "steps: 7" in capsys.readouterr().out
    assert main(["finetune", str(RECIPES[0]), "--set", "train.steps=0", "--check"]) == 2


def test_docs_list_every_key():
    text = (Path(__file__).resolve().parents[2] / "docs" / "finetune.md").read_text()
    missing = [key for key, *_ in iter_keys() if f"`{key}`" not in text]
    assert not missing, f"docs/finetune.md does not list {missing}"


def test_docs_finetune_benchmark_kernels_match_the_benchmark_and_the_code():
    """The fine-tune throughput table (docs/results.md) names the kernel each scheme trained on, which must be
    the one benchmarks/bench_finetune.json recorded (the most used; the unconverted model: stock) and the one
    the kernel table picks for such a step with the dropout as shipped (a converted model trains without it)."""
    import json
    import re

    import torch

    from retrofit import kernels
    from retrofit.kernels import Call

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "results.md").read_text()
    section = text[text.index("### Fine-tune throughput") : text.index("### Decoding with the KV cache")]
    doc = dict(re.findall(r"^\| ([\w-]+) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| (.+?) \|$", section, re.MULTILINE))
    bench = json.loads((root / "benchmarks" / "bench_finetune.json").read_text())["results"]
    assert set(doc) == set(bench), (set(doc), set(bench))
    for scheme, result in bench.items():
        recorded = result["kernels"]
        main = max(recorded, key=recorded.get) if recorded else "stock"
        assert doc[scheme].split(" ")[0] == main, (scheme, doc[scheme], recorded)
        assert f"| {scheme} | {result['attention_dropout']:g} | {result['tokens_per_s']} |" in section, scheme
    q = torch.zeros(1, 2, 8, 4, requires_grad=True)
    bias = lambda h, i, j: -(i - j)  # noqa: E731
    shipped = TrainConfig().attention_dropout  # what a converted model trains with
    assert kernels.choose(Call(q, q, q, 0.5, bias=bias, slopes=torch.ones(2), dropout=shipped)).name == doc["alibi"]
    assert kernels.choose(Call(q, q, q, 0.5, bias=bias, band=torch.zeros(2, 5), dropout=shipped)).name == doc["t5"]
    assert kernels.choose(Call(q, q, q, 0.5, bias=bias, dropout=shipped)).name == doc["fire"]
    assert kernels.choose(Call(q, q, q, 0.5, dropout=shipped)).name == doc["rope"]


def test_quickstart_and_tiny_recipes_leave_the_kernel_to_auto():
    """They forced `kernel: chunked` 'to skip compiling flex' (issue 32 item 11), but auto no longer picks
    flex for them on CPU: ALiBi takes fused-alibi (training and inference), RoPE has no bias."""
    import torch
    import yaml

    from retrofit import kernels
    from retrofit.kernels import Call

    names = [p for p in RECIPES if p.name == "quickstart.yaml" or p.name.startswith("tiny-")]
    for path in names:
        options = (yaml.safe_load(path.read_text()).get("convert") or {}).get("options") or {}
        assert options.get("kernel", "auto") == "auto", path.name
        assert "flex" not in path.read_text(), path.name
    q = torch.zeros(1, 2, 8, 4, requires_grad=True)
    alibi = dict(bias=lambda h, i, j: -(i - j), slopes=torch.ones(2))
    assert kernels.choose(Call(q, q, q, 0.5, **alibi)).name == "sdpa-alibi-dims"
    with torch.no_grad():
        assert kernels.choose(Call(q.detach(), q, q, 0.5, **alibi)).name == "sdpa-alibi-dims"


def test_new_keys_at_their_defaults_leave_old_runs_hashes_alone():
    """A run made before train.teacher_* and convert.calibrate existed keeps its stage hash (retrofit run does
    not train it again); setting them changes it."""
    from retrofit.pipeline.recipe import _hash, load_recipe

    r = load_recipe("recipes/tiny-run.yaml")
    old = r.finetune.to_dict()
    old.pop("output_dir")
    old["train"] = {k: v for k, v in old["train"].items() if not k.startswith("teacher_")}
    old["convert"] = {k: v for k, v in old["convert"].items() if k != "calibrate"}
    assert r.stage_hash("finetune") == _hash({"finetune": old})
    calibrated = load_recipe("recipes/tiny-run.yaml", overrides=["convert.calibrate.data=stdlib"])
    distilled = load_recipe("recipes/tiny-run.yaml", overrides=["train.objective=both", "train.teacher_window=first"])
    assert calibrated.stage_hash("finetune") != r.stage_hash("finetune") != distilled.stage_hash("finetune")


@pytest.mark.parametrize(
    "override, said",
    [
        ("train.steps=0", "'train.steps' must be > 0, got 0"),
        ("train.batch_size=0", "'train.batch_size' must be > 0, got 0"),
        ("train.learning_rate=0", "'train.learning_rate' must be > 0, got 0.0"),
        ("train.warmup_steps=-1", "'train.warmup_steps' must be >= 0, got -1"),
        ("train.mask_rate=1", "'train.mask_rate' must be in (0, 1), got 1.0"),
        ("train.lora.dropout=1.0", "'train.lora.dropout' must be in [0, 1), got 1.0"),
        ("data.block_length=1", "'data.block_length' must be >= 2, got 1"),
        ("data.validation_fraction=1.0", "'data.validation_fraction' must be in [0, 1), got 1.0"),
        ("data.max_documents=0", "'data.max_documents' must be > 0, got 0"),
        ("data.copies.spans=-1", "'data.copies.spans' must be >= 0, got -1"),
        ("checkpoint.keep_last=0", "'checkpoint.keep_last' must be > 0, got 0"),
        ("train.positions.random_offset=-2", "'train.positions.random_offset' must be >= 0, got -2"),
        ("train.positions.pose_chunks=0", "'train.positions.pose_chunks' must be >= 1, got 0"),
        ("convert.calibrate.steps=0", "'convert.calibrate.steps' must be > 0, got 0"),
    ],
)
def test_each_keys_range_is_its_fields_and_said_with_the_key(override, said):
    """The ranges are declared on the fields (``minimum``/``above``/``below``), checked by schema.check_limits."""
    with pytest.raises(RecipeError) as e:
        Recipe.from_dict({**BASE, "convert": {"scheme": "alibi"}}, [override])
    assert str(e.value) == said
