"""Positional encodings as modules (learned and sinusoidal) and the ViT patch embedding.

Dimensions: B batch, N tokens, C width. Both add the encoding of positions
offset, ..., offset + N - 1 to x (offset: positions already in a decoder cache), or of
the positions `position_ids` (N,) or (B, N) gives (a packed batch, whose positions restart
at each document: `attnkit.masks.document_positions`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.functional.positional import sinusoidal
from attnkit.modules._checks import check_image, positive_int
from attnkit.modules._checks import position_ids as checked_positions

__all__ = ["LearnedPositionalEmbedding", "PatchEmbed", "SinusoidalPositionalEncoding"]


def _check(x: Tensor, offset: int, max_len: int, dim: int) -> None:
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(f"x must have shape (B, N, {dim}), got {tuple(x.shape)}")
    if offset < 0 or offset + x.shape[1] > max_len:
        raise ValueError(
            f"positions {offset}..{offset + x.shape[1] - 1} exceed max_len={max_len} "
            f"(x has {x.shape[1]} tokens)"
        )


def _positions(x: Tensor, ids: Tensor, max_len: int, dim: int) -> Tensor:
    """Checked position ids (B|1, N) for x (B, N, C): integers in [0, max_len)."""
    _check(x, 0, max(max_len, x.shape[1]), dim)  # the shape only; the ids set the positions
    return checked_positions(ids, x.shape[0], x.shape[1], limit=max_len)


class LearnedPositionalEmbedding(nn.Module):
    """x + P[offset : offset + N] with P a trained table (max_len, C) (BERT, GPT-2, ViT)."""

    def __init__(
        self, max_len: int, dim: int, *, init_std: float = 0.02, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.max_len, self.dim = positive_int("max_len", max_len), positive_int("dim", dim)
        self.init_std = init_std
        self.weight = nn.Parameter(torch.empty(max_len, dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, init_std) entries."""
        nn.init.normal_(self.weight, std=self.init_std)

    def forward(self, x: Tensor, offset: int = 0, *, position_ids: Tensor | None = None) -> Tensor:
        """(B, N, C) -> (B, N, C); `position_ids` (N,) or (B, N) instead of offset.."""
        if position_ids is not None:
            return x + self.weight[_positions(x, position_ids, self.max_len, self.dim)]
        _check(x, offset, self.max_len, self.dim)
        return x + self.weight[offset : offset + x.shape[1]]


class SinusoidalPositionalEncoding(nn.Module):
    """x + PE[offset : offset + N], the fixed encoding of Vaswani et al. 2017, §3.5."""

    def __init__(
        self, dim: int, max_len: int = 4096, *, base: float = 10000.0, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.dim, self.max_len = positive_int("dim", dim), positive_int("max_len", max_len)
        self.base = base
        dtype = torch.get_default_dtype() if dtype is None else dtype
        # Non-persistent and recomputed by reset_parameters (after `to_empty`).
        self.register_buffer(
            "table", torch.empty(max_len, dim, device=device, dtype=dtype), persistent=False
        )
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Recompute the table (N_max, C) on its own device and dtype."""
        t = self.table
        t.copy_(sinusoidal(self.max_len, self.dim, base=self.base, dtype=t.dtype, device=t.device))

    def forward(self, x: Tensor, offset: int = 0, *, position_ids: Tensor | None = None) -> Tensor:
        """(B, N, C) -> (B, N, C); `position_ids` (N,) or (B, N) instead of offset.."""
        if position_ids is not None:
            pos = _positions(x, position_ids, self.max_len, self.dim)
            return x + self.table[pos].to(x.dtype)
        _check(x, offset, self.max_len, self.dim)
        return x + self.table[offset : offset + x.shape[1]].to(x.dtype)


class PatchEmbed(nn.Module):
    """Non-overlapping P × P patches, each linearly projected: (B, Ci, I, I) -> (B, N, C).

    A "hard split" (nn.Unfold with stride = kernel = P; T2TEmbed's soft split
    overlaps) then a Linear on each flattened patch (c, y, x order). Tokens are
    in row-major grid order; `grid` = (I/P, I/P). `device`, `dtype`: of the parameters.
    """

    def __init__(
        self, image_size: int, patch_size: int, in_chans: int, dim: int, *, device=None, dtype=None
    ) -> None:
        super().__init__()
        image_size = positive_int("image_size", image_size)
        patch_size = positive_int("patch_size", patch_size)
        in_chans, dim = positive_int("in_chans", in_chans), positive_int("dim", dim)
        if image_size % patch_size:
            raise ValueError(
                f"patch_size must divide image_size={image_size}, got patch_size={patch_size}"
            )
        self.image_size, self.in_chans = image_size, in_chans
        self.grid = (image_size // patch_size, image_size // patch_size)
        self.split = nn.Unfold(patch_size, stride=patch_size)
        self.proj = nn.Linear(in_chans * patch_size**2, dim, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        """(B, Ci, I, I) -> (B, N, C)."""
        check_image(x, self.in_chans, self.image_size, "PatchEmbed")
        return self.proj(
            self.split(x).transpose(1, 2)
        )  # (B, Ci·P², N) -> (B, N, Ci·P²) -> (B, N, C)
