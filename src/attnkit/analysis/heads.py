"""What heads do: attention distance, entropy and weight on special tokens.

Dimensions: L layers, B batch, H heads, N queries, S keys.

Per head, averaged over the real queries of a batch:

* mean attention distance  Σ_j p_ij · ‖pos_i − pos_j‖ — in tokens for text, in
  pixels for image patches (the ViT paper's Fig. 7, Dosovitskiy et al. 2021);
* entropy  −Σ_j p_ij log p_ij (nats): 0 for a head that looks at one key,
  log S for one that spreads evenly;
* special share  Σ_{j special} p_ij: the weight parked on [CLS]/[SEP] (Clark et
  al. 2019, "What does BERT look at?").

Local heads have small distance and entropy; global heads large ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["HeadStats", "grid_positions", "head_stats", "token_positions"]


def token_positions(n: int) -> Tensor:
    """Positions 0..N-1 of a text sequence as (N, 1) coordinates (distance in tokens)."""
    return torch.arange(n, dtype=torch.float64)[:, None]


def grid_positions(grid_h: int, grid_w: int, patch_size: float = 1.0, prefix: int = 0) -> Tensor:
    """Centres of row-major patches in pixels, (prefix + h·w, 2).

    `prefix` tokens (a class token) come first and get NaN coordinates so that
    they are left out as queries; weight they receive as keys counts at distance 0.
    """
    rows = torch.arange(grid_h, dtype=torch.float64).repeat_interleave(grid_w)
    cols = torch.arange(grid_w, dtype=torch.float64).repeat(grid_h)
    pos = torch.stack([rows, cols], dim=1) * patch_size  # (h·w, 2)
    return torch.cat([torch.full((prefix, 2), float("nan"), dtype=torch.float64), pos])


@dataclass(frozen=True)
class HeadStats:
    """Per layer and head, each (L, H), float64."""

    distance: Tensor
    entropy: Tensor
    special_share: Tensor | None

    def summary(self, unit: str = "tokens") -> list[str]:
        """One line per layer: distance range over heads, mean entropy, special share."""
        lines = []
        for layer in range(self.distance.shape[0]):
            d, e = self.distance[layer], self.entropy[layer]
            line = (
                f"layer {layer}: distance {d.min():.2f}–{d.max():.2f} {unit} "
                f"(mean {d.mean():.2f}), entropy {e.mean():.2f} nats"
            )
            if self.special_share is not None:
                line += f", on special tokens {100 * self.special_share[layer].mean():.0f}%"
            lines.append(line)
        return lines


def _as_layers(maps: Tensor | list[Tensor]) -> Tensor:
    stacked = torch.stack(list(maps)) if isinstance(maps, list | tuple) else maps
    if stacked.dim() == 4:
        stacked = stacked[None]
    if stacked.dim() != 5:
        raise ValueError(
            f"maps must be (B, H, N, S), (L, B, H, N, S) or a list of (B, H, N, S), "
            f"got {tuple(stacked.shape)}"
        )
    return stacked.double()


def head_stats(
    maps: Tensor | list[Tensor],
    *,
    positions: Tensor | None = None,
    query_mask: Tensor | None = None,
    special: Tensor | None = None,
) -> HeadStats:
    """Statistics of recorded attention, per layer and head.

    Args:
        maps: probabilities (L, B, H, N, S) or one layer (B, H, N, S), or a list.
        positions: (N, d) coordinates of the tokens (queries and keys share
            them, N == S); default `token_positions(N)`. NaN rows are left out.
        query_mask: (B, N) True for real queries (padding excluded).
        special: (S,) or (B, S) True for special keys ([CLS], [SEP]); None skips
            the special share.
    """
    p = _as_layers(maps)  # (L, B, H, N, S)
    _, b, _, n, s = p.shape
    if positions is None:
        positions = token_positions(n)
    if positions.shape[0] != n or n != s:
        raise ValueError(
            f"positions must have shape (N={n}, d) with N == S={s}, got {tuple(positions.shape)}"
        )
    pos = positions.double()
    valid = ~torch.isnan(pos).any(dim=1)  # (N,)
    dist = torch.cdist(pos.nan_to_num(), pos.nan_to_num())  # (N, S)
    dist = dist.masked_fill(~(valid[:, None] & valid[None, :]), 0.0)
    queries = valid[None].expand(b, n) if query_mask is None else query_mask & valid[None]
    weight = queries.double()[None, :, None, :]  # (1, B, 1, N)
    count = weight.sum(dim=(1, 3)).clamp_min(1)  # (1, 1)

    def mean_over_queries(per_query: Tensor) -> Tensor:  # (L, B, H, N) -> (L, H)
        return (per_query * weight).sum(dim=(1, 3)) / count

    distance = mean_over_queries((p * dist).sum(-1))
    entropy = mean_over_queries(-(p * torch.log(p.clamp_min(1e-300))).sum(-1))
    share = None
    if special is not None:
        special = special.bool().expand(b, s) if special.dim() == 1 else special.bool()
        share = mean_over_queries((p * special.double()[None, :, None, None, :]).sum(-1))
    return HeadStats(distance, entropy, share)
