"""The scheme catalog is the registry: every line names a module that defines exactly one scheme, which takes its name
and kind from that line; every scheme module has its line; a scheme's name is declared nowhere else; the catalog, its
help and an unknown name's error need no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from retrofit import scheme
from retrofit.foundation import catalog
from retrofit.foundation.errors import UnknownSchemeError
from retrofit.scheme import SCHEMES, Scheme

SCHEMES_DIR = Path(__file__).resolve().parents[2] / "src" / "retrofit" / "scheme"


@pytest.mark.parametrize("name", sorted(catalog.CATALOG))
def test_each_catalog_line_loads_one_scheme_with_its_name_and_kind(name):
    cls = SCHEMES.get(name)
    assert issubclass(cls, Scheme) and cls.name == name and cls.kind == catalog.CATALOG[name].kind
    assert cls.kind in catalog.KINDS and cls.__module__ == catalog.module_of(name)


def test_every_scheme_module_has_its_line_and_declares_no_name():
    modules = {p.stem for p in SCHEMES_DIR.glob("*.py")} - {"__init__", *scheme.SHARED}
    assert modules == {catalog.module_of(n).rsplit(".", 1)[1] for n in catalog.CATALOG}
    for p in SCHEMES_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                declared = {t.id for b in node.body if isinstance(b, ast.Assign) for t in b.targets if hasattr(t, "id")}
                assert not declared & {"name", "kind"}, f"{p.name}: {node.name} declares its name or kind"


def test_unknown_names_are_errors_that_list_the_schemes():
    with pytest.raises(UnknownSchemeError, match="unknown scheme 'alibj'; registered: alibi, extend"):
        SCHEMES.get("alibj")
    assert "alibj" not in SCHEMES and "alibi" in SCHEMES and SCHEMES.names() == sorted(catalog.CATALOG)


@pytest.mark.slow
def test_the_catalog_and_its_help_import_no_torch():
    code = (
        "import sys; from retrofit.foundation import catalog; catalog.schemes_help(); catalog.module_of('rope')\n"
        "print('torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-2000:]
