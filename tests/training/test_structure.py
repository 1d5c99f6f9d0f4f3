"""The fine-tune's structure, counted (issue #69): how much ``loop.py`` holds, how many product functions take the
whole ``Recipe``, how long ``Recipe.validate`` is and how many hand-written range checks it makes, how many
functions take 7-8 parameters, how many lines of ``loop.py`` are about positions. Each count has a ceiling
(``CEILINGS``): a ratchet that may only be lowered. ``python tests/training/test_structure.py`` prints the counts.

Definitions (measured the same way before and after the refactor):
- ``whole_recipe``: functions of ``src/retrofit`` with a parameter annotated ``Recipe``, or a parameter named
  ``r``/``recipe`` whose body reads a recipe section through it (``r.train.x``, ``r.data.y``, ``r.output_dir``, ...);
- ``params_7_8``: functions with 7 or 8 parameters (``self``/``cls`` not counted, ``*args``/``**kwargs`` counted);
- ``loop_positions``: lines of ``training/loop.py`` mentioning "position" (any case)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "src" / "retrofit"
SECTIONS = {"train", "data", "convert", "checkpoint", "model", "task"}

# before #69's fifth step (b9abcf6): loop_lines 717, whole_recipe 38, validate_lines 80, positive_calls 13,
# params_7_8 36, loop_positions 34
CEILINGS = {
    "loop_lines": 445,  # 442, then main's distillation of embedding models (#67 grid) added 12, its log line moved to teacher.py
    "whole_recipe": 20,  # the budget (recipe.py), outputs, --plan, preflight and tasks: steps that span sections
    "validate_lines": 20,
    "positive_calls": 0,
    "params_7_8": 8,  # the signatures fixed from outside (tests/test_function_size.py:KNOWN)
    "loop_positions": 1,  # the import of training/positions.py's Placer
}


def _params(n: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = n.args
    count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    return count - (bool(a.args) and a.args[0].arg in ("self", "cls"))


def _takes_whole_recipe(n: ast.FunctionDef | ast.AsyncFunctionDef, parents: dict) -> bool:
    a = n.args
    args = [x for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    if any(x.annotation is not None and ast.unparse(x.annotation).strip("'\"") == "Recipe" for x in args):
        return True
    names = {x.arg for x in args} & {"r", "recipe"}
    for s in ast.walk(n):
        if isinstance(s, ast.Attribute) and isinstance(s.value, ast.Name) and s.value.id in names:
            if s.attr == "output_dir" or (s.attr in SECTIONS and isinstance(parents.get(s), ast.Attribute)):
                return True
    return False


def _functions():
    for f in sorted(PKG.rglob("*.py")):
        tree = ast.parse(f.read_text())
        parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f.relative_to(PKG).as_posix(), n, parents


def whole_recipe() -> list[str]:
    return [f"{f}:{n.name}" for f, n, parents in _functions() if _takes_whole_recipe(n, parents)]


def params_7_8() -> list[str]:
    return [f"{f}:{n.name}" for f, n, _ in _functions() if 7 <= _params(n) <= 8]


def _validate() -> ast.FunctionDef:
    tree = ast.parse((PKG / "training" / "recipe.py").read_text())
    recipe = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Recipe")
    return next(n for n in recipe.body if isinstance(n, ast.FunctionDef) and n.name == "validate")


def counts() -> dict[str, int]:
    loop = (PKG / "training" / "loop.py").read_text().splitlines()
    v = _validate()
    recipe_text = (PKG / "training" / "recipe.py").read_text()
    return {
        "loop_lines": len(loop),
        "whole_recipe": len(whole_recipe()),
        "validate_lines": v.end_lineno - v.lineno + 1,
        "positive_calls": len(re.findall(r"\b_positive\(", recipe_text)) - ("def _positive(" in recipe_text),
        "params_7_8": len(params_7_8()),
        "loop_positions": sum("position" in line.lower() for line in loop),
    }


def test_the_counts_stay_under_their_ceilings():
    now = counts()
    over = {k: (now[k], CEILINGS[k]) for k in CEILINGS if now[k] > CEILINGS[k]}
    assert not over, f"structure counts over their ceilings (now, ceiling): {over}"


def test_the_counter_sees_what_it_counts():
    """The counters find what they look for (a broken walk would count 0 and pass the ceilings)."""
    assert "training/recipe.py:budget" in whole_recipe()
    assert counts()["loop_lines"] > 100 and counts()["validate_lines"] > 3


def test_recipe_ranges_are_declared_on_fields_not_written_in_validate():
    """Every range of the recipe is a field's ``minimum``/``above``/``below``: no comparison of a key with a number
    is left in ``training/recipe.py``'s checks, and the declared limits are there (each checked by a recipe test)."""
    import dataclasses

    from retrofit.foundation.schema import LIMITS
    from retrofit.training.recipe import Recipe

    text = (PKG / "training" / "recipe.py").read_text()
    assert not re.search(r"must be >=? \d|must be in [\[(]\d, \d", text), "a hand-written range check"

    def limited(cls):
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(f.default_factory if f.default_factory is not dataclasses.MISSING else None):
                yield from limited(f.default_factory)
            elif any(k in f.metadata for k in LIMITS):
                yield f.name

    assert len(list(limited(Recipe))) >= 30


if __name__ == "__main__":
    for k, v in counts().items():
        print(f"{k}: {v}")
