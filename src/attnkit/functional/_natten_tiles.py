"""The tiles a 2-D neighbourhood (`reordered.neighborhood_2d`) is reordered in, chosen per
kernel from the estimated cost of the blocks the kernel would compute.

Legend: N = height · width tokens of a row-major canvas, kh × kw the neighbourhood, th × tw a
tile; queries and keys are reordered tile by tile (tiles in raster order, raster order inside).

A query block of tiles computes every key block its rows' neighbourhoods touch, so the tile
sets the waste: 8 × 8 tiles give a 15 × 15 neighbourhood 2.15 entries computed per allowed
one (64 × 64 canvas) against 2.36 for 4 × 4, while a 7 × 7 one gets 6.73 from 8 × 8 and 3.52
from 4 × 4.

Each candidate's non-empty blocks are counted on `_grid.FINE_GRID` from the neighbourhoods
themselves (N · kh · kw pairs, on a canvas of at most `_PROXY` a side: the choice follows the
kernel more than the canvas) and priced by `_grid.tile_grid_cost`, the estimate that then
chooses the grid; 8 × 8 stays unless another tile is `_MARGIN` cheaper. The kernel computes
a query tile's adjacent key blocks (3 runs of 3 tiles for 15 × 15) as one product each
(`kMergeKeys`, _native/masks.h): 0.86-0.92x the time of one product a block. Measured (AMD EPYC
Zen 4, 1 thread, H=8, D=64, 64 × 64, forward, fastest of 9-11 interleaved runs, time ÷
(density × dense time per entry)), 8 × 8 → 4 × 4 tiles: 7 × 7 8.5 → 6.4 and 9 × 9 5.4 → 4.2
(estimated 12 % and 8 % cheaper: 4 × 4 taken), 5 × 5 12.1 → 16.2 (2 %: kept 8 × 8),
11 × 11 4.8 → 6.5 and 15 × 15 2.5 → 3.0 (dearer); 8 × 8 → 16 × 16: 3 × 3 50.7 → 51.5,
21 × 21 3.4 → 3.7 although estimated 6 % and 14 % cheaper, so 16 × 16 is no candidate.

Tried for 15 × 15 and not kept (same units, forward, 64 × 64; entries computed per allowed
one at 64 × 64 / 128 × 128; shared 8 × 8 tiles: 2.15 / 2.35, 2.5–3.0): keys in an order of
their own, in 8-row bands (column-major inside) under 8 × 8 query tiles, each row's runs
cut to the bands and a tile mask inside, 1.97 / 2.15 in 3 key blocks a query block instead
of 9, and 4 × 8 query tiles on 4-row bands 1.70 / 1.82: 2.9 and 3.0 against 2.8; keys copied
per band of query rows so that a query block's keys are one run (15 runs a row, exact),
1.82 / 1.98: 2.9–3.3, the copies of k and v (2.5–4.4×) and masking 15 runs a row each
costing ~0.3 (2.2 without either); keys in column strips 8 wide (31 runs a row) 9.8; each row
over its own 15 runs without matrix products (a row path for runs, kernel change) 2.8, a
row reading its 225 key and value rows from the cache at ~16 ns a key.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from attnkit.functional._grid import FINE_GRID, tile_grid_cost

__all__ = ["choose_tile", "tile_order"]

# Candidate tiles (rows, columns): the default, and the others for all kernels or for
# kernels that are not square.
_DEFAULT = (8, 8)
_SQUARE, _OBLONG = ((4, 4),), ((4, 4), (4, 8), (8, 4))
_MARGIN = 0.95  # another tile replaces the default where it is estimated this much cheaper
_PROXY = 64  # the canvas side the candidates are priced on, at most (or the kernel's)
_CHUNK = 1 << 22  # (query, key) pairs a step when counting blocks


def tile_order(height: int, width: int, th: int, tw: int, device=None) -> Tensor:
    """The permutation (N,) that puts tokens tile by tile: tiles of th × tw in raster order,
    raster order inside a tile (edge tiles cut by the canvas)."""
    pos = torch.arange(height * width, device=device)
    y, x = pos // width, pos % width
    tile = (y // th) * -(-width // tw) + x // tw
    return torch.argsort(tile * (th * tw) + (y % th) * tw + x % tw)


def neighbours(height: int, width: int, kh: int, kw: int, q: Tensor) -> Tensor:
    """The kh · kw keys of queries q (token ids), NATTEN's clamped windows: (len(q), kh · kw)."""
    y0 = (q // width - kh // 2).clamp(0, height - kh)
    x0 = (q % width - kw // 2).clamp(0, width - kw)
    dy = torch.arange(kh, device=q.device).repeat_interleave(kw)  # (kh·kw,)
    dx = torch.arange(kw, device=q.device).repeat(kh)
    return (y0[:, None] + dy) * width + x0[:, None] + dx


def _cost(height: int, width: int, kh: int, kw: int, tile: tuple[int, int]) -> float:
    """Estimated forward time of the reordered neighbourhood in `tile`s, in entries' worth."""
    n = height * width
    where = torch.argsort(tile_order(height, width, *tile))  # token -> position
    fq, fk = FINE_GRID
    nqf, nkf = -(-n // fq), -(-n // fk)
    touched = torch.zeros(nqf * nkf, dtype=torch.int8)
    step = max(1, _CHUNK // (kh * kw))
    for q0 in range(0, n, step):
        q = torch.arange(q0, min(q0 + step, n))
        cells = where[q][:, None] // fq * nkf + where[neighbours(height, width, kh, kw, q)] // fk
        touched[cells.flatten()] = 1
    return tile_grid_cost(touched.view(1, 1, nqf, nkf))[1]


@functools.lru_cache(maxsize=64)
def choose_tile(height: int, width: int, kh: int, kw: int) -> tuple[int, int]:
    """The tile for a kh × kw neighbourhood: the default unless a candidate's blocks are
    estimated `_MARGIN` cheaper, priced on the canvas cut to `_PROXY` (or the kernel) a side."""
    h, w = min(height, max(_PROXY, kh)), min(width, max(_PROXY, kw))
    best, cost = _DEFAULT, _cost(h, w, kh, kw, _DEFAULT) * _MARGIN
    for tile in _SQUARE if kh == kw else _OBLONG:
        got = _cost(h, w, kh, kw, tile)
        if got < cost:
            best, cost = tile, got
    return best
