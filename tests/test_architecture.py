"""The import direction of docs/ARCHITECTURE.md: the folder a module sits in says its layer (``LAYERS``), a
module imports only from its own layer or below, nothing inside the package imports the ``retrofit`` facade,
no import circle of any length exists among the package's modules, and no two of its top-level folders import
each other, directly or round a longer loop (imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "retrofit"
# {top-level folder of the package: its layer}; at the root only the facade (__init__) and __main__
LAYERS = {
    "foundation": 0,
    "scheme": 1,
    "kernels": 1,
    "patch": 2,
    "adapters": 2,
    "models": 3,
    "data": 3,
    "scoring": 3,
    "training": 4,
    "evaluation": 4,
    "native_export": 5,
    "pipeline": 6,
    "publishing": 6,
    "study": 6,
    "cli": 7,
    "__main__": 7,
}
FACADE = "retrofit"  # the facade (src/retrofit/__init__.py) imported; the facade itself imports as the top layer
ALLOWED_UP: set[tuple[str, str]] = set()  # upward imports allowed by design: none


def layer(module: str) -> int | None:
    """The layer of a module of the package (``models.io``: its top folder's), None for one outside LAYERS.
    The facade (``__init__``) is the top, as ``__main__``: it re-exports every layer (by name, imported on first
    use: ``import retrofit`` stays light, tests/cli/test_fast.py) and installs the auto-class hook
    (``models/auto.py``) when imported; nothing in the package imports it."""
    return LAYERS["__main__"] if module == "__init__" else LAYERS.get(module.split(".")[0])


def _is_module(parts: list[str]) -> bool:
    """Whether ``retrofit.<parts>`` is a module or a package (else a name defined in a package)."""
    path = PKG.joinpath(*parts)
    return bool(parts) and (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file())


def imports():
    """(importing module, imported module or package, file:line) for every import in the package, both as
    dotted paths within it (``models.io``, ``patch.conversion``; a package's own file is ``kernels.__init__``, the
    facade's ``__init__``); the facade imported is ``retrofit``."""
    for f in sorted(PKG.rglob("*.py")):
        parts = list(f.relative_to(PKG).with_suffix("").parts)
        me = ".".join(parts)
        package = parts[:-1]
        for node in ast.walk(ast.parse(f.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            where = f"{f.relative_to(PKG)}:{node.lineno}"
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
                names = [target] if node.module else [target + [a.name] for a in node.names]
                for t in names:
                    if not node.module and not _is_module(t):  # `from . import NAME`: a name of the package
                        t = t[:-1]
                    yield me, (".".join(t) if t else FACADE), where
            else:
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for m in mods:
                    if m == "retrofit" or m.startswith("retrofit."):
                        yield me, (FACADE if m == "retrofit" else m.split(".", 1)[1]), where


def test_every_module_has_a_layer():
    stray = sorted(p.name for p in PKG.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert not stray, f"modules at the package root; put each in its layer's folder ({sorted(LAYERS)}): {stray}"
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and any(p.rglob("*.py"))}
    missing = sorted(folders - set(LAYERS))
    assert not missing, f"folders without a layer (LAYERS here, and the table of docs/ARCHITECTURE.md): {missing}"


def test_the_docs_table_names_the_same_layers():
    """docs/ARCHITECTURE.md's table (folders written `name/`, with ``__main__``) says what LAYERS says."""
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    table = {}
    for line in doc.splitlines():
        m = re.match(r"\| (\d) \w+ \| (.+?) \|", line)
        if m:
            for name in re.findall(r"`([a-z_]+)/`|`(__main__)`", m.group(2)):
                table["".join(name)] = int(m.group(1))
    assert table == LAYERS


def test_imports_point_down():
    bad = []
    for me, target, where in imports():
        if me == "__init__" and target == FACADE:
            continue
        if target == FACADE:
            bad.append(f"{where}: imports the retrofit facade; import the module that defines the name")
        elif layer(me) is None or layer(target) is None:
            bad.append(f"{where}: {me} imports {target}: a module outside the layer folders")
        elif layer(target) > layer(me) and (me, target) not in ALLOWED_UP:
            bad.append(f"{where}: {me} (layer {layer(me)}) imports {target} (layer {layer(target)})")
    assert not bad, "\n".join(bad)


def module_graph() -> dict[str, set[str]]:
    """{module: the package's modules it imports} at module granularity (``retrofit.models.io`` ->
    ``retrofit.patch.conversion``), every import statement counted, those inside functions too."""
    mods = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = ["retrofit", *f.relative_to(PKG).with_suffix("").parts]
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f

    def known(name: str) -> str:  # the module itself, else the package it is a name of
        while name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for me, f in mods.items():
        package = me if f.name == "__init__.py" else me.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else []))
                if mod.split(".")[0] == "retrofit":
                    graph[me] |= {known(f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod) for a in node.names}
            elif isinstance(node, ast.Import):
                graph[me] |= {known(a.name) for a in node.names if a.name.split(".")[0] == "retrofit"}
        graph[me].discard(me)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each a circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    graph = module_graph()
    assert graph["retrofit.models.io"] >= {"retrofit.patch.conversion"}  # it sees
    assert "retrofit.models.hf_classes" in graph["retrofit.models.auto"]  # beside it, in its own layer
    circles = cycles(graph)
    assert not circles, "import circles (each a set of modules that import each other, directly or not):\n" + "\n".join(
        f"{c}: " + "; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c) for c in circles
    )


def folder_graph() -> dict[str, set[str]]:
    """{top-level folder: the other folders it imports from} (every import, those inside functions too); the
    facade, ``__main__`` and any allowed upward import (``ALLOWED_UP``: none) left out."""
    graph: dict[str, set[str]] = {}
    for me, target, _ in imports():
        if target == FACADE or (me, target) in ALLOWED_UP or "." not in me:
            continue
        a, b = me.split(".")[0], target.split(".")[0]
        graph.setdefault(a, set())
        graph.setdefault(b, set())
        if a != b:
            graph[a].add(b)
    return graph


def test_no_two_folders_import_each_other():
    """A folder is a unit: two folders that import each other (training/ and evaluation/ did, both layer 4) are
    one tangle, whatever their modules' circles; what both need goes a layer down (``scoring/``)."""
    graph = folder_graph()
    assert {"training", "evaluation", "scoring"} <= set(graph) and "scoring" in graph["training"]  # it sees
    circles = cycles(graph)
    assert not circles, "folders that import each other:\n" + "\n".join(
        f"{c}: " + "; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c) for c in circles
    )


def test_the_circle_finder_finds_a_long_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"d"}, "d": {"a"}, "e": {"a"}}) == [["a", "b", "c", "d"]]


