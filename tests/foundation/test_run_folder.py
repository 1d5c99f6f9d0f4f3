"""Once: every run-folder name lives in ``src/retrofit/foundation/run_folder.py`` (no other module spells one), and
every file write goes through ``src/retrofit/foundation/atomic.py`` or says why it may not beside it (a ``# raw write:``
comment)."""

from __future__ import annotations

import ast
from pathlib import Path

from retrofit.foundation import run_folder

PKG = Path(__file__).resolve().parents[2] / "src" / "retrofit"
NAMES = {v for k, v in vars(run_folder).items() if k.isupper() and isinstance(v, str)}
FILES = {n for n in NAMES if "." in n or "_" in n}  # report.json, rank_checksums: never another word
FOLDERS = NAMES - FILES  # final, eval, export: also stage and section names, so only as a path
RAW = {"write_text", "write_bytes", "save_pretrained", "savefig", "save_state", "save_file"}


def _docstrings(tree) -> set[int]:
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }


def _sources():
    for f in sorted(PKG.rglob("*.py")):
        yield f.relative_to(PKG).as_posix(), ast.parse(f.read_text())


def test_run_folder_names_are_spelled_only_in_run_folder():
    bad = []
    for rel, tree in _sources():
        if rel == "foundation/run_folder.py":
            continue
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):  # out / "final"
                for side in (node.left, node.right):
                    if isinstance(side, ast.Constant) and side.value in FOLDERS:
                        bad.append(f"{rel}:{side.lineno}: {side.value!r} as a path")
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
                continue
            v = node.value.strip()
            if (
                v in FILES
                or (v.endswith("/") and v[:-1] in FOLDERS)
                or ("/" in v and v.split("/")[0] in FOLDERS and v.split("/")[-1] in FILES)
            ):
                bad.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not bad, "run-folder names outside foundation/run_folder.py (use its constants):\n" + "\n".join(bad)


def _raw_writes(node, where: str = ""):
    """(innermost function, ``outer.inner`` for a nested one; line) of every raw write: open() for
    writing, the RAW methods, torch.save."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _raw_writes(child, f"{where}.{child.name}" if where else child.name)
            continue
        if isinstance(child, ast.Call):
            f = child.func
            if isinstance(f, ast.Attribute) and (
                f.attr in RAW or (f.attr == "save" and getattr(f.value, "id", "") == "torch")
            ):
                yield where, child.lineno
            elif isinstance(f, ast.Name) and f.id == "open":
                mode = (
                    child.args[1]
                    if len(child.args) > 1
                    else next((k.value for k in child.keywords if k.arg == "mode"), None)
                )
                if isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax+"):
                    yield where, child.lineno
        yield from _raw_writes(child, where)


MARK = "# raw write:"


def test_every_raw_write_says_why_beside_it():
    """A raw write carries a ``# raw write: WHY`` comment on its line or the three above (foundation/atomic.py's
    rule); the scan sees the raw writes it looks for (a broken walk would find none and pass)."""
    unsaid, found = [], 0
    for rel, tree in _sources():
        lines = (PKG / rel).read_text().splitlines()
        for name, line in _raw_writes(tree):
            found += 1
            near = lines[max(0, line - 4) : line]
            if not any(MARK in x and x.split(MARK, 1)[1].strip() for x in near):
                unsaid.append(f"{rel}:{line} ({name})")
    assert not unsaid, (
        "raw file writes outside src/retrofit/foundation/atomic.py; write through it, or say why the raw write is "
        f"safe in a '{MARK} ...' comment on its line or just above:\n" + "\n".join(unsaid)
    )
    assert found > 10


def test_a_raw_write_comment_marks_a_raw_write():
    """No stale mark: each ``# raw write:`` comment has a raw write within the three lines below it."""
    stale = []
    for rel, tree in _sources():
        writes = {line for _, line in _raw_writes(tree)}
        for i, x in enumerate((PKG / rel).read_text().splitlines(), 1):
            if x.strip().startswith(MARK) and not writes & set(range(i, i + 4)):
                stale.append(f"{rel}:{i}")
    assert not stale, f"'{MARK}' comments with no raw write just below: {stale}"


def test_eval_writes_into_a_users_model_folder_but_not_into_a_shipped_or_read_only_one(tmp_path, monkeypatch):
    mine, shipped = tmp_path / "mine", tmp_path / "shipped-model"
    for folder in (mine, shipped):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    (shipped / run_folder.SUMS).write_text("")
    assert run_folder.eval_dir(str(mine)) == mine / run_folder.EVAL and run_folder.kept_as_is(mine) is None
    assert run_folder.eval_dir(str(shipped)) == Path("eval-shipped-model") and "checksummed" in run_folder.kept_as_is(
        shipped
    )
    assert run_folder.eval_dir("org/name") == Path("eval-name")  # a Hub id, as before
    monkeypatch.setattr(run_folder.os, "access", lambda path, mode: False)  # root writes anywhere: a read-only folder
    assert run_folder.eval_dir(str(mine)) == Path("eval-mine") and run_folder.kept_as_is(mine) == "it is read-only"
