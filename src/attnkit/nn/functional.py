"""`torch.nn.functional.scaled_dot_product_attention`'s signature and meaning, computed by
`attnkit.attention`.

Dimensions: ... leading batch dimensions (B), H query heads, Hkv key/value heads, L query
length, S key length, E query/key head width, Ev value head width.

Two conventions differ between torch's SDPA and `attnkit.attention`, and this function keeps
torch's: `is_causal` is aligned top-left when L != S (query i sees keys j <= i; attnkit's
`causal` is aligned bottom-right), and dropout acts whenever `dropout_p > 0` (SDPA has no
training flag). Boolean masks mean the same in both (True = may attend).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit.functional._causal_bias import causal_bias_parts, is_causal_bias
from attnkit.functional.attention import attention, attention_without_checks
from attnkit.nn._errors import TorchRuntimeError

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """softmax(scale · query keyᵀ + mask) · value, as torch's SDPA computes it.

    Args:
        query: (..., H, L, E) (rank 2 or more; the leading dimensions are batch).
        key: (..., Hkv, S, E).
        value: (..., Hkv, S, Ev).
        attn_mask: boolean, **True = may attend** (torch's SDPA convention, also attnkit's),
            or a float tensor added to the scores; broadcastable to (..., H, L, S). Or torch's
            `CausalBias` (``torch.nn.attention.bias.causal_upper_left(L, S)``: query i sees
            keys j <= i; ``causal_lower_right(L, S)``: j <= i + S - L), computed as attnkit's
            causal limit or row intervals, without an (L, S) tensor.
        dropout_p: dropout on the probabilities, applied whenever > 0 (as torch's SDPA does:
            pass 0.0 in evaluation).
        is_causal: query i attends to keys j <= i, aligned **top-left** when L != S (torch's
            alignment); with `attn_mask` too, both apply (as torch 2.13's CPU SDPA does).
        scale: multiplies query·keyᵀ; default 1/sqrt(E).
        enable_gqa: allow Hkv < H dividing H (query head h reads key/value head
            h // (H // Hkv)); without it Hkv must equal H, or be 1 (broadcast).

    Returns: (..., H, L, Ev). A query row that may attend to no key gets output 0 and
    gradient 0 (attnkit's rule, and torch's CPU SDPA since 2.5; never NaN).

    Bad input raises `TorchRuntimeError`: attnkit's message naming the argument, as an
    instance of both ValueError and the RuntimeError torch raises. Dropout keeps each
    probability with chance 1 - dropout_p and scales by 1 / (1 - dropout_p), as torch does,
    but from attnkit's own random stream: the same seed drops other positions than torch's.

    `torch.jit.trace` records attnkit's computation. `torch.jit.script` cannot compile
    attnkit's backends: in a scripted function or module this call is torch's own
    `F.scaled_dot_product_attention` with the same arguments, so it gives torch's results
    (its dropout stream, its errors).
    """
    if torch.jit.is_scripting():  # TorchScript compiles this branch only
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa,
        )  # fmt: skip
    return _attnkit_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _attnkit_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """`scaled_dot_product_attention` computed by `attnkit.attention` (eager, trace, export)."""
    out = _unmasked(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if out is not None:
        return out
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor) or t.dim() < 2:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise TorchRuntimeError(f"{name} must have shape (..., L|S, E) (rank >= 2), got {got}")
    causal_bias = attn_mask if is_causal_bias(attn_mask) else None  # causal_upper_left / ...
    attn_mask = None if causal_bias is not None else attn_mask
    if causal_bias is not None and is_causal:  # torch's CausalBias refuses the pair too
        raise TorchRuntimeError(
            "scaled_dot_product_attention: pass a CausalBias attn_mask or is_causal=True, not both"
        )
    heads, kv_heads = _heads(query), _heads(key)
    gqa_ok = enable_gqa and 0 < kv_heads <= heads and heads % kv_heads == 0
    if kv_heads not in (heads, 1) and not gqa_ok:  # one key/value head broadcasts, as in torch
        raise TorchRuntimeError(
            f"key has {kv_heads} heads (dimension -3), query {heads}: they must be equal or key's "
            + ("a divisor of query's" if enable_gqa else "1 (or pass enable_gqa=True)")
        )
    rank = max(query.dim(), key.dim(), value.dim())
    try:
        batch = torch.broadcast_shapes(*(t.shape[:-3] for t in (query, key, value)))
    except RuntimeError:
        shapes = ", ".join(str(tuple(t.shape)) for t in (query, key, value))
        raise TorchRuntimeError(
            f"query, key and value must share their batch dimensions (before -3), got {shapes}"
        ) from None
    q, k, v = (_as_4d(t, batch) for t in (query, key, value))  # (B, H|Hkv, L|S, E|Ev)
    n, s = q.shape[2], k.shape[2]
    mask = bias = None
    causal = False
    if causal_bias is not None:
        mask, causal = causal_bias_parts(causal_bias, n, s, q.device)
    elif attn_mask is not None:
        _check_mask(attn_mask, (*batch, q.shape[1], n, s))
        m = _mask_4d(attn_mask, max(rank, 3), batch)  # (B|1, H|1, L|1, S|1)
        if m.dtype == torch.bool:
            mask = m
        elif m.is_floating_point():
            bias = m.to(q.dtype)
        else:
            raise TorchRuntimeError(f"attn_mask must be boolean or floating, got {attn_mask.dtype}")
    if is_causal:  # with attn_mask too: both apply, as torch >= 2.13 does on the CPU
        if n == s:
            causal = True  # top-left and bottom-right agree
        else:
            tl = top_left_causal(n, s, q.device)
            mask = tl if mask is None else mask & tl
    p = float(dropout_p)
    try:
        out = attention(
            q, k, v, mask=mask, bias=bias, causal=causal, scale=scale, dropout_p=p, training=p > 0
        ).out  # (B, H, L, Ev)
    except TorchRuntimeError:
        raise
    except ValueError as e:  # attnkit's message, as the class torch raises (RuntimeError)
        raise TorchRuntimeError(f"scaled_dot_product_attention: {e}") from None
    out = out.reshape(*batch, *out.shape[1:])  # (..., H, L, Ev)
    return out[..., 0, :, :] if rank == 2 else out


def _unmasked(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """The call on `attention`'s short path (`attention_without_checks`: SDPA unmasked, ~1 µs
    of checks) when it has no mask or dropout, (B, H, L, E) inputs and heads torch's rules
    accept; the full route below gives the same output. None: the full route."""
    if attn_mask is not None or dropout_p:
        return None
    try:
        (_, h, n, _), (_, hkv, s, _) = query.shape, key.shape
    except (AttributeError, ValueError):  # not a tensor, or not 4-D
        return None
    if (is_causal and n != s) or not (hkv == h or hkv == 1 or enable_gqa):
        return None  # is_causal top-left (L != S); heads that torch refuses
    return attention_without_checks(query, key, value, causal=bool(is_causal), scale=scale)


def top_left_causal(n: int, s: int, device=None) -> Tensor:
    """(1, 1, L, S) boolean, True where key j <= query i: torch's `is_causal` alignment."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(s, device=device)[None, :]
    return (j <= i)[None, None]


def _check_mask(m: Tensor, want: tuple[int, ...]) -> None:
    """attn_mask must broadcast to (..., H, L, S) = `want` (torch's expand error otherwise)."""
    if not isinstance(m, Tensor):
        raise TorchRuntimeError(f"attn_mask must be a tensor or None, got {type(m).__name__}")
    head = f"attn_mask of shape {tuple(m.shape)} does not broadcast to (..., H, L, S) = {want}"
    if m.dim() > len(want):
        raise TorchRuntimeError(f"{head}: it has more dimensions than the inputs")
    if any(g not in (1, w) for g, w in zip(m.shape, want[len(want) - m.dim() :], strict=True)):
        raise TorchRuntimeError(head)


def _heads(t: Tensor) -> int:
    return t.shape[-3] if t.dim() >= 3 else 1


def _as_4d(t: Tensor, batch: torch.Size) -> Tensor:
    """(..., H, L, E) -> (B, H, L, E), B = prod(batch); rank 2 gets H = 1."""
    if t.dim() == 2:
        t = t[None]  # (1, L, E)
    if t.shape[:-3] != batch:
        t = t.expand(*batch, *t.shape[-3:])
    return t.reshape(math.prod(batch), *t.shape[-3:])  # a view unless the batch was expanded


def _mask_4d(m: Tensor, rank: int, batch: torch.Size) -> Tensor:
    """A mask broadcastable to (..., H, L, S) as (B|1, H|1, L|1, S|1), B = prod(batch)."""
    if m.dim() > rank:
        raise TorchRuntimeError(f"attn_mask has rank {m.dim()}, more than the inputs' {rank}")
    m = m[(None,) * (rank - m.dim())]  # (..., H|1, L|1, S|1) at the inputs' rank (>= 3)
    if all(d == 1 for d in m.shape[:-3]):
        return m.reshape(1, *m.shape[-3:])
    m = m.expand(*batch, *m.shape[-3:])
    return m.reshape(math.prod(batch), *m.shape[-3:])
