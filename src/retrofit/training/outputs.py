"""What a fine-tune leaves in its output folder: resumable checkpoints (atomic, the last K kept), the
JSONL log, and the final merged checkpoint (``final/``, plus ``adapter/`` for LoRA)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from ..data.specs import fingerprint
from ..foundation import run_folder
from ..foundation.atomic import no_space, no_space_error, publish, write_dir, write_text
from ..foundation.errors import RetrofitError
from ..foundation.versions import library_versions
from ..models.io import save
from ..models.sources import sentence_transformers_source
from . import sharding
from .model import convert, load, make_trainable, trainable_hash
from .recipe import Recipe, tokens_per_step
from .stream import StreamSource
from .tasks import Objective, model_task

log = logging.getLogger(__name__)


# ---- the run's records ------------------------------------------------------------------------
def write_run_info(r: Recipe, out: Path, model, train, val, processes: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / run_folder.RECIPE, r.to_yaml())  # resolved: train.steps as the budget sets it
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    info = {
        "versions": library_versions(),
        "trainable_parameters": trainable,
        "total_parameters": sum(p.numel() for p in model.parameters()),
        "validation_blocks": len(val),
    }
    if r.task is not None:
        info["task"] = r.task
    if r.task is not None and not isinstance(train, StreamSource):
        info["train_examples"] = len(train)
    elif isinstance(train, StreamSource):
        info.update(
            train_stream=train.what,
            validation_documents=train.validation_documents,
            budget_tokens=r.train.steps * tokens_per_step(r.train, r.data.block_length, processes),
        )
    else:
        info.update(
            train_blocks=len(train),
            train_fingerprint=fingerprint(train.flatten().tolist()),
            validation_fingerprint=fingerprint(val.flatten().tolist()),
        )
    write_text(out / run_folder.VERSIONS, json.dumps(info, indent=2) + "\n")


def save_interrupted(c, acc, out: Path, at: tuple[int, int], where, meter) -> None:
    """Ctrl-C at step ``at`` = (step, of steps): a checkpoint there (unless the ``checkpoint`` section ``c`` just
    wrote one), then KeyboardInterrupt."""
    step, steps = at
    meter.bar.close()
    if not (c.every and step % c.every == 0):
        if where is not None:
            where.save()
        save_checkpoint(acc, out, step, max(c.keep_last, 1))
    resumes = (
        "the same command resumes from it"
        if c.resume != "never"
        else (
            "this recipe has checkpoint.resume: never, so a re-run starts again; pass --set checkpoint.resume=auto "
            "to resume from it"
        )
    )
    log.warning(
        "interrupted after step %d of %d: saved %s; %s",
        step,
        steps,
        out / run_folder.CHECKPOINTS / f"step_{step:08d}",
        resumes,
    )
    raise KeyboardInterrupt


def rank_checksums(out: Path, acc, base, where) -> None:
    """``train.rank_checksums`` (the caller asks): a digest of this process's trainable weights (and of the stream
    blocks it read), in ``out``'s rank_checksums/."""
    d = out / run_folder.RANK_CHECKSUMS
    d.mkdir(parents=True, exist_ok=True)
    write_text(d / f"rank{acc.process_index}.txt", trainable_hash(base) + "\n")
    if where is not None:  # the blocks this process read from the stream, one digest per line
        write_text(d / f"rank{acc.process_index}.blocks.txt", "".join(x + "\n" for x in where.seen))


