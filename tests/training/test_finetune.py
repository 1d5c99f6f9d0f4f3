"""Fine-tune end to end on a tiny converted GPT-2 (tiny-gpt2: built offline) and stdlib text.

One uninterrupted LoRA run (module fixture) serves: loss falls, merged output reloads with the
same logits, the adapter alone re-merges to the same model, and it is the reference for the
kill-and-resume test.
"""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import retrofit
from retrofit.foundation.errors import DataError, HubError, LengthError, RecipeError
from retrofit.models.builtin import tiny_gpt2
from retrofit.training import finetune

from ..procs import free_port, kill_at_first_checkpoint, override, run_child

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = [
    str(STDLIB / f)
    for f in ("textwrap.py", "shlex.py", "string.py", "heapq.py", "bisect.py", "fnmatch.py", "glob.py", "copy.py")
]
STEPS, EVERY = 24, 4


def recipe(out, **over) -> dict:
    r = {
        "model": {"name_or_path": "tiny-gpt2"},
        "convert": {"scheme": "alibi", "options": {"kernel": "chunked"}},
        "data": {"files": FILES, "block_length": 128, "validation_fraction": 0.25, "max_validation_blocks": 8},
        "train": {
            "method": "lora",
            "lora": {"r": 4, "alpha": 8, "dropout": 0.1},
            "train_norms": True,
            "steps": STEPS,
            "batch_size": 2,
            "gradient_accumulation_steps": 2,
            "learning_rate": 3e-3,
            "warmup_steps": 2,
            "seed": 3,
            "positions": {},
        },
        "checkpoint": {"every": EVERY, "keep_last": 2},
        "output_dir": str(out),
    }
    return override(r, over)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ft") / "run"
    return finetune(recipe(out))


def _logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def _ids(n=100):
    return torch.randint(0, 256, (2, n), generator=torch.Generator().manual_seed(1))


def test_validation_loss_falls_and_outputs_written(run):
    s = json.loads((run / "summary.json").read_text())
    assert s["steps"] == STEPS
    assert s["val_loss_after"] < s["val_loss_before"] - 0.2, s
    log = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    train = [x for x in log if "loss" in x]
    assert [x["step"] for x in train] == list(range(1, STEPS + 1))
    assert all(k in train[-1] for k in ("lr", "grad_norm", "tokens_per_s"))
    assert yaml.safe_load((run / "recipe.yaml").read_text())["train"]["steps"] == STEPS
    assert "torch" in json.loads((run / "versions.json").read_text())["versions"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000020", "step_00000024"]
    assert (run / "adapter" / "adapter_model.safetensors").is_file()


def test_final_reloads_with_retrofit_load(run):
    model = retrofit.load(run / "final")
    info = retrofit.describe(model)
    assert info["converted"] and info["scheme"] == "alibi"
    adapter_cfg = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert adapter_cfg["r"] == 4 and adapter_cfg["modules_to_save"]  # norms trained alongside


def test_adapter_alone_merges_to_the_final_model(run):
    """Base + convert + adapter/ (PEFT's own files) -> merge == final/ read by retrofit.load."""
    from peft import PeftModel

    base, _ = retrofit.load_model(str(tiny_gpt2()))
    retrofit.convert(base, "alibi", kernel="chunked")
    merged = PeftModel.from_pretrained(base, run / "adapter").merge_and_unload()
    final = retrofit.load(run / "final")
    ids = _ids()
    torch.testing.assert_close(_logits(merged, ids), _logits(final, ids), atol=1e-5, rtol=1e-5)


def test_the_adapter_alone_loads_with_retrofit_load(run):
    """adapter/ (a few MB) names its base and conversion (retrofit_base.json): ``retrofit.load`` of it is final/."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # peft's read of a deprecated name is not the user's
        merged = retrofit.load(run / "adapter")
    final, ids = retrofit.load(run / "final"), _ids()
    assert json.loads((run / "adapter" / "retrofit_base.json").read_text())["convert"]["scheme"] == "alibi"
    torch.testing.assert_close(_logits(merged, ids), _logits(final, ids), atol=1e-5, rtol=1e-5)


def test_the_adapter_of_a_run_from_a_converted_checkpoint_loads_too(tmp_path):
    """The README's path: convert and save first, then fine-tune that checkpoint: its adapter/ loads as final/."""
    model, tok = retrofit.load_model(str(tiny_gpt2()))
    retrofit.convert(model, "alibi", kernel="chunked")
    retrofit.save(model, tmp_path / "converted", tokenizer=tok)
    r = recipe(tmp_path / "run", train__steps=4, checkpoint__every=0)
    r["model"]["name_or_path"] = str(tmp_path / "converted")
    finetune(r)
    out = tmp_path / "run"
    ids = _ids()
    torch.testing.assert_close(
        _logits(retrofit.load(out / "adapter"), ids), _logits(retrofit.load(out / "final"), ids), atol=1e-5, rtol=1e-5
    )


def test_lora_with_position_parameters_save_load_merge(tmp_path):
    """A scheme with new position parameters: they train (modules_to_save) and survive
    save -> load -> merge with identical logits."""
    scheme = "t5"  # a learned bucket table: trained through PEFT's modules_to_save
    from peft import PeftModel

    out = finetune(
        recipe(
            tmp_path / "p",
            convert={"scheme": scheme, "options": {}},
            train__steps=6,
            checkpoint__every=0,
            train__train_norms=False,
        )
    )
    cfg = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert "retrofit_positions" in cfg["modules_to_save"]
    base, _ = retrofit.load_model(str(tiny_gpt2()))
    retrofit.convert(base, scheme)
    before = {n: p.clone() for n, p in base.retrofit_positions.named_parameters()}
    merged = PeftModel.from_pretrained(base, out / "adapter").merge_and_unload()
    after = dict(merged.retrofit_positions.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before), "position parameters did not train"
    ids = _ids()
    torch.testing.assert_close(_logits(merged, ids), _logits(retrofit.load(out / "final"), ids), atol=1e-5, rtol=1e-5)


def _weights(out: Path) -> dict:
    return load_file(str(out / "final" / "model.safetensors"))


def test_kill_and_resume_equals_uninterrupted(run, tmp_path):
    out = tmp_path / "killed"
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe(out)))
    kill_at_first_checkpoint(out, run_child, (str(path),))
    assert not (out / "final").exists()
    resumed = finetune(path)
    s = json.loads((resumed / "summary.json").read_text())
    assert 0 < s["resumed_from_step"] < STEPS
    a, b = _weights(run), _weights(resumed)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)
    log = [json.loads(x) for x in (resumed / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log if "loss" in x] == list(range(1, STEPS + 1))


def _ddp_recipe(tmp_path) -> tuple[Path, Path]:
    out, path = tmp_path / "ddp", tmp_path / "r.yaml"
    path.write_text(
        yaml.safe_dump(
            recipe(out, train__steps=4, checkpoint__every=2, train__rank_checksums=True, train__batch_size=1)
        )
    )
    return out, path


def _check_ddp(out: Path):
    h0 = (out / "rank_checksums" / "rank0.txt").read_text()
    h1 = (out / "rank_checksums" / "rank1.txt").read_text()
    assert h0 == h1
    s = json.loads((out / "summary.json").read_text())
    assert s["num_processes"] == 2 and s["val_loss_after"] < s["val_loss_before"]
    assert retrofit.describe(retrofit.load(out / "final"))["scheme"] == "alibi"


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("RETROFIT_TEST_LAUNCHER") != "1",
    reason="opt-in (RETROFIT_TEST_LAUNCHER=1): ~40 s of imports in fresh processes on a loaded CPU",
)
def test_two_processes_under_torchrun(tmp_path):
    """DDP over gloo through torchrun (what `accelerate launch --multi_gpu` runs): both ranks end with the same
    weights. The accelerate launch of DDP and FSDP is research/test_sharded.py's (run by CI)."""
    out, path = _ddp_recipe(tmp_path)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "retrofit",
        "finetune",
        str(path),
    ]
    res = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_ddp(out)


