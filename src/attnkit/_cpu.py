"""What this CPU can do, read once from /proc/cpuinfo (Linux; empty elsewhere)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

__all__ = ["cpu_flags", "cpu_name", "has_native_bf16"]


@functools.cache
def _cpuinfo_field(*names: str) -> str:
    """The value of the first CPU's first field among `names` ("" when there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in names:
                return value.strip()
    except OSError:
        pass
    return ""


def cpu_flags() -> frozenset[str]:
    """The feature flags of the first CPU ("avx2", "avx512_bf16", "amx_bf16", ...)."""
    return frozenset(_cpuinfo_field("flags", "Features").split())


def cpu_name() -> str:
    """The CPU's model name, e.g. "Intel(R) Xeon(R) Processor"."""
    return _cpuinfo_field("model name") or platform.processor()


def has_native_bf16() -> bool:
    """bfloat16 dot products in hardware (AVX512-BF16 or AMX-BF16): torch's bf16 kernels are
    fast here; without them bf16 matmuls run at about a quarter of the float32 rate."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})
