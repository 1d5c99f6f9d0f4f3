"""No measured figure in the package's docstrings and comments: a speed, a timing or a CPU model belongs to the
record (``benchmarks/*.json``) and its write-up (``docs/results.md``, ``docs/standin.md``, ...); a docstring keeps
the reasoning and points there (``measured: docs/results.md, "Attention kernel"``). Runtime strings (a warning, a
note in a report) are not docstrings and are not read here. Read as text only: nothing is imported."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "retrofit"

SENTENCE = r"(?:(?!\.\s|;|\n\s*\n).)*?"  # lazily, within one sentence or clause
NUMBER = r"(?<![\w/.-])\d[\d,]*(?:\.\d+)?(?:e-?\d+)?"  # not part of a name or a path (bench_kernel_train8k.json)
FIGURES = {
    "measured, then a number": re.compile(
        rf"\bmeasured\b{SENTENCE}{NUMBER}(?![\w/-]*\.(?:json|md|py)\b)", re.IGNORECASE | re.DOTALL
    ),
    "a speed": re.compile(rf"{NUMBER}\s*(?:tokens|steps|tok)/s\b", re.IGNORECASE),
    "a speed ratio": re.compile(rf"{NUMBER}(?:-\d+(?:\.\d+)?)?x (?:faster|slower|stock)\b", re.IGNORECASE),
    "a sub-second time": re.compile(rf"{NUMBER}\s*(?:ms|us|µs)\b"),
    "a CPU model": re.compile(r"\b(?:EPYC|Xeon|Ryzen|Threadripper|Core i[3579])\b", re.IGNORECASE),
}

# Files allowed a figure, with the reason (none now). Each entry must still hold a figure: once it is gone, the
# test says so and the entry goes too.
PENDING: dict[str, str] = {}


def _texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and every module, class and function docstring of ``path``."""
    source = path.read_text()
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    return out


def figures(text: str) -> list[str]:
    """What in ``text`` reads as a measured figure: ``kind: 'the match'``."""
    return [f"{kind}: {m.group(0)!r}" for kind, pattern in FIGURES.items() for m in pattern.finditer(text)]


def _found() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        for line, text in _texts(path):
            found.setdefault(rel, []).extend(f"{line}: {hit}" for hit in figures(text))
    return {rel: hits for rel, hits in found.items() if hits}


def test_no_measured_figure_in_a_docstring_or_comment():
    found = {rel: hits for rel, hits in _found().items() if rel not in PENDING}
    assert not found, f"measured figures in src (move them to docs/ or benchmarks/ and point there): {found}"


def test_every_pending_file_still_holds_its_figure():
    found = _found()
    gone = sorted(rel for rel in PENDING if rel not in found)
    assert not gone, f"no figure left in {gone}: take them out of PENDING"


def test_the_patterns_catch_figures_and_pass_pointers():
    caught = (
        "measured on an AMD EPYC: 1.6 ms for 1.5M scores",
        "(measured for ALiBi: 0.73x stock decoding at a 4k context)",
        "about 45 min on one thread (~3,200 tokens/s)",
        "the train step ran 1.8-2.5x stock until the kernels flushed them",
        "measured max 3.6e-5 at 1k",
    )
    passed = (
        'measured: docs/results.md, "Attention kernel"',
        "measured in ``benchmarks/bench_kernel_train8k.json``",
        "its fp32 matmul rate, measured. GPUs: 989e12",
        "the ratio to the original at 1x before and after",
        "``42 s``, ``8 min``, ``1.5 h``",
    )
    assert all(figures(text) for text in caught), [text for text in caught if not figures(text)]
    assert not any(figures(text) for text in passed), [figures(text) for text in passed]
