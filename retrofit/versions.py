"""The library versions every record of a run carries (manifest, versions.json, export record,
eval report, stand-in stats): one list, read in one place."""

from __future__ import annotations

import importlib.metadata
import platform
from pathlib import Path

__version__ = "0.1.0"  # retrofit's own (pyproject.toml's [project] version must equal it)

LIBRARIES = ("torch", "transformers", "accelerate", "peft", "huggingface_hub", "tokenizers", "safetensors")


def library_versions() -> dict[str, str | None]:
    """{"retrofit", each of LIBRARIES, "python", "platform"}: a library not installed is None."""
    out: dict[str, str | None] = {"retrofit": __version__}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = platform.python_version()
    out["platform"] = platform.platform()
    return out


def cpu_info() -> dict:
    """The CPU a speed or precision figure was measured on: its model name and the flags that decide the
    kernels (AVX2/AVX-512/AMX, FMA). Every benchmark JSON records it: a figure holds for its CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"processor": platform.processor() or platform.machine(), "flags": []}
    lines = text.splitlines()
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return {"processor": name, "flags": sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2", "fma")))}
