"""The src layout: a folder named `retrofit` in the working directory (a clone named after the package)
never shadows the installed package (issue 44, item 9)."""

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_a_clone_named_retrofit_does_not_shadow_the_package(tmp_path):
    clone = tmp_path / "retrofit"
    (clone / "src" / "retrofit").mkdir(parents=True)  # what `git clone ... retrofit` lays out, minus the files
    (clone / "README.md").write_text("a clone\n")
    r = subprocess.run(
        [sys.executable, "-c", "import retrofit; print(retrofit.__file__, hasattr(retrofit, 'convert'))"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    path, has = r.stdout.split()
    assert has == "True" and path.endswith("__init__.py") and not path.startswith(str(clone / "__init__"))
