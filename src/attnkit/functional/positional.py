"""Fixed positional encodings (no parameters; learned ones live in attnkit.modules).

Dimensions: N positions, C model width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["sincos_2d", "sinusoidal"]


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
