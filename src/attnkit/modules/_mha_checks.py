"""The argument checks of `MultiHeadAttention`: the key/value and head widths its constructor
resolves (`kv_dims`, `resolve_head_dim`) and the inputs each call gets (`check_inputs`: shapes,
widths, dtypes, positions). Errors are ValueErrors naming the argument, what it got and what
it must be."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.modules._checks import positive_int
from attnkit.modules.projection import FusedQKV


def check_inputs(mha, query, key, value, pos, context_pos) -> None:
    """The inputs of `MultiHeadAttention.heads_qkv`: ranks, batch and sequence sizes, widths
    (unless lazy), dtypes, and positions that broadcast to their inputs."""
    check_input("query", query, None, mha.dim)
    b = query.shape[0]
    if key is None:
        if value is not None:
            raise ValueError("value needs key (self-attention takes neither)")
    else:
        lazy = mha.dim is None and isinstance(mha.in_proj, FusedQKV)
        kd, vd = (query.shape[-1],) * 2 if lazy else (mha.in_proj.key_dim, mha.in_proj.value_dim)
        check_input("key", key, b, kd)
        if value is None and vd != kd:
            raise ValueError(
                f"this attention reads values of width {vd} apart from keys of width {kd}: "
                f"pass value=(B, S, {vd})"
            )
        if value is not None:
            check_input("value", value, b, vd, seq=key.shape[1])
    _check_dtypes(mha.in_proj, {"query": query, "key": key, "value": value})
    for name, p, ref in (("pos", pos, query), ("context_pos", context_pos, key)):
        if p is None:
            continue
        if ref is None:
            raise ValueError("context_pos needs a key (or context)")
        try:
            ok = torch.broadcast_shapes(p.shape, ref.shape) == ref.shape
        except RuntimeError:  # does not broadcast at all
            ok = False
        if not ok:
            raise ValueError(
                f"{name} of shape {tuple(p.shape)} does not broadcast to {tuple(ref.shape)}"
            )


def _check_dtypes(in_proj: nn.Module, inputs: dict) -> None:
    """Floating inputs of the projections' dtype (autocast aside): torch's matmul error
    otherwise, which names neither."""
    lazy = nn.parameter.UninitializedParameter
    w = next((p for p in in_proj.parameters() if not isinstance(p, lazy)), None)
    for name, t in inputs.items():
        if t is None:
            continue
        if not t.is_floating_point():
            raise ValueError(f"{name} must be floating point (embeddings, not ids), got {t.dtype}")
        mixed = w is not None and t.dtype != w.dtype
        if mixed and not torch.is_autocast_enabled(t.device.type):
            raise ValueError(
                f"{name} has dtype {t.dtype}, the module's weights {w.dtype}: convert the "
                f"input (.to({w.dtype})) or the module (.to({t.dtype}))"
            )


def check_input(name, t, batch, width, *, seq=None) -> None:
    """t must be (B, S, width): batch and seq when given, width when known (not lazy)."""
    if not isinstance(t, Tensor) or t.dim() != 3:
        got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(
            f"{name} must have shape (B, {'N' if batch is None else 'S'}, C), got {got}"
        )
    ok = (batch is None or t.shape[0] == batch) and (seq is None or t.shape[1] == seq)
    if not ok or (width is not None and t.shape[-1] != width):
        want = (
            f"({'B' if batch is None else f'B={batch}'}, "
            f"{'N' if batch is None else 'S' if seq is None else f'S={seq}'}, "
            f"{'C' if width is None else width})"
        )
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")


def kv_dims(dim, context_dim, key_dim, value_dim) -> tuple[int | None, int | None]:
    """Widths (Ck, Cv) of the key and value inputs; `context_dim` sets both."""
    context_dim = positive_int("context_dim", context_dim, optional=True)
    key_dim = positive_int("key_dim", key_dim, optional=True)
    value_dim = positive_int("value_dim", value_dim, optional=True)
    if context_dim is not None:
        for name, width in (("key_dim", key_dim), ("value_dim", value_dim)):
            if width is not None and width != context_dim:
                raise ValueError(
                    f"context_dim={context_dim} sets key_dim and value_dim; got {name}={width} "
                    "(pass key_dim and value_dim alone)"
                )
        return context_dim, context_dim
    if dim is None and key_dim is None and value_dim is not None:
        raise ValueError("dim=None (lazy) with value_dim needs key_dim too")
    key_dim = dim if key_dim is None else key_dim
    return key_dim, key_dim if value_dim is None else value_dim


def resolve_head_dim(dim, num_heads, num_kv_heads, head_dim, out_dim) -> int:
    if positive_int("num_kv_heads", num_kv_heads) and num_heads % num_kv_heads:
        raise ValueError(
            f"num_kv_heads must be a positive divisor of num_heads={num_heads}, "
            f"got {num_kv_heads!r}"
        )
    if head_dim is not None:
        return positive_int("head_dim", head_dim)
    width = dim if dim is not None else out_dim
    if width is None:
        raise ValueError("dim=None (lazy) needs head_dim or out_dim to size the heads")
    if width % num_heads:
        raise ValueError(
            f"{'dim' if dim is not None else 'out_dim'}={width} is not divisible by "
            f"num_heads={num_heads}; pass head_dim to choose the head width"
        )
    return width // num_heads
