"""The drop-ins' exceptions: attnkit's message, and an instance of what torch raises there.

Code written for torch catches torch's classes (`except RuntimeError` around SDPA, whose checks
are C++ TORCH_CHECKs; `assertRaises(AssertionError)` around `nn.MultiheadAttention`, whose
Python checks raise AssertionError); attnkit's own convention is ValueError. Each class is
both, so either `except` catches it.
"""

from __future__ import annotations

__all__ = ["TorchAssertionError", "TorchRuntimeError"]


class TorchRuntimeError(ValueError, RuntimeError):
    """Bad input where torch raises RuntimeError (SDPA's checks; MHA's attn_mask shape,
    `is_causal` without `attn_mask`, dtype mismatches)."""


class TorchAssertionError(ValueError, AssertionError):
    """Bad input where torch.nn.MultiheadAttention raises AssertionError (the shapes of
    query, key, value and key_padding_mask; a mask of another dtype)."""
