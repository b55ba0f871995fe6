"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer", §3.4), no parameters.

Dimensions: B batch, H heads, N positions, D head width, R rotary width
(R <= D, even: the first R channels of each head rotate, the other D - R pass
through, as GPT-NeoX's ``rotary_pct`` and GPT-J's ``rotary_dim`` allow).

RoPE rotates each pair of channels of q and k by an angle proportional to the
token's position, θ_i(p) = p · base^(-2i/R) for i = 0 .. R/2 - 1, so that
q_m · k_n depends on m - n only. It acts on q and k *before* attention, which
is why every `attention` backend works with it unchanged.

Which channels form a pair is a convention, and a checkpoint expects its own:

* rotate-half (``interleaved=False``): channel i pairs with i + R/2. Llama,
  Mistral, Qwen, GPT-NeoX, and `transformers`' ``rotate_half``.
* interleaved (``interleaved=True``): channel 2i pairs with 2i + 1. The RoFormer
  paper (eq. 34), GPT-J and `transformers`' ``rotate_every_two``.

The two are the same rotation up to a fixed permutation of the channels.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["apply_rotary", "rotary_tables"]


def rotary_tables(
    positions: int | Tensor,
    dim: int,
    *,
    base: float = 10000.0,
    offset: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, each (..., R/2).

    positions: an int N (positions offset, ..., offset + N - 1, so a decoder with
        a cache passes its length as `offset`) or a tensor (...,) of positions
        (e.g. (B, N) position ids after left padding; `offset` is added).
    dim: the rotary width R (even), usually the head width D.
    base: θ of the frequencies base^(-2i/R) (10000 in RoFormer and Llama 1/2,
        500000 in Llama 3 without its long-context rescaling).

    Computed in float64 and cast to `dtype`, so large positions keep their
    precision (`transformers` computes the angles in float32).
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"dim (the rotary width) must be an even integer >= 2, got {dim!r}")
    if not base > 0:
        raise ValueError(f"base must be > 0, got {base!r}")
    if isinstance(positions, Tensor):
        pos = positions.to(device=device or positions.device, dtype=torch.float64) + offset
    elif isinstance(positions, int) and not isinstance(positions, bool) and positions >= 0:
        pos = torch.arange(offset, offset + positions, dtype=torch.float64, device=device)
    else:
        raise ValueError(f"positions must be an int >= 0 or a tensor, got {positions!r}")
    i2 = torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device)  # (R/2,)
    angle = pos[..., None] * base ** (-i2 / dim)  # (..., R/2)
    return angle.cos().to(dtype), angle.sin().to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Rotate the first R channels of each head of x; R = 2 · cos.shape[-1].

    x: (B, H, N, D) queries or keys (any H: GQA keys have Hkv heads).
    cos, sin: (N, R/2) or (B, N, R/2) from `rotary_tables`; cast to x's dtype.
    interleaved: pairs (2i, 2i+1) (GPT-J, RoFormer) instead of (i, i + R/2)
        (Llama, NeoX). Returns a tensor shaped like x.

    Costs 3 FLOPs per rotated channel (two multiplies, one add), no negation:
    the pair (a, b) becomes (a·cos - b·sin, b·cos + a·sin).
    """
    if not isinstance(x, Tensor) or x.dim() != 4:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must have shape (B, H, N, D), got {got}")
    if cos.shape != sin.shape or cos.dim() not in (2, 3):
        raise ValueError(
            f"cos and sin must both have shape (N, R/2) or (B, N, R/2), "
            f"got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    rot = 2 * cos.shape[-1]
    n, d = x.shape[2], x.shape[3]
    if rot > d or cos.shape[-2] != n or (cos.dim() == 3 and cos.shape[0] not in (1, x.shape[0])):
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)} do not fit x of shape {tuple(x.shape)}: "
            f"want (N={n}, R/2) or (B={x.shape[0]}, N={n}, R/2) with R <= D={d}"
        )
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, N, R/2): shared by the heads
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    if interleaved:
        a, b = x_rot[..., 0::2], x_rot[..., 1::2]  # (B, H, N, R/2) each
        out = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    else:
        a, b = x_rot[..., : rot // 2], x_rot[..., rot // 2 :]  # (B, H, N, R/2) each
        out = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)  # (B, H, N, R)
    return torch.cat((out, x_pass), dim=-1) if rot < d else out
