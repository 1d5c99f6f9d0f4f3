"""Once: every run-folder name lives in ``src/retrofit/foundation/run_folder.py`` (no other module spells one), and
every file write goes through ``src/retrofit/foundation/atomic.py`` or is one of the raw writers it lists, with why."""

from __future__ import annotations

import ast
from pathlib import Path

from retrofit.foundation import run_folder
from retrofit.foundation.atomic import RAW_WRITERS

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


def test_every_raw_write_is_listed_in_atomic():
    found = {}
    for rel, tree in _sources():
        for name, line in _raw_writes(tree):
            found.setdefault(f"{rel}::{name}", line)
    unlisted = sorted(f"{k} (line {v})" for k, v in found.items() if k not in RAW_WRITERS)
    assert not unlisted, (
        "raw file writes outside src/retrofit/foundation/atomic.py; write through it, or list the function in "
        "atomic.RAW_WRITERS with why:\n" + "\n".join(unlisted)
    )
    assert not set(RAW_WRITERS) - set(found), f"listed but no raw write there: {sorted(set(RAW_WRITERS) - set(found))}"


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
