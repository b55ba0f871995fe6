"""torch's `CausalBias` (``torch.nn.attention.bias.causal_upper_left`` / ``causal_lower_right``)
as attnkit's causal limit or row intervals, never as an (N, S) tensor.

Legend: N queries, S keys.

* lower right: query i sees keys j <= i + S - N, attnkit's own `causal` (bottom-right).
* upper left: query i sees keys j <= i. For N == S that is `causal` too; otherwise it is the
  row intervals [0, min(i + 1, S)) (two (1, N) integer arrays), a structured mask.

torch gives the first N - S rows of a lower-right bias with N > S NaN (it warns); attnkit gives
them output 0 and gradient 0, as every row that may attend to nothing.
"""

from __future__ import annotations

import sys

import torch

from attnkit.functional.structured import RowIntervals

__all__ = ["causal_bias_call", "causal_bias_parts", "is_causal_bias"]


def is_causal_bias(x) -> bool:
    """Whether `x` is a `torch.nn.attention.bias.CausalBias`. Read from sys.modules: importing
    that module imports torch._dynamo (~4 s), and a CausalBias exists only once it is imported."""
    bias = sys.modules.get("torch.nn.attention.bias")
    return bias is not None and isinstance(x, bias.CausalBias)


def causal_bias_parts(cb, n: int, s: int, device) -> tuple[RowIntervals | None, bool]:
    """(mask, causal) meaning `cb` for N = `n` queries and S = `s` keys: ``causal=True`` where
    it is attnkit's bottom-right causal limit, else upper-left row intervals."""
    from torch.nn.attention.bias import CausalVariant

    if (cb.seq_len_q, cb.seq_len_kv) != (n, s):
        raise ValueError(
            f"CausalBias was made for (L, S) = ({cb.seq_len_q}, {cb.seq_len_kv}) but the call "
            f"has L={n} queries and S={s} keys: make it with causal_*({n}, {s})"
        )
    if cb.variant == CausalVariant.LOWER_RIGHT or n == s:
        return None, True
    if cb.variant != CausalVariant.UPPER_LEFT:
        raise ValueError(f"CausalBias.variant must be a CausalVariant, got {cb.variant!r}")
    hi = (torch.arange(n, device=device) + 1).clamp(max=s)  # (N,): keys 0..min(i, S-1)
    return RowIntervals(torch.zeros_like(hi), hi, s, "causal_upper_left"), False


def causal_bias_call(mask, bias, causal: bool, n: int, s: int, device):
    """`attention`'s (mask, bias, causal) with a CausalBias passed as `mask` or `bias` (torch
    passes it as SDPA's attn_mask) turned into the causal limit or upper-left row intervals,
    ANDed with the rest."""
    limits = []
    if is_causal_bias(mask):
        limits.append(causal_bias_parts(mask, n, s, device))
        mask = None
    if is_causal_bias(bias):
        limits.append(causal_bias_parts(bias, n, s, device))
        bias = None
    for rows, bottom_right in limits:
        causal = causal or bottom_right
        if rows is not None:
            mask = rows if mask is None else rows & mask
    return mask, bias, causal