def test_a_name_taken_from_the_facade_is_seen_in_every_form(tmp_path):
    """`from . import NAME` and `from .. import NAME` of a name the facade defines are facade imports; the
    same forms naming a module are not."""
    pkg = tmp_path / "retrofit"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("NAME = 1\n")
    (pkg / "errors.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import NAME\nfrom . import errors\n")
    (pkg / "sub" / "b.py").write_text("from .. import NAME\nfrom .. import errors\nfrom retrofit import NAME\n")
    globals()["PKG"], saved = pkg, PKG
    try:
        found = sorted((me, target) for me, target, _ in imports())
    finally:
        globals()["PKG"] = saved
    assert found == [
        ("a", "errors"),
        ("a", "retrofit"),
        ("sub.b", "errors"),
        ("sub.b", "retrofit"),
        ("sub.b", "retrofit"),
    ]


def test_loggers_are_named_by_their_module_and_package_modules_keep_their_names():
    """``log = logging.getLogger(__name__)`` in every module (a message says where it comes from), and a module of the
    package is imported under its own name (no ``rf``, ``mdl``: one name per thing)."""
    import re

    misnamed, aliased = [], []
    for f in sorted(PKG.rglob("*.py")):
        text = f.read_text()
        rel = f.relative_to(PKG).as_posix()
        if re.search(r"^log = logging\.getLogger\((?!__name__\))", text, re.M):
            misnamed.append(rel)
        if re.search(r"getLogger\(\s*[\"']retrofit\.", text):  # another module's logger by its name: use its ``log``
            misnamed.append(f"{rel} (names a module's logger as a string)")
        here = f.parent
        for n in ast.walk(ast.parse(text)):
            if isinstance(n, ast.ImportFrom) and n.level:
                base = here
                for _ in range(n.level - 1):
                    base = base.parent
                base = base.joinpath(*(n.module or "").split(".")) if n.module else base
                for a in n.names:
                    is_module = (base / f"{a.name}.py").is_file() or (base / a.name / "__init__.py").is_file()
                    if a.asname and is_module and not a.asname.lstrip("_") == a.name:
                        aliased.append(f"{rel}: {a.name} as {a.asname}")
    assert not misnamed, f"loggers not named by their module: {misnamed}"
    assert not aliased, f"package modules imported under another name: {aliased}"
