"""The compiled kernel's finiteness scan (_native/finite.h), apart from `native` so that
`attention`'s short path can read it without importing `native` (whose custom ops import
torch._dynamo: a second of start-up that `attnkit explain` does not pay)."""

from __future__ import annotations

import ctypes

import torch

from attnkit.functional._kernel_cache import load_if_ready

__all__ = ["FINITE_CODES", "FINITE_MAX_NUMEL", "finite_check"]

# finite.h's dtype codes for `finite_check`
FINITE_CODES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2, torch.float16: 3}
FINITE_MAX_NUMEL = 2**31 - 1  # n is a C int
# PYFUNCTYPE: called holding the GIL (dropping and retaking it costs more than a small scan);
# no argtypes: ctypes passes each Python int as a C int without a converter object
_ALL_FINITE = ctypes.PYFUNCTYPE(ctypes.c_int)
_all_finite = None


def finite_check():
    """The kernel's ``attnkit_all_finite(addr & 0xFFFFFFFF, addr >> 32, numel, code)`` (1: the
    `numel` <= `FINITE_MAX_NUMEL` contiguous elements at `addr` are all finite, 0: one is a
    NaN or ±inf; `code` from `FINITE_CODES`) once the library is loaded, or can be loaded
    without a compiler (`_kernel_cache.load_if_ready`: the wheel's prebuilt kernel, or one
    compiled here before), else None: it never builds the library, so a process whose first
    calls would need a compiler takes another way (the short path of `attention`: one sum of
    q). The arguments must be in range: ctypes keeps the low 32 bits of each without a word."""
    global _all_finite
    if _all_finite is None and (lib := load_if_ready()) is not None:
        _all_finite = _ALL_FINITE(("attnkit_all_finite", lib))
    return _all_finite
