"""What this CPU can do, read once from /proc/cpuinfo (Linux; empty elsewhere)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

__all__ = ["cpu_flags", "has_native_bf16"]


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The feature flags of the first CPU ("avx2", "avx512_bf16", "amx_bf16", ...)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset({platform.processor()} - {""})


def has_native_bf16() -> bool:
    """bfloat16 dot products in hardware (AVX512-BF16 or AMX-BF16): torch's bf16 kernels are
    fast here; without them bf16 matmuls run at about a quarter of the float32 rate."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})
