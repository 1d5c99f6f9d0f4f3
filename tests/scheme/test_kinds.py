"""The root ``Scheme`` carries what every kind uses; a fact a kernel exploits lives on the one kind it is about, and
a reader of another kind's scheme finds no such attribute (it asks the kind first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrofit import scheme
from retrofit.scheme import SCHEMES, BiasScheme, RelativeScheme, RotaryScheme, Scheme

SCHEME_DIR = Path(scheme.__file__).parent
KIND_FACTS = {
    BiasScheme: ("bias_scaled_with_scores", "linear_slopes", "distance_band", "distance_only"),
    RotaryScheme: ("rotation_depends_on_length", "keys_reread", "far_reach"),
    RelativeScheme: ("relative_sinusoid", "relative_reach"),
}
MOST_LINES = 450  # a shared module of scheme/ (the old base.py held seven things in 603 lines)


@pytest.mark.parametrize("base", list(KIND_FACTS), ids=lambda b: b.__name__)
def test_each_kind_only_fact_lives_on_its_kind(base):
    for fact in KIND_FACTS[base]:
        assert fact in vars(base), f"{base.__name__} should define {fact}"
        assert not hasattr(Scheme, fact), f"the root Scheme carries {fact}, a {base.__name__} fact"


def test_a_scheme_of_another_kind_has_none_of_them():
    for name, cls in SCHEMES.items():
        for base, facts in KIND_FACTS.items():
            if not issubclass(cls, base):
                assert not any(hasattr(cls, f) for f in facts), (name, base.__name__)


def test_the_shared_modules_are_split_by_what_they_hold():
    assert "base.py" not in {p.name for p in SCHEME_DIR.iterdir()}
    for name in scheme.SHARED:
        lines = len((SCHEME_DIR / f"{name}.py").read_text().splitlines())
        assert lines <= MOST_LINES, f"scheme/{name}.py has {lines} lines (at most {MOST_LINES})"


def test_one_site_type_for_an_attention_call():
    """``Site`` is declared once (``scheme.site``); the patch's call record implements it, and the adapters' record of
    an attention module is an ``AttentionLayer``, not another site."""
    import ast

    from retrofit.patch.attention import LayerCall
    from retrofit.scheme import Site

    declared = sorted(
        f"{p.relative_to(SCHEME_DIR.parent).as_posix()}:{n.name}"
        for p in SCHEME_DIR.parent.rglob("*.py")
        for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, ast.ClassDef) and n.name.endswith("Site")
    )
    assert declared == ["scheme/site.py:Site"], declared
    assert Site in LayerCall.__mro__  # declared, not only shaped alike
