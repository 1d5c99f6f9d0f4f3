"""The modules that moved into the layer folders, still importable at their old paths.

``import retrofit.core`` (or ``from retrofit.errors import RetrofitError``, ``mock.patch("retrofit.io.save")``,
an old pickle) gives the very module ``retrofit.patch.core``: the finder below serves each old name as the
same module object, under both names in ``sys.modules``, silently. The facade installs it (``install()``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

# {old path: new path}; one row per module that sat at the package root before the layer folders
MOVED = {
    f"retrofit.{name}": f"retrofit.{folder}.{name}"
    for folder, names in {
        "foundation": "errors denormal registry schema atomic versions native documents run_folder auto quiet menu task",
        "patch": "state attention saved_config probe core optim",
        "models": "io sources hf_classes builtin assets data baseline",
        "running": "card_facts cards hub run_recipe pipeline",
    }.items()
    for name in names.split()
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module at its new path (imported first, if it is not yet)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])  # the module itself: no second copy
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # the import system set the old name's; it keeps its own

    def get_code(self, fullname):  # `python -m retrofit.core`: run the module by its own name
        raise ImportError(f"{fullname} moved to {MOVED[fullname]}: run `python -m {MOVED[fullname]}`")


_finder = _OldPaths()


def install() -> None:
    """Serve the old paths (once per process; the facade calls it)."""
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.insert(0, _finder)
