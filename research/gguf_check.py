"""Do llama.cpp and the patched model agree past native? (issue 42: where users serve such models, prove it.)

A tiny model with SmolLM2's tokenizer (one llama.cpp's converter knows) is converted by retrofit, exported to its
native architecture (``retrofit.export(native=True)``), written to GGUF by llama.cpp's own converter (the
``convert_hf_to_gguf.py`` of the llama.cpp that ``llama-cpp-python`` vendors, run with that release's ``gguf-py``)
and evaluated by llama.cpp through ``llama-cpp-python``; its logits are compared with the patched model's on the
same tokens, past the native length. Two cases:

- llama + rope YaRN x4 (rope-scaling fields in the GGUF as llama.cpp reads them)
- bloom + alibi (a native-ALiBi source kept on ALiBi: BLOOM's own bias in llama.cpp)

    pip install llama-cpp-python gguf             # builds llama.cpp (about 25 minutes on 2 cores)
    pip download llama-cpp-python --no-deps --no-binary :all: -d /tmp/sdist   # its converter
    python research/gguf_check.py --sdist /tmp/sdist/llama_cpp_python-*.tar.gz --out benchmarks/gguf_check.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch
import transformers as tf

import retrofit
from harness import stamp

NATIVE = 64


def tokenizer():
    from retrofit.models.io import load_model

    return load_model("smollm2", dtype="float32")[1]  # the GGUF's tokenizer, as transformers reads it


def tiny(kind: str, vocab: int, eos: int):
    torch.manual_seed(0)
    if kind == "llama":
        cfg = tf.LlamaConfig(
            vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=NATIVE, bos_token_id=eos, eos_token_id=eos,
            tie_word_embeddings=True,
        )  # fmt: skip
        return tf.LlamaForCausalLM(cfg).eval()
    cfg = tf.BloomConfig(vocab_size=vocab, hidden_size=64, n_layer=2, n_head=4, seq_length=NATIVE,
                         bos_token_id=eos, eos_token_id=eos)  # fmt: skip
    return tf.BloomForCausalLM(cfg).eval()


def llama_cpp_logits(gguf: Path, ids: list[int]) -> torch.Tensor:
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=len(ids) + 8, logits_all=True, verbose=False, n_threads=1)
    llm.eval(ids)
    return torch.tensor(llm.scores[: len(ids)]).float()  # (T, V)


def case(name: str, scheme: str, options: dict, kind: str, tok, converter: Path, gguf_py: Path, work: Path) -> dict:
    model = tiny(kind, len(tok), tok.eos_token_id)
    retrofit.convert(model, scheme, **options)
    export = retrofit.export(model, work / name, native=True, tokenizer=tok)
    out = work / f"{name}.gguf"
    env = {"PYTHONPATH": str(gguf_py), "NO_LOCAL_GGUF": ""}
    run = subprocess.run(
        [sys.executable, str(converter), str(work / name), "--outfile", str(out), "--outtype", "f32"],
        capture_output=True, text=True, env={**__import__("os").environ, **env},
    )  # fmt: skip
    if run.returncode:
        return {"case": name, "converted_to_gguf": False, "error": run.stderr[-2000:]}
    ids = torch.randint(10, len(tok) - 10, (4 * NATIVE,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].float()  # (T, V)
    theirs = llama_cpp_logits(out, ids)
    diff = (ours - theirs).abs().max(dim=-1).values  # (T,)
    fields = _gguf_fields(out)
    return {
        "case": name,
        "export": {"target": export.target, "exact": export.exact},
        "tokens": len(ids),
        "native": NATIVE,
        "max_abs_logit_diff_within_native": float(diff[:NATIVE].max()),
        "max_abs_logit_diff_past_native": float(diff[NATIVE:].max()),
        "greedy_tokens_agree": float((ours.argmax(-1) == theirs.argmax(-1)).float().mean()),
        "gguf_rope_fields": fields,
    }


def _gguf_fields(path: Path) -> dict:
    """The GGUF's rope, ALiBi and context-length fields (read with the ``gguf`` package)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    out = {}
    for key, field in reader.fields.items():
        if "rope" in key or "alibi" in key or "context_length" in key:
            value = field.parts[field.data[0]] if field.data else None
            if value is not None and str(value.dtype) == "uint8":
                out[key] = bytes(value).decode()  # a string field
            else:
                out[key] = value.tolist()[0] if value is not None and len(value) == 1 else str(value)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sdist", required=True, help="llama-cpp-python's source archive (its vendored llama.cpp)")
    p.add_argument("--out", default="benchmarks/gguf_check.json")
    a = p.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp())
    with tarfile.open(a.sdist) as tar:
        keep = ("vendor/llama.cpp/convert_hf_to_gguf.py", "vendor/llama.cpp/conversion/", "vendor/llama.cpp/gguf-py/")
        members = [m for m in tar.getmembers() if any(k in m.name for k in keep)]
        tar.extractall(work / "src", members=members)
    root = next((work / "src").rglob("vendor/llama.cpp"))
    tok = tokenizer()
    cases = [
        case("llama-rope-yarn4", "rope", {"scaling": "yarn", "factor": 4.0}, "llama", tok,
             root / "convert_hf_to_gguf.py", root / "gguf-py", work),
        case("bloom-alibi", "alibi", {}, "bloom", tok, root / "convert_hf_to_gguf.py", root / "gguf-py", work),
    ]  # fmt: skip
    import llama_cpp

    record = {**stamp(), "llama_cpp_python": llama_cpp.__version__, "cases": cases}
    Path(a.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
