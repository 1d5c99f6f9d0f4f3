"""What a fine-tune leaves in its output folder: resumable checkpoints (atomic, the last K kept), the
JSONL log, and the final merged checkpoint (``final/``, plus ``adapter/`` for LoRA)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from ..foundation import run_folder as rf
from ..foundation.atomic import no_space, no_space_error, publish, write_dir, write_text
from ..foundation.errors import RetrofitError
from ..models.io import save
from . import model as mdl
from . import sharding
from .recipe import Recipe
from .tasks import model_task

log = logging.getLogger("retrofit.training.loop")


# ---- checkpoints ---------------------------------------------------------------------------
def checkpoints(out: Path) -> list[Path]:
    d = out / rf.CHECKPOINTS
    return sorted(p for p in d.glob("step_*") if p.is_dir()) if d.is_dir() else []


def save_checkpoint(acc, out: Path, step: int, keep: int) -> None:
    """save_state into a hidden folder, then rename: a kill mid-save never leaves a torn checkpoint, and
    a failed save (a full disk: an OutputError that says so) removes the hidden folder."""
    final = out / rf.CHECKPOINTS / f"step_{step:08d}"
    tmp = out / rf.CHECKPOINTS / f".tmp_step_{step:08d}"
    if acc.is_main_process:
        tmp.mkdir(parents=True, exist_ok=True)
    acc.wait_for_everyone()
    try:
        acc.save_state(str(tmp))
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if no_space(e, tmp):
            raise no_space_error(final) from e
        raise
    acc.wait_for_everyone()
    if acc.is_main_process:
        publish(tmp, final)
        for old in checkpoints(out)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()


def resume(r: Recipe, acc, out: Path) -> None:
    mode = r.checkpoint.resume
    if acc.is_main_process:
        for tmp in (out / rf.CHECKPOINTS).glob(".tmp_step_*"):
            shutil.rmtree(tmp, ignore_errors=True)
    if mode == "never":
        if acc.is_main_process and checkpoints(out):
            log.warning("checkpoint.resume is never: removing old checkpoints in %s", out / rf.CHECKPOINTS)
            shutil.rmtree(out / rf.CHECKPOINTS, ignore_errors=True)
            (out / rf.LOG).unlink(missing_ok=True)
        acc.wait_for_everyone()
        return
    path = Path(mode) if mode != "auto" else (checkpoints(out) or [None])[-1]
    acc.wait_for_everyone()
    if path is None:
        if acc.is_main_process:
            (out / rf.LOG).unlink(missing_ok=True)
        return
    log.info("resuming from %s", path)
    acc.load_state(str(path))


def truncate_log(out: Path, step: int) -> None:
    """Drop log records written after the checkpoint we resume from (the killed run's tail)."""
    p = out / rf.LOG
    if not p.is_file():
        return
    keep = [line for line in p.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    write_text(p, "".join(line + "\n" for line in keep))


# ---- output --------------------------------------------------------------------------------
def log_record(acc, out: Path, record: dict) -> None:
    if not acc.is_main_process:
        return
    out.mkdir(parents=True, exist_ok=True)
    record = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in record.items()}
    with open(out / rf.LOG, "a") as f:
        f.write(json.dumps(record) + "\n")
    log.debug("%s", record)


def write_final(r: Recipe, acc, model, tok) -> None:
    """adapter/ (LoRA) and final/ (merged, patched) through retrofit.save, from the main process."""
    sharded = sharding.is_sharded(acc)
    state = acc.get_state_dict(model) if sharded else None  # collective: every process takes part
    if acc.is_main_process:
        write_outputs(r, rebuilt(r, state)[0] if sharded else acc.unwrap_model(model), tok)
    acc.wait_for_everyone()


def write_outputs(r: Recipe, unwrapped, tok) -> Path:
    """adapter/ (LoRA: the PEFT adapter alone) and final/ (merged, patched) from a trained model."""
    out = Path(r.output_dir)
    unwrapped.eval()
    if r.train.method == "lora":

        def adapter(tmp: Path) -> None:
            unwrapped.save_pretrained(tmp, save_embedding_layers=False)  # trained embeddings: modules_to_save
            tok.save_pretrained(tmp)
            write_text(tmp / rf.ADAPTER_BASE, json.dumps(adapter_base(r), indent=2) + "\n")

        write_dir(out / rf.ADAPTER, adapter)
        unwrapped = unwrapped.merge_and_unload()
    save(unwrapped, out / rf.FINAL, tokenizer=tok)
    if r.task == "embedding":
        sentence_transformers_files(out / rf.FINAL, r.data.block_length)
    return out / rf.FINAL


# the tokenizer config carries the length it reads (sentence-transformers 5+: model_max_length)
ST_FILES = (*rf.ST_FILES, "tokenizer_config.json")


def sentence_transformers_files(final: Path, max_length: int) -> None:
    """The files that make ``SentenceTransformer(final)`` the trained embedding model (the encoder, mean pooling,
    texts read to ``max_length`` tokens), as the installed sentence-transformers writes them: its own ``save`` into
    a scratch folder, of which the module files are kept (the weights stay retrofit's)."""
    import tempfile

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer

    encoder = Transformer(str(final))
    width = getattr(encoder, "get_embedding_dimension", None) or encoder.get_word_embedding_dimension  # ST 6 / 3-5
    st = SentenceTransformer(modules=[encoder, Pooling(width(), "mean")], device="cpu")
    st.max_seq_length = max_length
    with tempfile.TemporaryDirectory() as tmp:
        st.save(tmp)
        for f in sorted(Path(tmp).rglob("*.json")):
            rel = f.relative_to(tmp)
            if rel.parent != Path(".") or rel.name in ST_FILES:  # its modules' folders and its own files
                (final / rel).parent.mkdir(parents=True, exist_ok=True)
                write_text(final / rel, f.read_text())


def adapter_base(r: Recipe) -> dict:
    """What ``retrofit.load(adapter/)`` rebuilds the adapter's base from: the model as the recipe names it and
    the conversion (a built-in or Hub name loads anywhere; a local path only where it exists)."""
    m, c = r.model, r.convert
    return {
        "model": {"name_or_path": m.name_or_path, "gguf_file": m.gguf_file, "dtype": m.dtype},
        "convert": {"scheme": c.scheme, "options": dict(c.options or {})},
    }


def rebuilt(r: Recipe, state: dict | None = None):
    """(model, tokenizer): a fresh model converted and wrapped as the recipe says, holding ``state``
    (the gathered weights of a sharded run, or a checkpoint's) when given."""
    with sharding.whole_models():
        model, tok = mdl.load(r.model, model_task(r))
        mdl.convert(model, r.convert)
        model = mdl.make_trainable(model, r.train)
    if state is not None:
        _fit(model, state)
    return model, tok


def _fit(model, state: dict) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RetrofitError(
            f"the weights do not fit the model the recipe builds: missing {sorted(missing)[:8]}, unexpected "
            f"{sorted(unexpected)[:8]}; was the checkpoint written by this recipe?"
        )


def final_from(r: Recipe, checkpoint: Path, trust_pickle: bool = False) -> Path:
    """final/ (and adapter/) from a checkpoint folder, on one process (``--final-from``)."""
    from . import consolidate

    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise RetrofitError(f"--final-from {checkpoint}: no such folder")
    consolidate.layout(checkpoint)  # a clear error before the model is loaded
    model, tok = rebuilt(r)
    state = consolidate.read(checkpoint, model.state_dict(), trust_pickle=trust_pickle)
    _fit(model, state)
    log.info("final/ from %s (%d tensors)", checkpoint, len(state))
    return write_outputs(r, model, tok)
