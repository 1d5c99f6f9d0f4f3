"""Issue 17: each ordinary user mistake, run through the command line as typed, is retrofit's own
one-line error with its exit code (2 bad input, 3 unsupported, 5 Hub; never 1, which means a bug),
leaves nothing half-written, and a clean run prints no warning a user would have to look up.
`retrofit --help` builds without importing torch."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retrofit.cli import main

from ..procs import warnings_in
from ..test_user_path import ROOT, cli

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

TINY_RECIPE = "recipes/tiny-gpt2-alibi-lora.yaml"


@pytest.fixture
def at(tmp_path, monkeypatch):
    """Run in tmp_path with its own cache (the tiny GPT-2 is built there), offline."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RETROFIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RETROFIT_PROGRESS", "0")
    return tmp_path


def run(args: list[str], capsys) -> tuple[int, str]:
    """``retrofit ARGS`` through the console script's entry point: (exit code, the error line)."""
    try:
        rc = main(args)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith(f"retrofit {args[0]}: ")]
    return rc, (lines[-1] if lines else err)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) if folder.is_dir() else []


# ---- what cannot be loaded ---------------------------------------------------------------------
def test_a_model_that_is_not_a_causal_lm_is_unsupported(at, capsys):
    import transformers as tf

    tf.T5ForConditionalGeneration(
        tf.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4)
    ).save_pretrained(at / "t5")
    rc, err = run(["convert", "t5", "--to", "alibi", "--out", "out"], capsys)
    assert rc == 3, err
    assert "'t5' model (T5ForConditionalGeneration), which is neither a causal (decoder-only) language model" in err
    assert "nor an encoder with its head" in err and "llama" in err
    assert not (at / "out").exists()


@pytest.mark.parametrize("kind", ["albert", "distilbert"])
def test_an_encoder_without_a_causal_lm_class_converts_from_its_folder(at, capsys, kind):
    """ALBERT and DistilBERT have no ...ForCausalLM class: a folder whose config names its masked-LM head converts
    (it was refused as 'not a causal LM'), and loads back as that masked LM."""
    import transformers as tf

    import retrofit

    config, model = {
        "albert": (
            tf.AlbertConfig(
                vocab_size=64,
                embedding_size=16,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                max_position_embeddings=32,
            ),
            tf.AlbertForMaskedLM,
        ),
        "distilbert": (
            tf.DistilBertConfig(
                vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=32
            ),
            tf.DistilBertForMaskedLM,
        ),
    }[kind]
    model(config).save_pretrained(at / kind)
    rc, err = run(["convert", kind, "--to", "alibi", "--out", "out"], capsys)
    assert rc == 0, err
    back = retrofit.load(at / "out")
    assert type(back) is model and retrofit.describe(back)["scheme"] == "alibi"


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda p: (p / "notes").mkdir() or (p / "notes" / "a.txt").write_text("hi"), "is not a model folder"),
        (lambda p: None, "no such file or folder"),
    ],
)
def test_a_path_that_is_not_a_model(at, capsys, make, words):
    make(at)
    rc, err = run(["convert", "./notes", "--to", "alibi", "--out", "out"], capsys)
    assert rc == 2 and words in err, err
    assert "Repo id" not in err and not (at / "out").exists()


