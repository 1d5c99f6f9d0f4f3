"""The library versions every record of a run carries (manifest, versions.json, export record,
eval report, stand-in stats): one list, read in one place."""

from __future__ import annotations

import importlib.metadata
import platform

from . import __version__

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