# ---- bad input: a clear error before any work starts ----------------------------------------
def _fails(tmp_path, exc, words, **over):
    out = tmp_path / "bad"
    with pytest.raises(exc) as e:
        finetune(recipe(out, **over))
    for w in words:
        assert w in str(e.value), str(e.value)
    assert not out.exists(), "work started before the error"


def test_missing_files(tmp_path):
    _fails(tmp_path, DataError, ["nothing-here"], data__files=str(tmp_path / "nothing-here" / "*.txt"))


def test_missing_hub_dataset(tmp_path, monkeypatch):
    """Offline (CI sets HF_HUB_OFFLINE) a Hub dataset not in the cache cannot be told from one that does not
    exist: a HubError (exit 5) naming it, at once. Online, a missing one is a DataError (datasets' not-found)."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    _fails(
        tmp_path,
        HubError,
        ["no-such-dataset-xyz", "cache"],
        data__files=None,
        data__dataset="no-such-org/no-such-dataset-xyz",
    )


def test_missing_dataset_field(tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "train.jsonl").write_text("".join(json.dumps({"content": "x" * 500}) + "\n" for _ in range(4)))
    _fails(tmp_path, DataError, ["text", "content"], data__files=None, data__dataset=str(ds))


def test_block_length_larger_than_documents(tmp_path):
    _fails(tmp_path, LengthError, ["data.block_length"], data__block_length=10**6)
    _fails(tmp_path, LengthError, ["data.block_length", "every"], data__block_length=50_000, data__packing=False)


def test_lora_targets_that_match_nothing(tmp_path):
    _fails(tmp_path, RecipeError, ["train.lora.target_modules", "q_proj"], train__lora={"target_modules": ["q_proj"]})


def test_steps_not_positive(tmp_path):
    _fails(tmp_path, RecipeError, ["train.steps"], train__steps=0)
    _fails(tmp_path, RecipeError, ["train.steps"], train__steps=-1)


def test_unconverted_block_past_native_length(tmp_path):
    _fails(tmp_path, LengthError, ["data.block_length", "64"], convert={"scheme": None})


def test_distill_offsets_and_fade(tmp_path, monkeypatch):
    """objective both + random offsets + native fade (the tiny-rope-distill recipe, shortened)."""
    import retrofit.patch.conversion

    calls = []
    real = retrofit.patch.conversion.place  # the placer's one hand-off to patch/

    def spy(model, placement):
        calls.append((placement.offset, placement.native_fade))
        return real(model, placement)

    monkeypatch.setattr(retrofit.patch.conversion, "place", spy)
    path = Path(__file__).resolve().parents[2] / "recipes" / "tiny-rope-distill.yaml"
    out = finetune(
        path,
        [
            f"output_dir={tmp_path / 'd'}",
            "data.dataset=null",
            f"data.files={json.dumps(FILES)}",
            "train.steps=8",
            "train.positions.native_fade_steps=4",
            "checkpoint.every=0",
        ],
    )
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    train = [x for x in log if "loss" in x]
    assert all(x["distill_loss"] >= 0 and abs(x["loss"] - x["lm_loss"] - x["distill_loss"]) < 1e-4 for x in train)
    steps = [c for c in calls if c != (0, 0.0)]  # the controls each training step set
    fades = [f for _, f in steps]
    assert fades[:4] == [1.0, 0.75, 0.5, 0.25] and all(f == 0 for f in fades[4:])
    assert all(o == 0 for o, f in steps if f > 0)  # block 64 = native 64: no room to shift while fading
    assert len({o for o, f in steps if f == 0}) > 1  # random offsets after the fade
    s = json.loads((out / "summary.json").read_text())
    assert s["val_loss_after"] < s["val_loss_before"]


def test_fade_needs_blocks_the_native_table_can_read(tmp_path):
    _fails(
        tmp_path,
        LengthError,
        ["native_fade_steps", "64"],
        convert={"scheme": "rope", "options": {}},
        train__positions={"native_fade_steps": 5},
    )


def test_full_method_keeps_the_native_table_frozen(tmp_path):
    out = finetune(
        recipe(tmp_path / "full", train__method="full", train__steps=3, checkpoint__every=0, train__learning_rate=1e-3)
    )
    assert not (out / "adapter").exists()
    base, _ = retrofit.load_model(str(tiny_gpt2()))
    final = retrofit.load(out / "final")
    sd_base, sd_final = base.state_dict(), final.state_dict()
    assert torch.equal(sd_base["transformer.wpe.weight"], sd_final["transformer.wpe.weight"])
    assert not torch.equal(
        sd_base["transformer.h.0.attn.c_attn.weight"], sd_final["transformer.h.0.attn.c_attn.weight"]
    )


def test_lora_with_trained_embeddings_merges(tmp_path):
    """train_embeddings on a tied-embedding model: the adapter alone re-merges to final/."""
    from peft import PeftModel

    out = finetune(
        recipe(
            tmp_path / "emb",
            train__steps=3,
            checkpoint__every=0,
            train__train_embeddings=True,
            train__train_norms=False,
        )
    )
    cfg = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert any(m.endswith("wte") for m in cfg["modules_to_save"])
    base, _ = retrofit.load_model(str(tiny_gpt2()))
    retrofit.convert(base, "alibi", kernel="chunked")
    merged = PeftModel.from_pretrained(base, out / "adapter").merge_and_unload()
    final = retrofit.load(out / "final")
    ids = _ids()
    torch.testing.assert_close(_logits(merged, ids), _logits(final, ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", retrofit.schemes())
def test_shift_invariant_flag_matches_the_model(scheme):
    """A scheme flagged shift_invariant gives the same logits when every position is shifted; one
    that is not (absolute or query-normalised positions) gives different ones."""
    from retrofit.scheme import SCHEMES

    from ..tiny import gpt2

    model = gpt2().eval()
    retrofit.convert(model, scheme, **({"kernel": "chunked"} if scheme != "nope" else {}))
    ids = torch.randint(0, model.config.vocab_size, (1, 48))
    with torch.no_grad():
        base = model(ids).logits
        retrofit.set_position_controls(model, offset=37)
        shifted = model(ids).logits
        retrofit.set_position_controls(model)
    same = torch.allclose(base, shifted, atol=1e-4, rtol=1e-4)
    assert same == SCHEMES.get(scheme).shift_invariant, (scheme, (base - shifted).abs().max().item())


def test_random_offset_on_a_shift_invariant_scheme_warns(tmp_path, caplog):
    caplog.set_level("WARNING", logger="retrofit.training")
    finetune(recipe(tmp_path / "w", train__steps=1, checkpoint__every=0, train__positions={"random_offset": 64}))
    assert "has no effect on 'alibi'" in caplog.text
    caplog.clear()
    finetune(
        recipe(
            tmp_path / "s",
            train__steps=1,
            checkpoint__every=0,
            convert={"scheme": "sinusoidal", "options": {}},
            train__positions={"random_offset": 64},
        )
    )
    assert "has no effect" not in caplog.text
