"""The library versions every record of a run carries (manifest, versions.json, export record,
eval report, stand-in stats): one list, read in one place."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path

__version__ = "0.1.0"  # retrofit's own (pyproject.toml's [project] version must equal it)
# The name to `pip install` (PyPI's "retrofit" is an unrelated project); the import name and the command
# stay `retrofit`. pyproject.toml's [project] name must equal it (tests/publishing/test_cards_push.py checks).
DISTRIBUTION = "retrofit-positions"

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
    """The CPU a speed or precision figure was measured on: its model name and vendor, the flags that decide
    the kernels (AVX2/AVX-512/AMX, FMA), the thread count torch uses, and whether denormals are flushed
    (the calling thread's setting outside retrofit's kernels, and whether retrofit flushes around its biased
    kernels: ``retrofit.kernels.denormal``). Every benchmark JSON records it: a figure holds for its CPU."""
    out = {"processor": platform.processor() or platform.machine(), "vendor": None, "flags": []}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    lines = text.splitlines()

    def field(key):
        return next(
            (
                line.split(":", 1)[1].strip()
                for line in lines  # noqa: E731
                if line.split(":", 1)[0].strip() == key
            ),
            None,
        )

    if lines:
        flags = (field("flags") or "").split()
        out.update(
            processor=field("model name") or out["processor"],
            vendor=field("vendor_id"),
            flags=sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2", "fma", "avx_vnni"))),
        )
    out["cpu_count"] = os.cpu_count()
    try:
        import torch

        out["torch_threads"] = torch.get_num_threads()
        out["flush_denormal"] = {"process": is_flushing(), "retrofit_kernels": flush_enabled() and flush_supported()}
    except ImportError:
        pass
    return out


def bf16_native(flags: list[str]) -> bool | None:
    """Whether a CPU with these flags (``cpu_info``) computes bf16 matmuls natively (AVX-512 BF16 or AMX); None
    when the flags are unknown (not Linux)."""
    return any(f in flags for f in ("avx512_bf16", "amx_bf16")) if flags else None


# ---- denormals: what the process does (the kernels flush around their biased calls: kernels/denormal.py) ----
_TINY = None  # a (1,) fp32 tensor holding a denormal: x * 1 is 0 when this thread flushes
_supported = None


def flush_enabled() -> bool:
    """Whether retrofit's kernels flush denormals (``RETROFIT_FLUSH_DENORMAL``: on unless 0, off or false)."""
    return os.environ.get("RETROFIT_FLUSH_DENORMAL", "1") not in ("0", "off", "false")


def is_flushing() -> bool:
    """Whether the calling thread flushes denormals (read by computing one: torch has no getter)."""
    import torch

    global _TINY
    if _TINY is None:
        _TINY = torch.full((1,), 2.0**-140)
    with torch.no_grad():
        return bool((_TINY * 1.0).item() == 0.0)


def flush_supported() -> bool:
    """The CPU can flush (x86 with DAZ): ``torch.set_flush_denormal`` says so."""
    import torch

    global _supported
    if _supported is None:
        before = is_flushing()
        _supported = bool(torch.set_flush_denormal(True))
        torch.set_flush_denormal(before)
    return _supported
