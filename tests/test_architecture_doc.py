"""docs/ARCHITECTURE.md stays true to the tree: every module of the package is named (``training/`` and
``evaluation/`` one line each, the other folders in the module listing), no module it names is gone, every file
path it names exists, every ``file.py::name`` it names is defined there, and its four checklists are there.
Read as text only: nothing is imported or run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "retrofit"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
ONE_LINE_EACH = ("training", "evaluation")  # folders whose modules get a line of their own
CHECKLISTS = ("Add a scheme", "Add a model family (adapter)", "Add an evaluation measure", "Add an export")
# a file path with a folder in it, optionally followed by ``::name`` (a function or class defined in it)
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:py|txt|json|md|yaml|j2))(?:::(\w+))?")
PLACEHOLDER = "NAME"  # a checklist's path of the file one adds (scheme/NAME.py)
CATALOG = PKG / "foundation" / "catalog.py"  # a scheme's module is named by its line there, not in the listing


def _schemes() -> set[str]:
    """The scheme names of the catalog (``"NAME": Entry(`` lines), read as text."""
    return set(re.findall(r'^\s+"(\w+)": Entry\(', CATALOG.read_text(), re.M))


def _text() -> str:
    return DOC.read_text()


def _modules(folder: str) -> set[str]:
    return {p.stem for p in (PKG / folder).glob("*.py") if p.stem != "__init__"}


def _folders() -> set[str]:
    return {p.name for p in PKG.iterdir() if p.is_dir() and any(p.glob("*.py"))}


def _listing(text: str) -> dict[str, set[str]]:
    """The module listing (a fenced block of ``folder/  module module ...`` lines, continued by indented lines)."""
    blocks = re.findall(r"^```\n(.*?)^```", text, re.M | re.S)
    listing = next((b for b in blocks if re.match(r"foundation/\s", b)), "")
    out: dict[str, set[str]] = {}
    folder = None
    for line in listing.splitlines():
        line = line.split("#")[0].rstrip()  # a comment says what the names do not
        m = re.match(r"(\w+)/\s+(.*)", line)
        if m:
            folder = m.group(1)
            out[folder] = set(m.group(2).split())
        elif folder and line.startswith(" "):
            out[folder] |= set(line.split())
    return out


def test_every_training_and_evaluation_module_has_its_line():
    text = _text()
    for folder in ONE_LINE_EACH:
        named = set(re.findall(rf"^- `{folder}/(\w+)\.py`: \S", text, re.M))
        missing, gone = sorted(_modules(folder) - named), sorted(named - _modules(folder))
        assert not missing, f"docs/ARCHITECTURE.md: add a line '- `{folder}/NAME.py`: what it does' for {missing}"
        assert not gone, f"docs/ARCHITECTURE.md names {folder}/ modules that do not exist: {gone}"


def test_the_module_listing_is_the_package():
    listing = _listing(_text())
    assert set(listing) | set(ONE_LINE_EACH) == _folders(), (
        f"the module listing's folders {sorted(listing)} (+ {ONE_LINE_EACH}) are not the package's {sorted(_folders())}"
    )
    for folder, named in listing.items():
        modules = _modules(folder) - (_schemes() if folder == "scheme" else set())  # the catalog names those
        missing, gone = sorted(modules - named), sorted(named - modules)
        assert not missing, f"docs/ARCHITECTURE.md's module listing: add {missing} to its {folder}/ line"
        assert not gone, f"docs/ARCHITECTURE.md's module listing names {folder}/ modules that do not exist: {gone}"


def test_every_path_and_name_the_doc_gives_exists():
    checked, bad = 0, []
    for path, name in PATH.findall(_text()):
        if PLACEHOLDER in path:
            continue
        found = next((base / path for base in (ROOT, PKG) if (base / path).is_file()), None)
        checked += 1
        if found is None:
            bad.append(f"{path}: no such file (under the repository or src/retrofit/)")
        elif name and not re.search(rf"^\s*(?:def|class) {name}\b|^{name}\s*=", found.read_text(), re.M):
            bad.append(f"{path}::{name}: not defined there")
    assert checked >= 40, f"only {checked} paths found: has the doc's path form changed?"
    assert not bad, "docs/ARCHITECTURE.md names what is not there:\n" + "\n".join(bad)


def test_the_checklists_are_there():
    text = _text()
    missing = [c for c in CHECKLISTS if f"**{c}**" not in text]
    assert not missing, f"docs/ARCHITECTURE.md lacks the checklists {missing}"


def test_a_new_module_without_a_line_fails(tmp_path, monkeypatch):
    """The check bites: a module added to training/ without its line is reported."""
    fake = tmp_path / "retrofit"
    for folder in ONE_LINE_EACH:
        (fake / folder).mkdir(parents=True)
        for stem in _modules(folder):
            (fake / folder / f"{stem}.py").write_text("")
    (fake / "training" / "brand_new.py").write_text("")
    monkeypatch.setitem(globals(), "PKG", fake)
    try:
        test_every_training_and_evaluation_module_has_its_line()
    except AssertionError as e:
        assert "brand_new" in str(e)
    else:
        raise AssertionError("a training module without a doc line passed")
