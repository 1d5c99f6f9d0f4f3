"""The modules that moved into the layer folders (issue 45, item 4) import at their old paths as the very same
module objects: ``import retrofit.core`` is ``retrofit.patch.core``, silently, whichever name comes first."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path
from unittest import mock

import pytest

import retrofit
from retrofit.foundation.moved import MOVED

PKG = Path(__file__).resolve().parents[1] / "src" / "retrofit"


def test_every_moved_module_is_at_its_new_path_and_not_at_its_old():
    for old, new in MOVED.items():
        assert PKG.joinpath(*new.split(".")[1:]).with_suffix(".py").is_file(), new
        assert not PKG.joinpath(*old.split(".")[1:]).with_suffix(".py").exists(), old


def test_each_old_path_is_the_module_at_its_new_path():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for old, new in MOVED.items():
            assert importlib.import_module(old) is importlib.import_module(new) is sys.modules[old], old
            assert sys.modules[new].__spec__.name == sys.modules[new].__name__ == new, new
            assert getattr(retrofit, old.rpartition(".")[2]) is sys.modules[new], old
    from retrofit.core import set_kernel
    from retrofit.patch.core import set_kernel as same

    assert set_kernel is same
    with mock.patch("retrofit.pipeline.STAGES", ("x",)):
        assert importlib.import_module("retrofit.running.pipeline").STAGES == ("x",)
    assert callable(retrofit.run)  # the facade's function, not the folder running/


# a fresh process: the old name imported first, and `import retrofit` still without torch
CHECK = r"""
import importlib, sys, warnings
from unittest import mock
warnings.simplefilter("error")
import retrofit
assert "torch" not in sys.modules
import retrofit.errors as a
import retrofit.foundation.errors as b
assert a is b and a.__name__ == a.__spec__.name == "retrofit.foundation.errors"
from retrofit.core import set_kernel  # the old path first, then the new
import retrofit.patch.core
assert set_kernel is retrofit.patch.core.set_kernel and retrofit.core is retrofit.patch.core
from retrofit import io
assert io is importlib.import_module("retrofit.models.io")
with mock.patch("retrofit.pipeline.STAGES", ("x",)):
    assert importlib.import_module("retrofit.running.pipeline").STAGES == ("x",)
for old, new in MOVED.items():
    assert importlib.import_module(old) is importlib.import_module(new) is sys.modules[old] is sys.modules[new], old
    assert sys.modules[new].__spec__.name == new, new
assert callable(retrofit.run)  # the facade's function, not the folder running/
print("ok")
"""


@pytest.mark.slow
def test_old_paths_first_in_a_fresh_process():
    r = subprocess.run(
        [sys.executable, "-c", "from retrofit.foundation.moved import MOVED\n" + CHECK],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    assert not r.stderr.strip(), r.stderr[-3000:]
