"""``foundation/seeds.py``: the one formula the package derives seeds with."""

from pathlib import Path

from retrofit.foundation.seeds import MULTIPLIER, derive
from retrofit.scoring.masking import seed_of

PKG = Path(__file__).resolve().parents[2] / "src" / "retrofit"


def test_derive_is_the_formula_and_written_once():
    assert derive(3, 11) == 3 * 1_000_003 + 11 and MULTIPLIER == 1_000_003
    assert seed_of(2, 5, 1) == (2 * 1_000_003 + 5 * 7_919 + 104_729) % (1 << 62)
    holders = sorted(f.relative_to(PKG).as_posix() for f in PKG.rglob("*.py") if "1_000_003" in f.read_text())
    assert holders == ["foundation/seeds.py"], holders
