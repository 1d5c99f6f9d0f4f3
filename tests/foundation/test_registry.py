"""One way to register a part: a scheme, an architecture adapter, a kernel and an export mapping are each their module
and one line of their folder's catalog (``foundation/catalog.py``, ``adapters.FAMILIES``, ``kernels.KERNELS``,
``native_export.CATALOG``), which imports the module: no decorator, no hand-written import line."""

from __future__ import annotations

import ast
import re
import sys
import types
from pathlib import Path

import pytest

from retrofit import adapters, kernels, native_export, scheme
from retrofit.adapters.base import ADAPTERS, Adapter, register_family
from retrofit.foundation import catalog
from retrofit.foundation.registry import Registry, part_class
from retrofit.native_export import base as export_base
from retrofit.scheme import SCHEMES, BiasScheme

PKG = Path(scheme.__file__).resolve().parents[1]


def _modules(folder: str) -> set[str]:
    return {p.stem for p in (PKG / folder).glob("*.py")} - {"__init__"}


def test_each_catalog_names_every_part_module_of_its_folder():
    assert {catalog.module_of(n).rsplit(".", 1)[1] for n in catalog.CATALOG} == _modules("scheme") - scheme.SHARED
    assert set(adapters.FAMILIES) == _modules("adapters") - set(adapters.SHARED)
    assert {k.name.replace("-", "_") for k in kernels.KERNELS} == _modules("kernels") - set(kernels.SHARED)
    built = {line.build.split(".")[0] for line in native_export.CATALOG}
    assert built == _modules("native_export") - {"base"}


def test_no_part_registers_by_decorator_or_by_an_import_line():
    """The old ways are gone from the package: ``@register_adapter``, ``@mapping(...)`` / ``mapping(...)(fn)``, a
    folder's ``__init__`` importing its parts' modules by hand, a folder import loop."""
    found = []
    for f in sorted(PKG.rglob("*.py")):
        rel, text = f.relative_to(PKG).as_posix(), f.read_text()
        for pattern in (r"@register_adapter\(", r"@mapping\(", r"\bmapping\([^)]*\)\(", r"pkgutil\.iter_modules"):
            if re.search(pattern, text):
                found.append(f"{rel}: {pattern}")
    for folder, parts in (
        ("kernels", {k.name.replace("-", "_") for k in kernels.KERNELS}),
        ("adapters", set(adapters.FAMILIES)),
    ):
        tree = ast.parse((PKG / folder / "__init__.py").read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names |= {a.name for a in node.names} if node.module is None else {node.module.split(".")[0]}
        found += [f"{folder}/__init__.py imports part {n}" for n in sorted(names & parts)]
    assert not found, found


def _module(monkeypatch, name: str, source: str) -> types.ModuleType:
    """A module ``name`` made of ``source``, as if it were a new file of the package (gone after the test)."""
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def test_a_new_scheme_is_its_module_and_one_catalog_line(monkeypatch):
    monkeypatch.setitem(catalog.CATALOG, "flat", catalog.Entry("bias", "a test's flat bias"))
    _module(
        monkeypatch,
        "retrofit.scheme.flat",
        "import torch\nfrom retrofit.scheme import BiasScheme\n\n"
        "class Flat(BiasScheme):\n    def bias(self, layer, h, q, k):\n        return torch.zeros(())\n",
    )
    cls = SCHEMES.get("flat")
    assert issubclass(cls, BiasScheme) and (cls.name, cls.kind) == ("flat", "bias")


def test_a_new_family_is_its_module_and_one_line(monkeypatch):
    monkeypatch.setattr(ADAPTERS, "_items", dict(ADAPTERS._items))
    _module(
        monkeypatch,
        "retrofit.adapters.toy",
        "from retrofit.adapters.gpt2 import GPT2Adapter\n\nclass ToyAdapter(GPT2Adapter):\n    model_types = ('toy',)\n",
    )
    cls = register_family("toy")  # what the FAMILIES line does
    assert ADAPTERS.get("toy") is cls and cls.name == "toy" and ADAPTERS.get("gpt2").name == "gpt2"
    assert issubclass(cls, Adapter)


def test_a_new_kernel_is_its_module_and_one_row(monkeypatch):
    module = _module(
        monkeypatch,
        "retrofit.kernels.toy_kernel",
        "def serves(call):\n    return 'never'\n\ndef run(call):\n    raise AssertionError\n",
    )
    row = kernels.Kernel("toy-kernel", kernels.BIAS, "a test's kernel")
    assert row.serves is module.serves and row.run is module.run and row.worth(None) is True


def test_a_new_export_is_its_function_and_one_line(monkeypatch):
    monkeypatch.setattr(export_base, "MAPPINGS", Registry("export mapping"))
    module = _module(monkeypatch, "retrofit.native_export.toy", "def build(model, info, opts):\n    return None\n")
    line = export_base.Line("toy.build", ("gpt2", "opt"), ("fire",), "ToyForCausalLM", "a toy", "no")
    export_base.register((line,))
    assert export_base.MAPPINGS.names() == ["gpt2+fire", "opt+fire"]
    assert export_base.MAPPINGS.get("opt+fire").build is module.build


def test_a_module_must_define_exactly_one_part(monkeypatch):
    _module(monkeypatch, "retrofit.scheme.empty", "x = 1\n")
    with pytest.raises(TypeError, match="must define one Scheme subclass"):
        part_class("retrofit.scheme.empty", scheme.Scheme, "'empty'")
    assert SCHEMES.get("alibi").name == "alibi"
