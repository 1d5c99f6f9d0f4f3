"""tests/ mirrors the package: a test of one package folder sits in the test folder of that name
(``src/retrofit/patch/`` -> ``tests/patch/``), every test folder is named after a package folder, and the only
test files left at the top of tests/ are the repository-wide ones listed in ``TOP_LEVEL``, each with why."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
PKG = TESTS.parent / "src" / "retrofit"

# the test files that stay at the top of tests/: each checks the repository as a whole, or something outside
# the package (README, docs/, research/, .ci/), so no package folder is theirs
TOP_LEVEL = {
    "test_architecture.py": "the import direction between all of the package's folders (docs/ARCHITECTURE.md)",
    "test_architecture_doc.py": "docs/ARCHITECTURE.md against the whole tree",
    "test_ci_figures.py": "CI's check of the README's figures (.ci/)",
    "test_docs.py": "the user docs (README.md, docs/)",
    "test_function_size.py": "a house rule over every function of the package",
    "test_layout.py": "the src layout of the repository (a clone named retrofit shadows nothing)",
    "test_no_clock.py": "a house rule over every test",
    "test_no_figures_in_src.py": "a house rule over every docstring and comment of the package",
    "test_research.py": "research/ and the package kept apart",
    "test_tests_mirror_src.py": "this rule: tests/ mirrors the package's folders",
    "test_user_path.py": "the README's user path, end to end through the CLI",
}


def _is_test_file(p: Path) -> bool:
    return p.suffix == ".py" and (p.name.startswith("test_") or p.stem.endswith("_test"))


def _folders(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_dir() and not any(part.startswith((".", "__")) for part in p.relative_to(root).parts)
    }


def test_top_level_test_files_are_the_listed_repository_wide_ones():
    found = {p.name for p in TESTS.iterdir() if p.is_file() and _is_test_file(p)}
    unlisted = sorted(found - TOP_LEVEL.keys())
    assert not unlisted, (
        f"{unlisted} at the top of tests/: a test of one package folder goes in tests/<that folder>/; "
        "a repository-wide test is listed in TOP_LEVEL with why"
    )
    assert not TOP_LEVEL.keys() - found, f"TOP_LEVEL names files that are gone: {sorted(TOP_LEVEL.keys() - found)}"


def test_every_test_folder_mirrors_a_package_folder():
    packages = {f for f in _folders(PKG) if (PKG / f / "__init__.py").is_file()}
    strays = sorted(_folders(TESTS) - packages)
    assert not strays, f"test folders named after no folder of src/retrofit/: {strays}"
    missing = sorted(f for f in _folders(TESTS) if not (TESTS / f / "__init__.py").is_file())
    assert not missing, f"test folders without __init__.py (their relative imports need it): {missing}"
