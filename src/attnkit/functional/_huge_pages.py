"""Fresh CPU tensors hinted to Linux as transparent huge pages before their first write.

glibc serves allocations over its mmap threshold (32 MiB at most) with fresh mappings each
time, so a (1, 8, 16384, 64) float32 tensor faults in 8,192 pages of 4 KiB on its first
write: a gather into it took 29 ms against 13 ms with the hint (AMD EPYC Zen 4, 1 thread). The
compiled kernel hints the outputs it fills (`_native/scratch.h`, `advise_huge_pages`); this
does the same for the tensors PyTorch fills on attnkit's behalf (the reordered masks' gathers).
PyTorch hints its own large CPU allocations under THP_MEM_ALLOC_ENABLE; nothing process-wide
changes here, and a failed hint, another OS or another device gets a plain `torch.empty`.
"""

from __future__ import annotations

import ctypes
import functools
import sys

import torch
from torch import Tensor

from attnkit.functional._trace import tracing

__all__ = ["empty_hinted"]

_HUGE = 1 << 21  # bytes in a huge page (x86-64, arm64 with 4 KiB base pages)
_MADV_HUGEPAGE = 14  # linux/mman.h
_WORTH = 4 << 20  # bytes below which the allocator reuses blocks and the hint gains nothing


@functools.cache
def _madvise():
    """libc's madvise, or None off Linux or without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def empty_hinted(like: Tensor) -> Tensor:
    """torch.empty_like(like, contiguous), its whole huge pages hinted where that helps."""
    out = torch.empty(like.shape, dtype=like.dtype, device=like.device)
    nbytes = out.numel() * out.element_size()
    # a traced tensor (fake, functional) has no memory to hint
    hint = out.device.type == "cpu" and nbytes >= _WORTH and not tracing()
    advise = _madvise() if hint else None
    if advise is not None:
        start = out.data_ptr()
        lo, hi = -(-start // _HUGE) * _HUGE, (start + nbytes) // _HUGE * _HUGE
        if hi > lo:
            advise(lo, hi - lo, _MADV_HUGEPAGE)  # a failure (EINVAL, ENOMEM) only loses the hint
    return out
