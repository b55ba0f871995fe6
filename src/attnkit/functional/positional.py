"""Fixed positional encodings (no parameters; learned ones live in attnkit.modules).

Dimensions: B batch, N positions, C model width, h × w a feature-map grid.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["detr_sine_2d", "sincos_2d", "sinusoidal"]


def _check(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def sinusoidal(
    n: int,
    dim: int,
    *,
    base: float = 10000.0,
    offset: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """The Transformer's encoding (Vaswani et al. 2017, §3.5), shape (N, C).

    PE[pos, 2i] = sin(pos / base^(2i/C)), PE[pos, 2i+1] = cos(pos / base^(2i/C)),
    for pos = offset, ..., offset + N - 1 (offset lets a decoder with a cache
    encode only its new positions). An odd C drops the last cosine column.
    Computed in float64 and cast, so large positions keep their precision.
    """
    _check("n", n, 0)
    _check("dim", dim, 1)
    pos = torch.arange(offset, offset + n, dtype=torch.float64, device=device)[:, None]  # (N, 1)
    i2 = torch.arange(0, dim, 2, dtype=torch.float64, device=device)  # (ceil(C/2),)
    angle = pos * torch.exp(-math.log(base) * i2 / dim)  # (N, ceil(C/2))
    pe = torch.empty(n, dim, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return pe.to(dtype)


def _sincos_1d(pos: Tensor, dim: int, base: float) -> Tensor:
    """(P,) positions -> (P, dim): [sin(pos·ω), cos(pos·ω)], ω_i = base^(-i/(dim/2))."""
    omega = base ** (-torch.arange(dim // 2, dtype=torch.float64, device=pos.device) / (dim // 2))
    angle = pos[:, None] * omega[None, :]  # (P, dim/2)
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)


def sincos_2d(
    grid_h: int,
    grid_w: int,
    dim: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """2-D sin-cos encoding for an image grid in row-major patch order, shape (h·w, C).

    The first C/2 channels encode the row, the last C/2 the column, each as
    [sin, cos] of the coordinate at C/4 frequencies (the fixed encoding of MAE,
    He et al. 2022, and of "simple ViT", Beyer et al. 2022). C must be a
    multiple of 4.
    """
    _check("grid_h", grid_h, 1)
    _check("grid_w", grid_w, 1)
    if dim % 4:
        raise ValueError(f"sincos_2d: dim must be a multiple of 4, got {dim}")
    rows = torch.arange(grid_h, dtype=torch.float64, device=device)
    cols = torch.arange(grid_w, dtype=torch.float64, device=device)
    row_of = rows.repeat_interleave(grid_w)  # (h·w,) row index of each patch
    col_of = cols.repeat(grid_h)  # (h·w,)
    pe = torch.cat([_sincos_1d(row_of, dim // 2, base), _sincos_1d(col_of, dim // 2, base)], 1)
    return pe.to(dtype)


def detr_sine_2d(
    mask: Tensor,
    dim: int,
    *,
    temperature: float = 10000.0,
    normalize: bool = True,
    scale: float = 2 * math.pi,
    eps: float = 1e-6,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """DETR's 2-D sine positions of a padded feature map: mask (B, h, w) -> (B, h·w, C).

    `mask` is True on real pixels, False on padding (attnkit's polarity; DETR's
    own `NestedTensor` mask is the opposite). Each real pixel's row y and column
    x count real pixels from 1 (a cumulative sum over the mask), so padding does
    not shift the positions of the image; with `normalize` they are divided by
    the image's last row / column and multiplied by `scale`, giving (0, 2π] for
    any image size. The first C/2 channels encode y, the last C/2 x, each as
    interleaved [sin, cos] pairs at frequencies temperature^(-2i/(C/2)) (Carion
    et al. 2020, `PositionEmbeddingSine` of the DETR code; the order of
    transformers' `DetrSinePositionEmbedding`). Padded pixels get values too
    (their keys are masked, not their positions). Tokens are in row-major
    order, as `feature_map.flatten(2).transpose(1, 2)` gives them.

    Not `sincos_2d`: that one counts from 0, is not normalised, puts all sines
    before all cosines and knows no padding. Computed in float64, then cast.
    C must be a multiple of 4.
    """
    if not isinstance(mask, Tensor) or mask.dim() != 3 or mask.dtype != torch.bool:
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask)
        raise ValueError(f"mask must be a bool tensor (B, h, w), True = real pixel, got {got}")
    _check("dim", dim, 4)
    if dim % 4:
        raise ValueError(f"detr_sine_2d: dim must be a multiple of 4, got {dim}")
    real = mask.to(torch.float64)
    y = real.cumsum(1)  # (B, h, w): 1, 2, ... down each column's real pixels
    x = real.cumsum(2)  # (B, h, w): 1, 2, ... along each row's real pixels
    if normalize:
        y = y / (y[:, -1:, :] + eps) * scale
        x = x / (x[:, :, -1:] + eps) * scale
    half = dim // 2
    i = torch.arange(half, dtype=torch.float64, device=mask.device)
    freq = temperature ** (2 * torch.div(i, 2, rounding_mode="floor") / half)  # (C/2,)
    pos_y, pos_x = y[..., None] / freq, x[..., None] / freq  # (B, h, w, C/2) each
    # [sin of even channels, cos of odd channels] interleaved: sin0, cos1, sin2, cos3, ...
    pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)
    pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)
    pe = torch.cat((pos_y, pos_x), dim=3)  # (B, h, w, C)
    return pe.flatten(1, 2).to(dtype)  # (B, h·w, C)