def test_a_hub_name_offline_is_a_hub_error(at, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, err = run(["describe", "someone/not-cached-here"], capsys)
    assert rc == 5 and "not in the Hugging Face cache, and HF_HUB_OFFLINE is set" in err, err


def test_an_unreachable_hub_fails_at_once_from_the_cache(at, capsys, monkeypatch):
    """One request says the Hub does not answer; the load then reads the cache only (no minute of retries)."""
    from huggingface_hub import constants

    from retrofit.models import sources

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    asked = []
    monkeypatch.setattr(sources, "_probed", {})  # this process has not asked yet
    monkeypatch.setattr(sources, "_unreachable", lambda endpoint: asked.append(endpoint) or "ConnectError: no route")
    rc, err = run(["describe", "someone/not-cached-here"], capsys)
    assert rc == 5 and "the Hub does not answer" in err, err
    assert asked == [constants.ENDPOINT] and constants.HF_HUB_OFFLINE is False  # restored after the load


def test_truncated_weights(at, capsys):
    run(["convert", "tiny-gpt2", "--to", "alibi", "--out", "ck"], capsys)
    weights = at / "ck" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    rc, err = run(["convert", "ck", "--to", "rope", "--out", "out"], capsys)
    assert rc == 2 and "cannot be read" in err and "damaged or incomplete" in err, err
    assert not (at / "out").exists()


def _gguf(path: Path, embedding_width: int, width: int = 32, vocab: int = 16) -> None:
    """A one-layer llama GGUF whose metadata says ``width``; its embedding is ``embedding_width`` wide."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64), w.add_embedding_length(width), w.add_block_count(1), w.add_feed_forward_length(64)
    w.add_head_count(4), w.add_head_count_kv(4), w.add_layer_norm_rms_eps(1e-5), w.add_vocab_size(vocab)
    w.add_rope_dimension_count(width // 4), w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(vocab)]), w.add_token_scores([0.0] * vocab), w.add_token_types([1] * vocab)
    rand = np.random.default_rng(0)
    tensors = {
        "token_embd": (vocab, embedding_width),
        "output": (vocab, width),
        "blk.0.attn_q": (width, width),
        "blk.0.attn_k": (width, width),
        "blk.0.attn_v": (width, width),
        "blk.0.attn_output": (width, width),
        "blk.0.ffn_gate": (64, width),
        "blk.0.ffn_up": (64, width),
        "blk.0.ffn_down": (width, 64),
    }
    for name, shape in tensors.items():
        w.add_tensor(f"{name}.weight", (rand.standard_normal(shape) * 0.02).astype(np.float32))
    for name in ("output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"):
        w.add_tensor(f"{name}.weight", np.ones(width, np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


def test_a_gguf_whose_shapes_do_not_fit(at, capsys):
    _gguf(at / "good.gguf", embedding_width=32)
    rc, err = run(["describe", "good.gguf"], capsys)
    assert rc == 0, err
    _gguf(at / "bad.gguf", embedding_width=24)
    rc, err = run(["convert", "bad.gguf", "--to", "alibi", "--out", "out"], capsys)
    assert rc == 2 and "bad.gguf cannot be loaded as a causal LM" in err and "shapes differ" in err, err
    assert not (at / "out").exists()


# ---- where the output goes -----------------------------------------------------------------------
@pytest.mark.parametrize("out,words", [("afile", "--out afile is a file"), ("afile/sub", "a file is in the way")])
def test_an_out_that_cannot_be_a_folder(at, capsys, out, words):
    (at / "afile").write_text("keep me")
    rc, err = run(["convert", "tiny-gpt2", "--to", "alibi", "--out", out], capsys)
    assert rc == 2 and words in err, err
    assert (at / "afile").read_text() == "keep me"


# Every command that writes a folder, with its output pointed at OUT (the same words the user types)
WRITERS = {
    "convert": ["convert", "tiny-gpt2", "--to", "alibi", "--out", "OUT"],
    "eval": ["eval", "tiny-gpt2", "--lengths", "64", "--budget", "128", "--out", "OUT"],
    "finetune": [
        "finetune",
        TINY_RECIPE,
        "--set",
        "model.name_or_path=tiny-gpt2",
        "--set",
        "output_dir=OUT",
        "--set",
        "train.steps=2",
    ],
    "run": [
        "run",
        TINY_RECIPE,
        "--set",
        "model.name_or_path=tiny-gpt2",
        "--set",
        "output_dir=OUT",
        "--set",
        "train.steps=2",
    ],
}


def _writer(command: str, out: str) -> list[str]:
    return [w.replace("OUT", out) for w in WRITERS[command]]


@pytest.fixture
def no_work(at, monkeypatch):
    """Recipes in place, and any model load fails the test: the output is checked before the work."""
    from retrofit.models import builtin

    shutil.copytree(ROOT / "recipes", at / "recipes")
    monkeypatch.setattr(builtin, "resolve", lambda *a, **k: pytest.fail("a model was loaded before --out was checked"))
    return at


@pytest.mark.parametrize("command", WRITERS)
def test_an_output_under_a_file_fails_before_the_work(no_work, capsys, command):
    (no_work / "afile").write_text("keep me")
    rc, err = run(_writer(command, "afile/sub"), capsys)
    assert rc == 2 and "afile/sub cannot be created: a file is in the way (afile)" in err, err
    assert (no_work / "afile").read_text() == "keep me"


def _refuse_writes_in(folder: Path, monkeypatch) -> None:
    """``folder`` refuses new files, for any user: read-only bits (which root writes past), and the
    refusal a read-only mount gives root too, on the probe that retrofit's check makes."""
    import tempfile

    folder.mkdir(exist_ok=True)
    folder.chmod(0o555)
    real = tempfile.mkstemp

    def mkstemp(*a, dir=None, **k):
        if dir is not None and Path(dir).resolve() == folder.resolve():
            raise PermissionError(errno.EACCES, "Permission denied", str(dir))
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize("command,out", [*((c, "ro/sub") for c in WRITERS), *((c, "ro") for c in WRITERS)])
def test_an_output_that_cannot_be_written_fails_before_the_work(no_work, capsys, monkeypatch, command, out):
    """In a read-only folder, or the read-only folder itself (empty: convert must not replace it)."""
    ro = no_work / "ro"
    _refuse_writes_in(ro, monkeypatch)
    inode = ro.stat().st_ino
    try:
        rc, err = run(_writer(command, out), capsys)
    finally:
        ro.chmod(0o755)
    assert rc == 2 and f"{out} cannot be written: {ro} is not writable (Permission denied)" in err, err
    assert ro.stat().st_ino == inode and list(ro.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_as_it_is(at, capsys):
    (at / "ro").mkdir(mode=0o555)
    try:
        rc, err = run(_writer("convert", "ro"), capsys)
    finally:
        (at / "ro").chmod(0o755)
    assert rc == 2 and "is not writable" in err, err


def test_a_write_refused_midway_is_an_output_error(at, capsys, monkeypatch):
    """The file system refusing a write after the checks (permissions changed, a read-only mount): retrofit's
    error, nothing half-written."""
    import pathlib

    run(["convert", "tiny-gpt2", "--to", "alibi", "--out", "ck"], capsys)
    real_open = pathlib.Path.open

    def refusing_open(self, mode="r", *a, **k):
        if "w" in mode and self.parent.resolve() == (at / "ck").resolve():
            raise PermissionError(errno.EROFS, "Read-only file system", str(self))
        return real_open(self, mode, *a, **k)

    monkeypatch.setattr(pathlib.Path, "open", refusing_open)
    rc, err = run(["card", "ck"], capsys)
    assert rc == 2 and "cannot write ck/README.md: Read-only file system" in err, err
    assert leftovers(at / "ck") == [] and not (at / "ck" / "README.md").exists()


def _full_disk_after(nbytes: int):
    def write(path, *a, **k):
        Path(path).write_bytes(b"\0" * nbytes)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    return write


def test_a_full_disk_during_convert(at, capsys, monkeypatch):
    import transformers.modeling_utils as mu

    from retrofit.models import builtin

    builtin.tiny_gpt2()  # the input is written before the disk fills
    monkeypatch.setattr(mu, "safe_save_file", lambda tensors, filename, **k: _full_disk_after(100)(filename))
    rc, err = run(["convert", "tiny-gpt2", "--to", "alibi", "--out", "ck"], capsys)
    assert rc == 2 and "no space left on device while writing ck" in err, err
    assert not (at / "ck").exists() and leftovers(at) == []


def test_a_full_disk_during_a_finetune_checkpoint(at, capsys, monkeypatch):
    import torch

    shutil.copytree(ROOT / "recipes", at / "recipes")
    real_save = torch.save

    def save(obj, f, *a, **k):
        if "checkpoints" in str(f):
            return _full_disk_after(100)(f)
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    rc, err = run(
        [
            "finetune",
            TINY_RECIPE,
            "--set",
            "model.name_or_path=tiny-gpt2",
            "--set",
            "output_dir=ft",
            "--set",
            "train.steps=2",
            "--set",
            "checkpoint.every=2",
            "--set",
            "train.eval_every=0",
        ],
        capsys,
    )
    assert rc == 2 and "no space left on device while writing ft/checkpoints/step_00000002" in err, err
    assert leftovers(at / "ft" / "checkpoints") == [] and not (at / "ft" / "checkpoints" / "step_00000002").exists()


def test_torch_short_write_on_a_full_disk_is_recognised(tmp_path, monkeypatch):
    """torch's zip writer says only "unexpected pos" when the disk fills; the free space decides."""
    import shutil as sh

    from retrofit.foundation.atomic import no_space

    torch_error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    usage = sh.disk_usage(tmp_path)
    monkeypatch.setattr(sh, "disk_usage", lambda p: usage._replace(free=0))
    assert no_space(torch_error, tmp_path / "x")
    monkeypatch.setattr(sh, "disk_usage", lambda p: usage._replace(free=10 << 30))
    assert not no_space(torch_error, tmp_path / "x")
    assert not no_space(RuntimeError("something else"), tmp_path)


# ---- data that is not text -----------------------------------------------------------------------
NOT_TEXT = {
    "latin-1": ("Ça coûte très cher.\n".encode("latin-1") * 300, "is not UTF-8 text (byte b'\\xc7' on line 1)"),
    "binary": (bytes(range(256)) * 40, "is not text: it holds NUL bytes"),
}


def _data_with(folder: Path, content: bytes) -> None:
    folder.mkdir()
    (folder / "good.txt").write_text("plain words, nothing odd. " * 400)
    (folder / "bad.txt").write_bytes(content)


@pytest.mark.parametrize("kind", NOT_TEXT)
@pytest.mark.parametrize("spec", ["data/bad.txt", "data"])
def test_eval_data_that_is_not_utf8_text_is_refused(no_work, capsys, kind, spec):
    content, words = NOT_TEXT[kind]
    _data_with(no_work / "data", content)
    rc, err = run(["eval", "tiny-gpt2", "--data", spec, "--lengths", "64", "--out", "ev"], capsys)
    assert rc == 2 and f"data/bad.txt {words}" in err, err
    assert not (no_work / "ev").exists()


@pytest.mark.parametrize("kind", NOT_TEXT)
def test_recipe_data_files_that_are_not_utf8_text_are_refused(no_work, capsys, kind):
    content, words = NOT_TEXT[kind]
    _data_with(no_work / "data", content)
    rc, err = run(
        [
            "finetune",
            TINY_RECIPE,
            "--set",
            "model.name_or_path=tiny-gpt2",
            "--set",
            "output_dir=ft",
            "--set",
            "data.dataset=null",
            "--set",
            "data.files=[data/good.txt, data/bad.txt]",
        ],
        capsys,
    )
    assert rc == 2 and f"data/bad.txt {words}" in err, err


def test_a_finetune_without_validation_says_so(tmp_path, user_env, in_process):
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    r = in_process(
        [
            "retrofit",
            "finetune",
            TINY_RECIPE,
            "--set",
            "model.name_or_path=tiny-gpt2",
            "--set",
            "output_dir=ft",
            "--set",
            "train.steps=1",
            "--set",
            "checkpoint.every=0",
            "--set",
            "data.validation_fraction=0",
        ],
        tmp_path,
        user_env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "no validation loss: data.validation_fraction is 0" in r.stderr, r.stderr[-3000:]
    assert "None" not in r.stderr and "done: no validation loss" in r.stderr, r.stderr[-3000:]


# ---- options that pointed the wrong way ----------------------------------------------------------
def test_already_converted_names_the_flag_and_force_converts(at, capsys):
    run(["convert", "tiny-gpt2", "--to", "alibi", "--out", "ck"], capsys)
    rc, err = run(["convert", "ck", "--to", "rope", "--out", "ck2"], capsys)
    assert rc == 2 and "already converted to 'alibi'; pass --force" in err and "force=True" not in err, err
    assert not (at / "ck2").exists()
    rc, err = run(["convert", "ck", "--to", "rope", "--out", "ck2", "--force"], capsys)
    assert rc == 0, err
    assert json.loads((at / "ck2" / "config.json").read_text())["retrofit"]["scheme"] == "rope"


@pytest.mark.parametrize("lengths,words", [("-128,256", "got '-128'"), ("1x,4y", "got '4y'"), (",", "at least one")])
def test_bad_eval_lengths_are_reported_by_the_option(at, capsys, lengths, words):
    rc, err = run(["eval", "tiny-gpt2", "--lengths", lengths], capsys)
    assert rc == 2 and "argument --lengths: " in err and words in err, err


def test_lengths_as_multiples_on_the_command_line_and_in_set(at, capsys):
    from retrofit.cli.eval import _lengths

    assert _lengths("--lengths")("1x,4x,512") == ["1x", "4x", 512]
    shutil.copytree(ROOT / "recipes", at / "recipes")
    rc = main(["run", "recipes/quickstart.yaml", "--set", "eval.lengths=1x,4x", "--check"])
    out = capsys.readouterr().out
    assert rc == 0 and "lengths:\n  - 1x\n  - 4x\n" in out, out


def test_eval_of_an_unconverted_model_says_which_lengths_it_drops_and_labels_it_the_original(
    tmp_path, user_env, in_process
):
    r = in_process(
        ["retrofit", "eval", "tiny-gpt2", "--budget", "256", "--no-plots", "--out", "ev"], tmp_path, user_env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "tiny-gpt2 is not converted (learned_absolute: at most 64 tokens): the default lengths 128, 256, 512 "
        "are not evaluated, only 64"
    ) in r.stderr, r.stderr[-3000:]
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert report["settings"]["lengths"] == [64]
    assert [m["role"] for m in report["models"]] == ["original"]
    assert {row["role"] for row in report["rows"]} == {"original"} and "| original |" in r.stdout, r.stdout


# ---- help and noise ------------------------------------------------------------------------------
def test_help_builds_without_torch():
    code = (
        "import sys; from retrofit.cli import build_parser; p = build_parser(); p.format_help();"
        "heavy = [m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules];"
        "print(heavy)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr[-2000:])


def test_help_lists_every_registered_scheme():
    from retrofit.scheme import SCHEMES

    r = subprocess.run([sys.executable, "-m", "retrofit", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0
    assert all(f"\n  {name} " in r.stdout for name in SCHEMES.names()), r.stdout


def test_convert_help_lists_the_built_in_models():
    from retrofit.models import builtin

    r = subprocess.run(
        [sys.executable, "-m", "retrofit", "convert", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
    listed = " ".join(r.stdout.split("built-in models", 1)[-1].split())
    assert "built-in models" in r.stdout and all(f" {name}," in listed + "," for name in builtin.names()), r.stdout
    assert "standin:micro" in listed and "tiny-gpt2" in listed and "smollm2" in listed


def test_clean_convert_load_finetune_and_export_print_no_warning(tmp_path, user_env, in_process):
    """A fine-tune that converts, the export and a `retrofit.load` of a t5 checkpoint, each in a fresh process as
    a user types it, print no warning. The README's block (convert, finetune from a checkpoint, eval, push) is
    held to the same in tests/test_user_path.py."""
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    # t5 (learned position tensors) for the fresh `retrofit.load` below; convert's own process is the README
    # block's (tests/test_user_path.py)
    r = in_process(["retrofit", "convert", "tiny-gpt2", "--to", "t5", "--out", "ck"], tmp_path, user_env)
    assert r.returncode == 0 and warnings_in(r.stderr) == [], r.stderr[-3000:]
    steps = [
        [  # converts inside the fine-tune (scale_bias: exportable), saves a checkpoint every step
            "retrofit",
            "finetune",
            TINY_RECIPE,
            "--set",
            "model.name_or_path=tiny-gpt2",
            "--set",
            "convert.options.scale_bias=true",
            "--set",
            "output_dir=ft",
            "--set",
            "train.steps=2",
            "--set",
            "checkpoint.every=1",
            "--set",
            "train.eval_every=0",
        ],
        ["retrofit", "export", "ft", "--native", "--out", "native"],
    ]
    for args in steps:
        r = cli(args, tmp_path, user_env)
        assert r.returncode == 0, r.stderr[-3000:]
        assert warnings_in(r.stderr) == [], (args, r.stderr[-3000:])
    code = "import retrofit, sys; retrofit.load(sys.argv[1])"
    r = subprocess.run([sys.executable, "-c", code, "ck"], cwd=tmp_path, env=user_env, capture_output=True, text=True)
    assert r.returncode == 0 and warnings_in(r.stderr) == [], r.stderr[-3000:]


def test_verbose_shows_what_is_kept_quiet(tmp_path, user_env):
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    r = cli(
        [
            "retrofit",
            "--verbose",
            "finetune",
            TINY_RECIPE,
            "--set",
            "model.name_or_path=tiny-gpt2",
            "--set",
            "output_dir=ft",
            "--set",
            "train.steps=1",
            "--set",
            "checkpoint.every=1",
            "--set",
            "train.eval_every=0",
        ],
        tmp_path,
        user_env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Removed shared tensor" in r.stderr and "accelerate.checkpointing" in r.stderr


@pytest.mark.parametrize("progress", ["0", "1"])
def test_retrofit_progress_0_silences_the_finetune_bar_and_1_keeps_it(tmp_path, user_env, progress, in_process):
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    r = in_process(
        [
            "retrofit",
            "finetune",
            TINY_RECIPE,
            "--set",
            "model.name_or_path=tiny-gpt2",
            "--set",
            "output_dir=ft",
            "--set",
            "train.steps=2",
            "--set",
            "checkpoint.every=0",
            "--set",
            "train.eval_every=0",
        ],
        tmp_path,
        {**user_env, "RETROFIT_PROGRESS": progress},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("finetune:" in r.stderr) == (progress == "1"), r.stderr[-3000:]
