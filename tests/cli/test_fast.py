"""`retrofit convert --help` and a wrong argument answer at once: what would make them slow, importing torch,
never happens (checked as the cause, not timed: a busy machine must not fail a test), and the help they print
is the catalog's own. The seconds they take are measured by benchmarks, not asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

GRID = Path(__file__).resolve().parents[2] / "recipes" / "study-tiny.yaml"


def _run(args: list[str], env: dict) -> tuple[subprocess.CompletedProcess, bool]:
    """The command in a fresh interpreter, and whether it imported torch."""
    code = (
        "import sys, runpy; sys.argv = ['retrofit', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('retrofit', run_name='__main__')\n"
        "finally:\n    print('TORCH' if 'torch' in sys.modules else 'NOTORCH', file=sys.stderr)"
    )
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120)
    return r, "\nTORCH" in r.stderr


@pytest.mark.parametrize(
    "args, rc, says",
    [
        (["convert", "--help"], 0, "a scheme's options: retrofit convert --help --to SCHEME"),
        (["convert", "tiny-gpt2", "--to", "alibj", "--out", "OUT"], 2, "unknown scheme 'alibj'"),
        (["convert", "no/such-model-here", "--to", "alibi", "--out", "OUT"], 5, "not in the Hugging Face cache"),
        (["convert", "./missing-folder", "--to", "alibi", "--out", "OUT"], 2, "no such file or folder"),
        (["convert", "tiny-gpt2", "--to", "alibi", "--out", "FILE"], 2, "is a file"),
        (["finetune", "GRID"], 2, "is a study grid"),
        (["run", "GRID"], 2, "run it with: retrofit study"),
    ],
)
def test_help_and_argument_errors_answer_at_once_without_torch(args, rc, says, tmp_path, user_env):
    (tmp_path / "FILE").write_text("x")
    args = [str(tmp_path / a) if a in ("OUT", "FILE") else str(GRID) if a == "GRID" else a for a in args]
    r, torch_imported = _run(args, user_env)
    assert r.returncode == rc, r.stderr[-2000:]
    assert says in (r.stdout + r.stderr)
    assert not torch_imported  # the cause of a slow answer; no wall-clock bound (a busy machine fails one)


def test_convert_help_for_one_scheme_gives_its_options_from_the_scheme_itself(user_env):
    """``--help --to SCHEME``: that scheme's options as its class declares them (this one imports torch)."""
    from retrofit.scheme import SCHEMES

    r, _ = _run(["convert", "--help", "--to", "rope"], user_env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert all(f"      {key}: " in r.stdout for key in SCHEMES.get("rope").option_help())
    assert "  alibi (bias)" not in r.stdout and "kernels (--kernel)" in r.stdout


def test_convert_help_reads_the_scheme_given_with_an_equals_sign(capsys):
    from retrofit.cli import main

    with pytest.raises(SystemExit):
        main(["convert", "--help", "--to=t5"])
    assert "  t5 (bias)" in capsys.readouterr().out


def test_convert_help_lists_the_kernels_and_architectures_from_their_tables(capsys):
    """``retrofit convert --help`` (no --to) lists the kernels its --kernel help points to and the architectures,
    encoders included, from ``convert_help.txt``: the file is the tables' text (regenerate it with
    ``python -c "from retrofit.cli.convert import write_help_file; write_help_file()"``)."""
    from retrofit import kernels
    from retrofit.cli import convert, main

    assert convert.HELP_FILE.read_text() == convert.kernels_and_architectures() + "\n"
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    out = capsys.readouterr().out
    assert all(f"\n  {k.name}: " in out for k in kernels.KERNELS) and "kernels listed below" in out
    assert "architectures: bert (bert; by structure its kin: roberta" in out


def test_eval_and_finetune_help_name_the_task_models_and_their_data(capsys):
    from retrofit.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "A classifier or an embedding model" in out and "--data longdoc:mention, longdoc:both" in out
    assert "Default: stdlib for a causal or masked LM; for a task run" in out and "(default: stdlib)" not in out
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "'standin:<preset>' (the pretrained stand-ins:" in out and "the small GPT-2 pretrained" not in out
    dataset = out[out.index("data.dataset") : out.index("data.config")]
    assert "longdoc:mention" in dataset and "longdoc:passkey" in dataset


STANDIN = next(GRID.parents[1].glob("standins/quickstart-*"))  # a shipped GPT-2 stand-in (a causal LM), native 128


def test_errors_read_from_a_recipe_or_a_config_answer_without_torch(tmp_path, user_env):
    """#70: a task recipe on a decoder (``--check`` and the run), a missing label field of JSON Lines records and
    lengths past a converted checkpoint's limit are read from config.json and the first records, without importing
    torch (which took 4-16 s on a busy machine before the message)."""
    import yaml

    import retrofit

    model, tok = retrofit.load_model(str(STANDIN))
    extended = retrofit.save(retrofit.convert(model, "extend", length="2x"), tmp_path / "extended", tokenizer=tok)
    (tmp_path / "recs.jsonl").write_text('{"text": "a b", "lab": "x"}\n')
    recipes = {
        "decoder": {
            "task": "embedding",
            "model": {"name_or_path": str(STANDIN)},
            "data": {"dataset": "longdoc:needle"},
        },
        "field": {
            "task": "classification",
            "model": {"name_or_path": str(next(STANDIN.parent.glob("small-bert-[0-9a-f]*")))},
            "data": {"files": str(tmp_path / "recs.jsonl")},
        },
    }
    for name, r in recipes.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({**r, "output_dir": str(tmp_path / name)}))
    cases = [
        (["finetune", str(tmp_path / "decoder.yaml"), "--check"], "'task: embedding' trains an encoder"),
        (["finetune", str(tmp_path / "decoder.yaml")], "'task: embedding' trains an encoder"),
        (["finetune", str(tmp_path / "field.yaml"), "--check"], "has no field 'label' (data.label_field"),
        (["eval", str(extended), "--lengths", "8x"], "lengths 1024 exceed what"),
    ]
    for args, says in cases:
        r, torch_imported = _run(args, user_env)
        assert r.returncode == 2 and says in r.stderr, (args, r.stderr[-2000:])
        assert not torch_imported, args
