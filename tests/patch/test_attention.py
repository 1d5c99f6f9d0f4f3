"""The attention function is the glue between transformers and the scheme: one call of a converted layer, from
``retrofit_attention``'s entry to its return, crosses few of the package's files (a structural count of the files
whose functions run, not a timing): the glue, the scheme's kind base and the scheme, the table, the call record
and the kernel that runs."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import retrofit
from retrofit.patch import attention

from ..tiny import TINY, ids

SRC = str(Path(retrofit.__file__).parent)
MOST_FILES = 6  # patch/attention, scheme/kinds, scheme/alibi, kernels/__init__, kernels/call, the kernel's module


def files_entered(entry, run) -> list[str]:
    """The package's files (relative to src/retrofit/) whose functions are called while ``entry`` runs inside
    ``run()``, in the order first entered."""
    files, depth = [], [0]

    def tracer(frame, event, arg):
        code = frame.f_code
        if code is entry.__code__:
            depth[0] += {"call": 1, "return": -1}.get(event, 0)
        name = code.co_filename
        if depth[0] and event == "call" and name.startswith(SRC):
            rel = Path(name).relative_to(SRC).as_posix()
            if rel not in files:
                files.append(rel)

    sys.setprofile(tracer)
    try:
        run()
    finally:
        sys.setprofile(None)
    return files


def test_a_gpt2_converted_to_alibi_crosses_few_files_from_the_attention_function_to_sdpa(user_kernel):
    model = retrofit.convert(TINY["gpt2"]().eval(), "alibi")  # the user's kernel: auto
    x = ids(1, 64)
    with torch.no_grad():
        model(x)  # first call: imports and caches outside the count

        def forward():
            model(x)

        files = files_entered(attention.retrofit_attention, forward)
    assert retrofit.describe(model)["last_kernel"] == "sdpa-alibi-dims"  # CPU, fp32, kernel auto
    assert files[0] == "patch/attention.py" and "kernels/sdpa_alibi_dims.py" in files, files
    assert len(files) <= MOST_FILES, f"{len(files)} files from retrofit_attention to SDPA: {files}"