def heldout(acc, model, val_loader, objective) -> dict | None:
    """A classifier's accuracy and macro-F1, an embedding model's top-1, on the validation examples (said)."""
    if not isinstance(objective, Objective):
        return None
    metrics = objective.metrics(model, val_loader, acc.gather_for_metrics)
    log.info("held out: %s", ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
    return {"heldout": metrics}


def val_change(before: float | None, after: float | None) -> str:
    if before is None and after is None:
        return "no validation loss (no validation blocks)"
    show = lambda v: "none" if v is None else f"{v:.4f}"  # noqa: E731
    return f"val loss {show(before)} -> {show(after)}"


# ---- checkpoints ---------------------------------------------------------------------------
def checkpoints(out: Path) -> list[Path]:
    d = out / run_folder.CHECKPOINTS
    return sorted(p for p in d.glob("step_*") if p.is_dir()) if d.is_dir() else []


def resuming(c, out: Path) -> bool:
    """A run that will load a checkpoint (the ``checkpoint`` section ``c``; the scheme's parameters included):
    calibrating again is wasted."""
    if c.resume == "never":
        return False
    if c.resume != "auto" or checkpoints(out):
        log.info("convert.calibrate: not calibrating again, the run resumes from a checkpoint")
        return True
    return False


def save_checkpoint(acc, out: Path, step: int, keep: int) -> None:
    """save_state into a hidden folder, then rename: a kill mid-save never leaves a torn checkpoint, and
    a failed save (a full disk: an OutputError that says so) removes the hidden folder."""
    final = out / run_folder.CHECKPOINTS / f"step_{step:08d}"
    tmp = out / run_folder.CHECKPOINTS / f".tmp_step_{step:08d}"
    if acc.is_main_process:
        tmp.mkdir(parents=True, exist_ok=True)
    acc.wait_for_everyone()
    try:
        # raw write: Accelerate's save_state into a hidden folder that publish() renames
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


def resume(c, acc, out: Path) -> None:
    """Where the run starts, as the ``checkpoint`` section ``c`` says (``resume``: auto, never or a folder)."""
    mode = c.resume
    if acc.is_main_process:
        for tmp in (out / run_folder.CHECKPOINTS).glob(".tmp_step_*"):
            shutil.rmtree(tmp, ignore_errors=True)
    if mode == "never":
        if acc.is_main_process and checkpoints(out):
            log.warning("checkpoint.resume is never: removing old checkpoints in %s", out / run_folder.CHECKPOINTS)
            shutil.rmtree(out / run_folder.CHECKPOINTS, ignore_errors=True)
            (out / run_folder.LOG).unlink(missing_ok=True)
        acc.wait_for_everyone()
        return
    path = Path(mode) if mode != "auto" else (checkpoints(out) or [None])[-1]
    acc.wait_for_everyone()
    if path is None:
        if acc.is_main_process:
            (out / run_folder.LOG).unlink(missing_ok=True)
        return
    log.info("resuming from %s", path)
    acc.load_state(str(path))


def truncate_log(out: Path, step: int) -> None:
    """Drop log records written after the checkpoint we resume from (the killed run's tail)."""
    p = out / run_folder.LOG
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
    # raw write: log.jsonl is appended to, a line per record (a rename per line would copy the whole log each step);
    # resume cuts it back to the checkpoint's step
    with open(out / run_folder.LOG, "a") as f:
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
            # raw write: adapter/: inside write_dir's temporary folder
            unwrapped.save_pretrained(tmp, save_embedding_layers=False)  # trained embeddings: modules_to_save
            tok.save_pretrained(tmp)
            write_text(tmp / run_folder.ADAPTER_BASE, json.dumps(adapter_base(r), indent=2) + "\n")

        write_dir(out / run_folder.ADAPTER, adapter)
        unwrapped = unwrapped.merge_and_unload()
    save(unwrapped, out / run_folder.FINAL, tokenizer=tok)
    if r.task == "embedding":
        sentence_transformers_files(
            out / run_folder.FINAL,
            reads_to(unwrapped, r.data.block_length),
            sentence_transformers_source(r.model.name_or_path, r.model.gguf_file),
        )
    return out / run_folder.FINAL


def reads_to(model, block_length: int) -> int:
    """Where ``SentenceTransformer(final)`` cuts a text: the trained model's reach where it has one (``extend``'s
    table, as ``retrofit convert`` and the native export write it), else the length it was trained at
    (``data.block_length``: an unbounded scheme names no length of its own; ``model.max_seq_length`` reads further)."""
    from ..patch.conversion import UNBOUNDED, reach

    limit = reach(model)
    return limit if limit < UNBOUNDED else block_length


# the tokenizer config carries the length it reads (sentence-transformers 5+: model_max_length)
ST_FILES = (*run_folder.ST_FILES, "tokenizer_config.json")


def sentence_transformers_files(final: Path, max_length: int, source: Path | None = None) -> None:
    """The files that make ``SentenceTransformer(final)`` the trained embedding model (the encoder, mean pooling as
    the objective trained it, texts read to ``max_length`` tokens (``reads_to``), and the source model's ``Normalize`` when it had
    one), as the installed sentence-transformers writes them: its own ``save`` into a scratch folder, of which the
    module files are kept (the weights stay retrofit's)."""
    import tempfile

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer

    encoder = Transformer(str(final))
    width = getattr(encoder, "get_embedding_dimension", None) or encoder.get_word_embedding_dimension  # ST 6 / 3-5
    st = SentenceTransformer(modules=[encoder, Pooling(width(), "mean"), *after_pooling(source)], device="cpu")
    st.max_seq_length = max_length
    with tempfile.TemporaryDirectory() as tmp:
        st.save(tmp)
        for f in sorted(Path(tmp).rglob("*.json")):
            rel = f.relative_to(tmp)
            if rel.parent != Path(".") or rel.name in ST_FILES:  # its modules' folders and its own files
                (final / rel).parent.mkdir(parents=True, exist_ok=True)
                write_text(final / rel, f.read_text())


def after_pooling(source: Path | None) -> list:
    """The source embedding model's modules after its pooling that the fine-tune keeps: ``Normalize`` (no weights:
    unit vectors, what dot-product search expects); any other (e.g. a ``Dense`` the objective never trained) is
    dropped, and said."""
    modules = (
        json.loads((source / "modules.json").read_text()) if source and (source / "modules.json").is_file() else []
    )
    types = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
    later = types[types.index("Pooling") + 1 :] if "Pooling" in types else []
    dropped = [t for t in later if t != "Normalize"]
    if dropped:
        log.warning("%s's modules %s after pooling are not kept (the objective trained without them)", source, dropped)
    if "Normalize" not in later:
        return []
    from sentence_transformers.models import Normalize

    log.info("the embedding model keeps %s's Normalize: unit vectors", source)
    return [Normalize()]


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
        model, tok = load(r.model, model_task(r))
        convert(model, r.convert)
        model = make_trainable(model, r.train)
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
