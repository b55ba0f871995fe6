"""The ``fused`` backend: torch's `scaled_dot_product_attention`, given attnkit's meaning (the
mask, causal limit and bias as one SDPA mask; bottom-right causal; rows that see no key give 0).

Legend: B batch, H heads, N queries, S keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.functional._double_backward import exact_sdpa_second_order
from attnkit.functional._reference import _allowed, _eager_cpu

__all__ = ["SDPA_ZEROES_EMPTY_ROWS", "fused", "sdpa_unmasked"]


def _probe_sdpa_empty_rows() -> bool:
    """Whether this torch's CPU SDPA gives a query row that may attend to nothing output 0 and
    finite gradients (torch >= 2.5; earlier ones give NaN, and `fused` zeroes such rows itself,
    at the cost of a pass over the mask: 0.4 ms at N=S=1024). Probed on float32 and bfloat16,
    boolean and -inf float masks, the flash and the math (dropout) paths; the probe's dropout
    draws come from a forked RNG, so the caller's random stream is untouched."""
    try:
        with torch.random.fork_rng(devices=[]):
            for dtype in (torch.float32, torch.bfloat16):
                q = torch.randn(1, 1, 3, 4, dtype=dtype, device="cpu", requires_grad=True)
                blocked = torch.zeros(3, 3, dtype=torch.bool, device="cpu")
                blocked[1] = True  # query 1 sees no key
                float_mask = torch.zeros(3, 3, dtype=dtype, device="cpu")
                float_mask = float_mask.masked_fill(blocked, float("-inf"))
                for attn_mask in (~blocked, float_mask):
                    for p in (0.0, 0.5):
                        out = F.scaled_dot_product_attention(
                            q, q, q, attn_mask=attn_mask, dropout_p=p
                        )
                        (grad,) = torch.autograd.grad(out.float().sum(), q)
                        if not ((out[..., 1, :] == 0).all() and torch.isfinite(grad).all()):
                            return False
    except RuntimeError:
        return False
    return True


# Probed once at import, not at first use: a first use may sit inside a dispatch mode, a FLOP
# counter, a compiled or exported trace, which must neither see the probe's calls nor branch on
# its result. A constant, so traced code reads it as one.
SDPA_ZEROES_EMPTY_ROWS = _probe_sdpa_empty_rows()


def fused(q, k, v, mask, bias, causal, scale, dropout_p) -> Tensor:
    """SDPA's output (B, H, N, Dv) for an `attention` call (mask and bias of rank 4)."""
    n, s = q.shape[2], k.shape[2]
    # a bool, never a traced size comparison (jit.trace turns sizes into tensors)
    gqa = bool(k.shape[1] != q.shape[1])
    # PyTorch's is_causal is top-left aligned; it equals ours only when N == S. Its CPU
    # kernel also gives NaN rows for a scale <= 0 (the masked -inf times the scale), so such
    # calls pass the causal limit as a boolean mask instead (found by the hypothesis test).
    if mask is None and bias is None and (not causal or (n == s and scale > 0)):
        return sdpa_unmasked(q, k, v, scale, dropout_p, causal, gqa)
    allowed = _allowed(mask, causal, n, s, q.device)
    if q.device.type == "cpu" and SDPA_ZEROES_EMPTY_ROWS:
        dead = None  # SDPA itself gives such rows output 0 and gradient 0
    else:
        blocked = None if allowed is None else ~allowed
        if bias is not None:
            inf = torch.isneginf(bias)
            blocked = inf if blocked is None else blocked | inf
        dead = None if blocked is None else blocked.all(dim=-1, keepdim=True)  # (..., N, 1)
        if dead is not None and _eager_cpu(q) and not bool(dead.any()):
            dead = None
    if bias is None:
        attn_mask = allowed if dead is None else allowed | dead
    else:
        attn_mask = bias.to(q.dtype)
        if allowed is not None:
            attn_mask = torch.where(allowed, attn_mask, float("-inf"))
        if dead is not None:
            # dead rows get finite scores so SDPA stays finite; zeroed below.
            attn_mask = torch.where(dead, 0.0, attn_mask)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=gqa
    )
    out = exact_sdpa_second_order(out)
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    return out


def sdpa_unmasked(q, k, v, scale: float, dropout_p: float, causal: bool, gqa: bool) -> Tensor:
    out = F.scaled_dot_product_attention(
        q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale, enable_gqa=gqa
    )
    return exact_sdpa_second_order(out)
