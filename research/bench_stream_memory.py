"""Peak memory of streamed fine-tune data against a whole read of the same corpus.

    python research/bench_stream_memory.py --mb 300          # writes benchmarks/stream_memory.json

Makes a jsonl corpus of about ``--mb`` MB (standard-library sources, each document given a different
header so none repeats), then measures, each in a fresh process (peak RSS from ``getrusage``):

- ``whole``: what a fine-tune did before streaming: every document in a list (``datasets`` non-streaming
  ``load_dataset`` of the same file, then its text column), tokenized, cut into blocks;
- ``stream``: the streaming path over the entire corpus (``StreamSource``: read, tokenize 64 at a time,
  pack, hand out batches, drop them), every block of it;
- ``finetune``: ``retrofit finetune`` on the streamed corpus (tiny-gpt2, a few steps): the whole command.

The tokenizer is tiny-gpt2's (one token per byte), so tokens ~ bytes: the hardest case for memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from harness import BENCHMARKS, command, stamp, write_record


def make_corpus(path: Path, mb: int) -> int:
    """A jsonl corpus of about ``mb`` MB; returns its size in bytes."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    texts = [f.read_text() for f in files]
    target, n, i = mb * 2**20, 0, 0
    with path.open("w") as f:
        while n < target:
            line = json.dumps({"text": f"# copy {i}\n" + texts[i % len(texts)]}) + "\n"
            f.write(line)
            n += len(line.encode())
            i += 1
    return path.stat().st_size


def _tok():
    from retrofit.training.model import load
    from retrofit.training.recipe import ModelConfig

    return load(ModelConfig(name_or_path="tiny-gpt2"))[1]


def child(mode: str, corpus: str, block: int) -> dict:
    """One measurement, in this (fresh) process."""
    t0 = time.perf_counter()
    if mode == "whole":
        import datasets

        from retrofit.data import specs
        from retrofit.training.blocks import make_blocks

        tok = _tok()
        docs = [specs.Document("", t) for t in datasets.load_dataset("json", data_files=corpus, split="train")["text"]]
        blocks = make_blocks(specs.tokenize_documents(tok, docs), block, True)
        out = {"blocks": len(blocks), "tokens": blocks.numel()}
    elif mode == "stream":
        from retrofit.training.recipe import Recipe
        from retrofit.training.stream import StreamSource

        tok = _tok()
        r = Recipe.from_dict(
            {
                "model": {"name_or_path": "tiny-gpt2"},
                "output_dir": "x",
                "data": {"files": corpus, "block_length": block, "validation_documents": 0},
            }
        )
        src = StreamSource.of(r.data)
        n = 0
        for batch, _ in src.batches(tok, 8, block, True):
            n += batch.shape[0]
        out = {"blocks": n, "tokens": n * block}
    else:
        from retrofit.training import finetune

        with tempfile.TemporaryDirectory() as d:
            finetune(
                {
                    "model": {"name_or_path": "tiny-gpt2"},
                    "convert": {"scheme": "alibi"},
                    "data": {
                        "files": corpus,
                        "block_length": block,
                        "max_tokens": 20 * 4 * block,
                        "max_validation_blocks": 4,
                    },
                    "train": {"steps": None, "batch_size": 4},
                    "output_dir": str(Path(d) / "run"),
                }
            )
        out = {"steps": 20, "tokens": 20 * 4 * block}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=300, help="corpus size in MB")
    p.add_argument("--block", type=int, default=1024)
    p.add_argument("--modes", default="stream,finetune,whole")
    p.add_argument("--out", type=Path, default=BENCHMARKS / "stream_memory.json")
    p.add_argument("--child", nargs=3, metavar=("MODE", "CORPUS", "BLOCK"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], a.child[1], int(a.child[2]))))
        return
    with tempfile.TemporaryDirectory() as d:
        corpus = Path(d) / "corpus.jsonl"
        size = make_corpus(corpus, a.mb)
        print(f"corpus: {size / 2**20:.0f} MiB", flush=True)
        results = {}
        for mode in a.modes.split(","):
            env = {
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "RETROFIT_PROGRESS": "0",
                "HF_DATASETS_CACHE": str(Path(d) / "hf"),
            }
            res = subprocess.run(
                [sys.executable, __file__, "--child", mode, str(corpus), str(a.block)],
                capture_output=True,
                text=True,
                env=env,
            )
            if res.returncode:
                sys.exit(f"{mode} failed:\n{res.stderr[-3000:]}")
            results[mode] = json.loads(res.stdout.strip().splitlines()[-1])
            print(mode, results[mode], flush=True)
    record = {
        "what": "peak RSS of streamed fine-tune data vs a whole read of the same jsonl corpus (each in a fresh process)",
        "command": command(__file__, ["--mb", str(a.mb), "--block", str(a.block)]),
        "corpus_mib": round(size / 2**20, 1),
        "block_length": a.block,
        "tokenizer": "tiny-gpt2 (bytes)",
        "results": results,
        **stamp(),
    }
    if "whole" in results and "stream" in results:
        record["whole_over_stream_peak"] = round(
            results["whole"]["peak_rss_mib"] / results["stream"]["peak_rss_mib"], 2
        )
    write_record(a.out, record)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
