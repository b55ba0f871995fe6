"""How a sequence is cut across P ranks: shard, unshard, and the positions each rank holds.

Legend: P ranks (world size), r this rank, L the full sequence length along ``dim``.

* ``"contiguous"``: rank r holds positions [r L/P, (r+1) L/P).
* ``"zigzag"``: the sequence is cut into 2P equal chunks and rank r holds chunks r and
  2P-1-r, concatenated in that order (the convention of zhuzilin/ring-flash-attention).
  Under a causal mask every rank then does the same amount of work: its early chunk sees few
  keys, its late chunk many.

Within each rank's shard positions are increasing in both layouts, so a causal mask on the
local shard alone is the global causal mask restricted to it (what the ring's diagonal block
relies on).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["LAYOUTS", "check_layout", "gather", "positions", "shard", "unshard"]

LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _pieces(length: int, world: int, layout: str, name: str = "length") -> int:
    """Number of equal pieces the sequence is cut into; ValueError if they are not equal."""
    check_layout(layout)
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world size must be a positive integer, got {world!r}")
    pieces = world if layout == "contiguous" else 2 * world
    if length % pieces:
        raise ValueError(
            f"{name}={length} must be divisible by {pieces} for layout={layout!r} with "
            f"{world} ranks ({'P' if layout == 'contiguous' else '2P'} equal chunks)"
        )
    return pieces


def positions(length: int, rank: int, world: int, layout: str = "contiguous") -> Tensor:
    """Global positions (L/P,) held by ``rank``, in the order of its shard."""
    pieces = _pieces(length, world, layout)
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    c = length // pieces
    if layout == "contiguous":
        return torch.arange(rank * c, (rank + 1) * c)
    late = 2 * world - 1 - rank
    return torch.cat(
        [torch.arange(rank * c, (rank + 1) * c), torch.arange(late * c, (late + 1) * c)]
    )


def shard(x: Tensor, rank: int, world: int, *, dim: int = 2, layout: str = "contiguous") -> Tensor:
    """This rank's slice of a full tensor along ``dim`` (default 2: (B, H, L, D) -> (B, H, L/P, D)).

    Raises ValueError when the length does not divide into P (contiguous) or 2P (zigzag) chunks.
    Returns a copy for zigzag and a view for contiguous.
    """
    length = x.shape[dim]
    idx = positions(length, rank, world, layout)
    if layout == "contiguous":
        return x.narrow(dim, int(idx[0]), idx.numel())
    return x.index_select(dim, idx.to(x.device))


def unshard(
    shards: list[Tensor] | tuple[Tensor, ...], *, dim: int = 2, layout: str = "contiguous"
) -> Tensor:
    """The full tensor from every rank's shard (in rank order): the inverse of `shard`."""
    world = len(shards)
    if world == 0:
        raise ValueError("shards must hold one tensor per rank, got none")
    cat = torch.cat(list(shards), dim)  # positions in rank order: (…, L, …)
    if layout == "contiguous":
        check_layout(layout)
        return cat
    order = torch.cat([positions(cat.shape[dim], r, world, layout) for r in range(world)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())  # where each global position sits in `cat`
    return cat.index_select(dim, inverse.to(cat.device))


def gather(x: Tensor, *, dim: int = 2, layout: str = "contiguous", group=None) -> Tensor:
    """All-gather every rank's shard and unshard: the full tensor on every rank (no gradient)."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return unshard(parts, dim=dim, layout=layout)
