"""Does a real RoPE model read past its native length without a fine-tune? SmolLM2-135M (native 8,192) at 2x
(16,384 tokens): as is, PI, NTK, YaRN, dynamic NTK, SelfExtend and STRING (``rope`` options) and NoPE with the
length-aware temperature, on held-out
Shakespeare, paired: every method reads the very same token sequence.

One sequence of ``--length`` tokens per method carries both measures (a CPU budget: one forward of 16k
tokens takes minutes here):

* **Retrieval at distance** (``retrofit.evaluation.retrieval``'s measure, many probes in one sequence): the
  last ``probes x span`` tokens are cues, each a ``span``-token passage of held-out text taken from elsewhere
  whose first occurrence sits exactly ``d`` tokens earlier (``--distances``, ``--per-distance`` probes each);
  every other probe is a distractor with its own beginning, so the cue picks one (multi-key). The copy gain is
  the first occurrence's mean NLL minus the second's over the span's last ``span - cue`` tokens, with a
  bootstrap interval over probes; effective reach is ``retrieval.effective_reach``.
* **Far-context gain** (``retrofit.evaluation.farcontext``): the natural-text targets of the second half
  (positions native .. length, probe tokens left out), scored with the full context and through a native
  window (windows of ``native`` tokens with stride ``native / 2``: every target sees between native / 2 and
  native tokens), by the method itself and by the original: window NLL over full NLL, paired bootstrap over
  blocks of ``--block`` targets.

The same window runs give the floor of retrieval: a probe's second occurrence read through the native window
cannot see a first occurrence farther than the window.

    OMP_NUM_THREADS=2 python research/smollm2_reach.py
    -> benchmarks/smollm2_reach.json (written after every method)
    OMP_NUM_THREADS=2 python research/smollm2_reach.py --methods string --update   # one method again, the rest kept
    python research/smollm2_reach.py --table benchmarks/smollm2_reach.json   # the tables of docs/results.md
    python research/smollm2_reach.py --table benchmarks/smollm2_reach.json --readme   # the README's figures
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from harness import command, write_record
from reach import METHODS, _x, header, measure, original_window_cache, prepare, table


def readme_cell(data: dict, method: str = "self_extend") -> str:
    """The README's figures for ``method``: its copy gains past native (min-max), the most its own native window
    gives there, its effective reach and its far-context gain on natural text."""
    r = next(r for r in data["rows"] if r["method"] == method)
    e, native = r["effective_reach"], r["effective_reach"]["native"]
    past = [c["copy_gain"] for c in r["copy"] if c["distance"] > native]
    floor = [c["copy_gain"] for c in r["copy_through_native_window"] if c["distance"] > native]
    g = r["far_context_gain"]["own native window"]
    return (
        f"retrieval past native saves {min(past):.2f}-{max(past):.2f} nats a token against at most "
        f"{max(floor):.2f} through its native window, effective reach {_x(e['reach'], native)} "
        f"[{_x(e['reach_low'], native)}, {_x(e['reach_high'], native)}]; on natural text its far-context gain "
        f"{g['gain']:.3f} ({'reads' if g['reads'] else 'runs'})"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--distances", default="2048,4096,6144,8192,10240,12288,14336")
    ap.add_argument("--per-distance", type=int, default=4)
    ap.add_argument("--span", type=int, default=32)
    ap.add_argument("--cue", type=int, default=8)
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--native", type=int, default=None, help="read the native length as this (a smoke test)")
    ap.add_argument("--out", default="benchmarks/smollm2_reach.json")
    ap.add_argument("--table", metavar="JSON", help="print the markdown tables of a record and exit")
    ap.add_argument("--readme", action="store_true", help="with --table: the README's SelfExtend figures")
    ap.add_argument("--update", action="store_true", help="keep --out's rows of the methods not run")
    ap.add_argument("--cache", default="runs/smollm2_reach", help="the original's window NLL, for --update")
    args = ap.parse_args(argv)
    args.command = command(__file__, argv)
    if args.table:
        data = json.loads(open(args.table).read())
        print(readme_cell(data) if args.readme else table(data))
        return 0
    import retrofit
    from retrofit.models.io import load_model

    model, tok = load_model(args.model, dtype="float32")
    model.eval()
    setup = prepare(args, tok, args.native or int(retrofit.describe(model)["native"]["length"]))
    kept = []
    if args.update and Path(args.out).exists():
        kept = [r for r in json.loads(Path(args.out).read_text())["rows"] if r["method"] not in args.methods.split(",")]
    cached = original_window_cache(args)
    original_window = np.load(cached) if cached.exists() and "as is" not in args.methods.split(",") else None
    rows = []
    for name in [s for s in args.methods.split(",") if s]:
        opts = METHODS[name]
        if opts is not None:
            given = dict(opts)
            retrofit.convert(model, given.pop("scheme", "rope"), **given)
        row, window = measure(model, setup, args, original_window)
        row = {"method": name, "options": opts, **row}
        if opts is None:
            original_window = window
            cached.parent.mkdir(parents=True, exist_ok=True)
            np.save(cached, window)
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("method", "ppl_full_second_half", "effective_reach")}), file=sys.stderr)
        if opts is not None:
            retrofit.revert(model)
        order = lambda r: list(METHODS).index(r["method"]) if r["method"] in METHODS else 99  # noqa: E731
        write_record(args.out, {**header(args, setup, "no fine-tune"), "rows": sorted(kept + rows, key=order)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
