"""What a model card states, read from a run folder (recipe, fine-tune summary, eval report, export record):
``card_context`` gathers it as the data the template sees (``retrofit.publishing.cards`` renders it). The card's YAML
front matter is Hub metadata (``base_model``, ``library_name``, ``tags``, ``license``, ``datasets``,
``pipeline_tag``, ``model-index`` with the perplexity results), built here as data (``metadata``).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ..foundation import run_folder
from ..foundation.errors import RetrofitError
from ..foundation.versions import DISTRIBUTION
from ..models import builtin

# Licences of Hub base models we know (the Hub cannot be asked offline). A built-in name takes that of the Hub
# weights it stands for (builtin.HUB_IDS), or retrofit's own (builtin.OWN_LICENSE).
KNOWN_LICENSES = {
    "gpt2": "mit",
    "openai-community/gpt2": "mit",
    "gpt2-medium": "mit",
    "openai-community/gpt2-medium": "mit",
    "distilgpt2": "apache-2.0",
    "distilbert/distilgpt2": "apache-2.0",
    "HuggingFaceTB/SmolLM2-135M": "apache-2.0",
    "HuggingFaceTB/SmolLM2-135M-Instruct": "apache-2.0",
    "HuggingFaceTB/SmolLM2-360M": "apache-2.0",
    "EleutherAI/pythia-70m": "apache-2.0",
    "EleutherAI/pythia-160m": "apache-2.0",
    "facebook/opt-125m": "other",
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def hub_base_model(name: str) -> str | None:
    """The Hub id a recipe's model name stands for (None for local paths and retrofit's own models)."""
    if name in builtin.HUB_IDS:
        return builtin.HUB_IDS[name]
    if builtin.is_standin(name) or Path(name).expanduser().exists() or not _HUB_ID.match(name):
        return None
    return name


def base_license(name: str) -> tuple[str | None, str]:
    """(licence id, where it came from) for a base model; (None, reason) when unknown."""
    if builtin.is_standin(name):
        return (
            builtin.OWN_LICENSE,
            "trained by retrofit.models.baseline on public-domain plays",
        )  # the cards' words, as before the rename
    hub_id = builtin.HUB_IDS.get(name, name)  # a built-in name: the Hub weights it stands for, if any
    if hub_id is None:
        return builtin.OWN_LICENSE, "retrofit's table of known base models"
    if hub_id in KNOWN_LICENSES:
        return KNOWN_LICENSES[hub_id], "retrofit's table of known base models"
    for readme in _local_readmes(name):
        meta = _front_matter(readme.read_text(errors="replace"))
        if meta.get("license"):
            return str(meta["license"]), f"the base model's card ({readme.name})"
    return None, "unknown: set card.license"


def _local_readmes(name: str) -> list[Path]:
    out = [Path(name).expanduser() / run_folder.CARD]
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(name, run_folder.CARD)
        if isinstance(hit, str):
            out.append(Path(hit))
    except Exception:  # not a valid repo id, no cache: nothing to read
        pass
    return [p for p in out if p.is_file()]


def _front_matter(text: str) -> dict:
    m = re.match(r"^---\n(.*?)\n---", text, re.DOTALL)
    try:
        return (yaml.safe_load(m.group(1)) or {}) if m else {}
    except yaml.YAMLError:
        return {}


def _hub_dataset(spec) -> str | None:
    from ..data.longdoc import is_spec
    from ..data.specs import source_kind

    if not isinstance(spec, str) or not spec or is_spec(spec) or source_kind(spec) != "hub":
        return None  # a local or built-in source, or an offline long-document task: no Hub dataset
    return spec.split(":")[0]


# ---- the context the template sees ------------------------------------------------------------------
def card_context(run_dir: str | Path, repo: str | None = None) -> dict:
    """Everything the card shows, read from the folder: a ``retrofit run`` or ``retrofit finetune``
    output (recipe, final/, summary) or a ``retrofit convert`` checkpoint; the fine-tune and
    evaluation parts are left out where the folder has none (``retrofit eval DIR`` adds eval/)."""
    run_dir = Path(run_dir)
    folder = run_folder.model_dir(run_dir)
    if not run_folder.is_model_dir(folder):
        raise RetrofitError(f"{run_dir} holds no model (config.json and *.safetensors, in it or in its final/)")
    block = run_folder.retrofit_block(folder)
    recipe = run_folder.recipe(run_dir) or {}
    report = run_folder.report(run_dir)
    summary = run_folder.summary(run_dir) or {}
    info = run_folder.versions(run_dir) or {}
    manifest = run_folder.manifest(run_dir) or {"stages": {}}
    base = _base_name(recipe, block, folder)
    native = run_folder.native_length(folder)
    what = task_of(folder)
    masked = bool(report) and report.get("kind") == "masked-lm"  # evaluation.masked: its own table
    task_eval = bool(report) and report.get("kind") == longdoc_kind()  # a classifier's or embedding model's
    trained = bool(recipe.get("train")) and folder.name == run_folder.FINAL
    ctx = {
        "recipe": recipe,
        "report": report,
        "summary": summary,
        "manifest": manifest,
        "base": base_info(base, recipe, folder),
        "conversion": {
            "scheme": block.get("scheme"),
            "options": block.get("options") or {},
            "native_length": native,
            "native_note": native_note(block),
        },
        "budget": budget(recipe, summary, info, report or {}, manifest) if trained else None,
        "sentence_transformers": bool(
            run_folder.st_files(folder)
        ),  # an embedding model with its modules (mean pooling)
        "eval": eval_summary(report, native) if report and not (masked or task_eval) else None,
        "masked_eval": _masked_table(report) if masked else None,
        "task_eval": _task_table(report) if task_eval else None,
        "task": what,
        "folder": str(run_dir),
        "export": export_info(run_dir, manifest),
        "repo": repo or (recipe.get("push") or {}).get("repo"),
        "versions": info.get("versions") or {"retrofit": block.get("retrofit_version")},
        "distribution": DISTRIBUTION,  # what `pip install` takes (the import name is retrofit)
    }
    ctx["load"] = load_info(run_dir, ctx["repo"])
    ctx["limits"] = limits(ctx) + list((recipe.get("card") or {}).get("limits") or [])
    ctx["metadata"] = metadata(ctx)
    ctx["title"] = ctx["repo"] or f"{base} → {ctx['conversion']['scheme'] or 'unconverted'}"
    return ctx


def _base_name(recipe: dict, block: dict, folder: Path) -> str:
    """The base model's name: the recipe's, unless that is itself a retrofit checkpoint (a fine-tune
    that went on from ``retrofit convert``'s output): then the name that checkpoint was converted from."""
    name = (recipe.get("model") or {}).get("name_or_path")
    if name and not (Path(name).expanduser() / "config.json").is_file():
        return name
    earlier = run_folder.retrofit_block(Path(name).expanduser()) if name else {}
    return earlier.get("base_model") or block.get("base_model") or name or str(folder)


def base_info(name: str, recipe: dict, folder: Path) -> dict:
    lic, lic_source = base_license(name)
    override = (recipe.get("card") or {}).get("license")
    config = run_folder.read_json(folder / "config.json") or {}
    base_config = (config.get("retrofit") or {}).get("base_config") or {}
    out = {
        "name": name,
        "hub_id": hub_base_model(name),
        "license": lic,
        "license_source": lic_source,
        "card_license": override or lic,
        "native": {
            "kind": None,
            "length": None,  # an unconverted fine-tune records none
            **((config.get("retrofit") or {}).get("native") or {}),
        },
        "model_type": base_config.get("model_type") or config.get("model_type"),
        "pretrain": None,
    }
    preset = builtin.standin_preset(name)
    if preset is not None:
        from ..foundation.errors import OptionError
        from ..models.standin import STATS_FILE, output_dir

        try:  # where pretrain() caches it (never pretrains here)
            stats = run_folder.read_json(output_dir(preset) / STATS_FILE)
        except OptionError:
            stats = None
        if stats:
            out["pretrain"] = {
                k: stats.get(k)
                for k in ("preset", "n_params", "pretrain_tokens", "heldout_ppl", "native_length", "vocab_size")
            }
    return out


# what a task run (a recipe's ``task``) trains on, as the card says it (training/tasks.py has the losses)
TASK_OBJECTIVES = {
    "classification": "classification objective: the classifier's cross-entropy over its classes",
    "embedding": "contrastive embedding objective: mean pooling, MultipleNegativesRankingLoss over (query, document) pairs",
}


def _objective(recipe: dict) -> str:
    """The card's words for what the fine-tune trained on: a task's objective (with its distillation), or the LM's."""
    t = recipe["train"]
    said = TASK_OBJECTIVES.get(recipe.get("task"), f"{t['objective']} objective")
    if recipe.get("task") != "embedding" or t.get("objective", "lm") == "lm":
        return said
    kd = "1 - cosine to the unconverted original's vectors of the queries and the documents cut at its native length"
    return kd if t["objective"] == "distill" else f"{said} + {t.get('distill_weight', 1.0)} x ({kd})"


def budget(recipe: dict, summary: dict, info: dict, report: dict, manifest: dict) -> dict:
    t, d = recipe["train"], recipe["data"]
    steps = summary.get("steps") or t["steps"]
    processes = summary.get("num_processes") or 1
    tokens = steps * t["batch_size"] * t.get("gradient_accumulation_steps", 1) * d["block_length"] * processes
    hw = (report.get("environment") or {}).get("hardware") or {}
    stage = (manifest.get("stages") or {}).get("finetune") or {}
    return {
        "method": t["method"],
        "objective": _objective(recipe),
        "steps": steps,
        "tokens": tokens,
        "block_length": d["block_length"],
        "batch": t["batch_size"] * t.get("gradient_accumulation_steps", 1) * processes,
        "learning_rate": t["learning_rate"],
        "data": d.get("dataset") or d.get("files"),
        "trainable_parameters": info.get("trainable_parameters"),
        "total_parameters": info.get("total_parameters"),
        "train_seconds": summary.get("train_seconds"),
        "stage_seconds": stage.get("seconds"),
        "hardware": _hardware(hw),
        "processes": processes,
        "val_loss_before": summary.get("val_loss_before"),
        "val_loss_after": summary.get("val_loss_after"),
        "resumed_from_step": summary.get("resumed_from_step"),
    }


def _hardware(hw: dict) -> str:
    """The card's hardware row, from the eval report's environment (the run's own records hold none): what is
    recorded, and "not recorded" before any eval, never "None"."""
    if hw.get("gpu"):
        return hw["gpu"]
    if not hw:
        return "not recorded (no evaluation report in the run yet)"
    counts = [
        f"{hw[k]} {what}" for k, what in (("cpu_count", "cores"), ("torch_threads", "torch threads")) if hw.get(k)
    ]
    return (hw.get("cpu") or "CPU") + (f" ({', '.join(counts)})" if counts else "")


def task_of(folder: Path):
    """The task the checkpoint's config names (``task.of_class`` of its architectures): the card's Auto class,
    pipeline tag and model-index task."""
    import json

    from ..foundation.task import of_class

    config = json.loads((folder / "config.json").read_text())
    base = (config.get("retrofit") or {}).get("base_config") or {}
    return of_class(((base.get("architectures") or config.get("architectures")) or [None])[0])


def longdoc_kind() -> str:
    from ..evaluation.longdoc import REPORT_KIND

    return REPORT_KIND


def _task_table(report: dict) -> str:
    from ..evaluation.longdoc import table

    return table(report)


def _masked_table(report: dict) -> str:
    from ..evaluation.masked import markdown

    return markdown(report, heading=False)


def eval_summary(report: dict, native: int) -> dict:
    """The report's tables (markdown) and the headline numbers the card quotes."""
    from ..evaluation.markdown import passkey_table, ppl_table
    from ..evaluation.report import Report

    r = Report(report)
    main = report["models"][0]["name"]
    rows = [x for x in report["rows"] if x["model"] == main and x["method"] == "non-overlapping"]
    lengths = report["settings"]["lengths"]
    by_model = {}
    for x in report["rows"]:
        if x["method"] == "non-overlapping" or x["model"] not in by_model:
            by_model.setdefault(x["model"], {})[x["length"]] = x
    plots = report.get("plots") or []
    return {
        "main": main,
        "data": report["data"],
        "lengths": lengths,
        "rows": rows,
        "native": native,
        "max_length": max(lengths),
        "ppl_table": ppl_table(r),
        "by_model": by_model,
        "passkey_table": passkey_table(r) if report.get("passkey") else None,
        "passkey": _passkey_summary(report) if report.get("passkey") else None,
        "plot": f"{run_folder.EVAL}/{run_folder.PLOT_PPL}" if run_folder.PLOT_PPL in plots else None,
        "passkey_plot": f"{run_folder.EVAL}/{run_folder.PLOT_PASSKEY}" if run_folder.PLOT_PASSKEY in plots else None,
        "notes": list(dict.fromkeys(x["note"] for x in report["rows"] if x["note"] and x["method"] == "sliding")),
        "models": report["models"],
        "use": _use(report, main),
    }


def _use(report: dict, main: str) -> list[str]:
    """What the model uses of a long input, as measured: the report's verdict sentences (``evaluation.verdict``,
    as report.md opens) for the model the card is about (runs or breaks down, reads or not, effective reach)."""
    from ..evaluation.verdict import lines, verdict

    v = report.get("verdict") or verdict(report)
    mine = [m for m in v["models"] if m["model"] == main]
    return lines({"models": mine, "passkey_uninformative": [], "recall_uninformative": []})


def _passkey_summary(report: dict) -> dict:
    out = {}
    for x in report["passkey"]:
        if x["accuracy"] is None:
            continue
        s = out.setdefault(x["model"], {"correct": 0, "trials": 0})
        s["correct"] += x["correct"]
        s["trials"] += x["trials"]
    return out


def native_note(block: dict) -> str:
    """What became of the model's own positional mechanism, from the checkpoint's ``native.kind`` (the
    adapter's: a learned position table, or rotary embeddings, which have no weights)."""
    scheme, native = block.get("scheme"), block.get("native") or {}
    if not scheme:
        return "Not converted: the model keeps its native positions."
    kind, n = native.get("kind"), native.get("length")
    if kind in ("learned_absolute", "sinusoidal"):  # adapters.base.TABLE_KINDS: a table of learned rows or sinusoids
        rows = f" ({n:,} rows)" if n else ""
        what = "learned position table" if kind == "learned_absolute" else "table of fixed sinusoids"
        return (
            f"The native {what}{rows} is kept in the weights under its own name, frozen and "
            f"unused: {scheme} gives the positions."
        )
    if kind == "rope":
        return (
            f"The native rotary embedding (RoPE, which has no weights) is switched off (an identity rotation): "
            f"{scheme} gives the positions."
        )
    return f"{scheme} replaces the native positions ({(kind or 'of an unrecorded kind').replace('_', ' ')})."


def load_info(run_dir: Path, repo: str | None) -> dict:
    """Where the card's loading code points: for a card made for ``repo``, the repo as ``retrofit push``
    lays it out (``run_folder.published_layout``); else the local folders that hold the weights."""
    run_dir = Path(run_dir)
    root = run_folder.published_layout(run_dir)[""]
    checkpoint = run_folder.model_dir(run_dir)
    if repo:
        return {
            "hub": True,
            "root": repo,
            "native_args": f'"{repo}", subfolder="native"',
            "native_where": "`native/`",
            "checkpoint": None,
        }
    export = run_folder.export_dir(run_dir)
    return {
        "hub": False,
        "root": str(root),
        "native_args": f'"{export}"',
        "native_where": f"`{export}/`",
        "checkpoint": str(checkpoint) if root == export and run_folder.is_model_dir(checkpoint) else None,
    }


def export_info(run_dir: Path, manifest: dict) -> dict:
    """The native export: status, where the pushed weights come from, and the export's own record."""
    e = (manifest.get("stages") or {}).get("export") or {}
    record = run_folder.export_record(run_dir) or {}
    root = run_folder.published_weights(run_dir)
    return {
        "status": e.get("status") or ("done" if record else "not run"),
        "reason": e.get("reason") or e.get("error"),
        "native": root == "native",
        "subfolder": bool(record) and root != "native",
        "record": record,
        "target": record.get("target"),
        "exact": record.get("exact"),
        "exact_below": record.get("exact_below"),
        "max_diff": record.get("max_abs_logit_diff"),
        "check_length": record.get("check_length"),
        "notes": record.get("notes") or [],
    }


def limits(ctx: dict) -> list[str]:
    """Limitations that follow from this run's numbers and settings."""
    b, ev, base = ctx["budget"], ctx["eval"], ctx["base"]
    out = (
        []
        if b
        else [
            "Not fine-tuned: the positions were swapped but the weights were not adapted to them, so expect "
            "a higher perplexity than the original's until it is fine-tuned (`retrofit finetune`)."
        ]
    )
    if ev is None and (ctx.get("masked_eval") or ctx.get("task_eval")):
        return out + _common_limits(ctx)  # measured on its own terms (a masked LM's, a task's table)
    if ev is None:
        return (
            out
            + [
                f"Not evaluated: `retrofit eval {ctx['folder']}` measures it past its native length "
                "(then `retrofit card` adds the figures here)."
            ]
            + _common_limits(ctx)
        )
    rows = {x["length"]: x["ppl"] for x in ev["rows"]}
    n, top = ev["native"], ev["max_length"]
    out.append(_native_quality(b, ev, rows.get(n), base))
    if n in rows and top in rows and top != n:
        out.append(
            f"Measured up to {top:,} tokens ({top / n:g}x native): perplexity {_trend(rows[n], rows[top])} "
            f"{rows[n]:.2f} at {n:,} to {rows[top]:.2f} at {top:,}. Longer inputs were not measured."
        )
    out.append(
        f"Evaluated on {ev['data']['tokens']:,} tokens of `{ev['data']['spec']}` only; other domains were not tested."
    )
    if ev["passkey"]:
        s = ev["passkey"].get(ev["main"]) or {"correct": 0, "trials": 0}
        out.append(
            f"Passkey retrieval: {s['correct']}/{s['trials']} correct over the grid; "
            "long-range retrieval is not what a short positional fine-tune teaches."
        )
    return out + _common_limits(ctx)


def _trend(at_native: float, at_top: float) -> str:
    """The words before "A at n to B at top", following the numbers."""
    if at_top == at_native:
        return "is unchanged from"
    way = "rises" if at_top > at_native else "falls"
    slightly = max(at_top, at_native) <= min(at_top, at_native) * 1.02
    return f"{way} slightly (under 2%) from" if slightly else f"{way} from"


def _common_limits(ctx: dict) -> list[str]:
    base, conv = ctx["base"], ctx["conversion"]
    out = []
    if conv["scheme"] == "alibi":
        out.append(
            "ALiBi biases attention towards recent tokens: distant context contributes less than in "
            "a model trained for long inputs."
        )
    if base["pretrain"]:
        p = base["pretrain"]
        out.append(
            f"The base model is a {p['n_params']:,}-parameter stand-in pretrained on {p['pretrain_tokens']:,} "
            f"tokens of Shakespeare (held-out perplexity {p['heldout_ppl']:.1f}); it is a demonstration, "
            "not a useful language model."
        )
    if not base["card_license"]:
        out.append("The base model's licence is not known to retrofit: check it before using this model.")
    x = ctx["export"]
    if x["subfolder"]:
        out.append(
            f"The native {x['target']} export in {ctx['load']['native_where']} is not exact at every length "
            f"(max logit difference "
            f"{x['max_diff']:.3g} at {x['check_length']:,} tokens); the exact model needs `retrofit`."
        )
    elif not x["native"]:
        out.append("Loading needs `retrofit`: there is no native transformers export (see How to load).")
    return out


def _native_quality(b: dict, ev: dict, ppl_native: float | None, base: dict) -> str:
    """How the fine-tuned model compares with the unconverted original at the native length."""
    text = f"Fine-tuned for {b['steps']:,} steps ({b['tokens']:,} tokens) only." if b else "Not fine-tuned."
    orig = next(
        (
            ev["by_model"][m["name"]].get(ev["native"])
            for m in ev["models"]
            if m["role"] == "baseline" and not m["converted"] and m["name"] in ev["by_model"]
        ),
        None,
    )
    n = ev["native"]
    if ppl_native is None:
        measured = ", ".join(f"{x:,}" for x in ev["lengths"])
        return text + (
            f" The evaluation has no column at its native length ({n:,} tokens; measured: {measured}), "
            "so this card cannot compare it with the original there."
        )
    if orig is None:
        return text + (
            f" The original was not evaluated alongside it (`--baseline original` adds it), so this card "
            f"cannot compare its {ppl_native:.2f} perplexity at the native length ({n:,} tokens) with "
            "the original's."
        )
    if orig["method"] != "non-overlapping":
        return text + (
            f" Compare its {n:,}-token column with the original's ({orig['method']} windows there) "
            "before relying on it."
        )
    if ppl_native > orig["ppl"]:
        return text + (
            f" At the native length it is worse than the original ({ppl_native:.2f} vs {orig['ppl']:.2f} "
            "perplexity): the conversion costs some quality that a longer fine-tune would recover."
        )
    extra = ""
    if b and base["pretrain"] and base["pretrain"].get("pretrain_tokens"):
        extra = (
            f"; part of that gain is the extra training ({b['tokens'] / base['pretrain']['pretrain_tokens']:.0%} "
            "of the base model's pretraining tokens), not the new positions"
        )
    return text + f" At the native length it scores {ppl_native:.2f} vs the original's {orig['ppl']:.2f}{extra}."


def metadata(ctx: dict) -> dict:
    """Hub metadata for the YAML front matter."""
    recipe, base, conv = ctx["recipe"], ctx["base"], ctx["conversion"]
    card = recipe.get("card") or {}
    meta: dict = {}
    if base["hub_id"]:
        meta["base_model"] = base["hub_id"]
    meta["library_name"] = (
        "sentence-transformers"  # what loads it with its pooling (retrofit imported for a retrofit checkpoint)
        if ctx["sentence_transformers"]
        else "transformers"
        if ctx["export"]["native"]
        else "retrofit"
    )
    tags = ["retrofit", "long-context", "position-encoding", ctx["task"].pipeline_tag]
    tags += ["sentence-transformers"] if ctx["sentence_transformers"] else []
    tags += [t for t in (conv["scheme"], base["model_type"]) if t] + list(card.get("tags") or [])
    meta["tags"] = list(dict.fromkeys(tags))
    meta["license"] = base["card_license"] or "other"
    datasets = card.get("datasets")
    if datasets is None:
        specs = [(recipe.get("data") or {}).get("dataset"), (recipe.get("eval") or {}).get("data")]
        datasets = [d for d in map(_hub_dataset, specs) if d]
    meta["datasets"] = list(dict.fromkeys(datasets))
    meta["pipeline_tag"] = ctx["task"].pipeline_tag
    if ctx["eval"]:
        meta["model-index"] = [model_index(ctx)]
    return meta


def model_index(ctx: dict) -> dict:
    ev = ctx["eval"]
    spec = ev["data"]["spec"]
    metrics = [
        {
            "type": "perplexity",
            "value": round(x["ppl"], 4),
            "name": f"Perplexity at {x['length']} tokens ({x['length'] / ev['native']:g}x native)",
        }
        for x in ev["rows"]
    ]
    local = re.sub(r"[^\w.-]+", "-", f"{ctx['base']['name']}-{ctx['conversion']['scheme']}")
    return {
        "name": ctx["repo"] or local,
        "results": [
            {
                "task": {"type": ctx["task"].pipeline_tag, "name": "Causal language modeling"},
                "dataset": {"type": spec, "name": f"{spec} ({ev['data']['tokens']:,} tokens)"},
                "metrics": metrics,
            }
        ],
    }
