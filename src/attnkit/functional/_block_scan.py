"""A mask's booleans read once, a chunk of whole blocks at a time, reduced to block classes.

Legend: B batch, H heads, N queries, S keys; bq × bk blocks of the (N, S) score grid.

A mask that is not row intervals (a `from_function` predicate, scattered documents, unions) is
classified by evaluating every entry once: a black-box predicate costs N · S evaluations, but
each should cost what torch's vectorised ops cost (≈2 ns an entry for a band predicate on AMD
EPYC Zen 4, 1 thread), not a Python call per block. So the booleans are read in chunks of whole
blocks of about `_CHUNK_ENTRIES` entries, each reduced to per-block counts by a reshape and two
sums (no loop over blocks), and only the partial blocks' booleans are kept. Larger chunks are
slower, not faster: a predicate's int64 temporaries of 64 MiB ran at 25 ns an entry against 2 ns
at 4 MiB (measured), every fresh allocation's pages being faulted in again.

Block maps, density, tile plans, the tile grid's choice and FlexAttention block masks all read
masks through `scan` (or `reduce_chunk` for blocks they pick themselves).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "TILE_EMPTY",
    "TILE_FULL",
    "BlockScan",
    "chunk_shape",
    "chunks",
    "reduce_chunk",
    "regrid",
    "scan",
    "tile_table",
    "with_sentinels",
]

EMPTY, PARTIAL, FULL = 0, 1, 2  # block classes: (any allowed) + (all allowed)
TILE_EMPTY, TILE_FULL = -1, -2  # a tile table's entries for blocks without a tile
_CHUNK_ENTRIES = 1 << 19  # B·H·rows·keys per evaluation: int64 temporaries of 4 MiB
_JOIN_BYTES = 1 << 22  # tiles of 64 chunks joined while they are this small (`_Pieces`)


class BlockScan(NamedTuple):
    classes: Tensor  # int8 (B, H, nqb, nkb): EMPTY, PARTIAL or FULL
    allowed: int  # entries that may attend, over (B, H, N, S)
    tiles: Tensor | None  # uint8 (T, bq, bk): partial blocks in row-major order, 0 past N, S
    places: Tensor | None = None  # int64 (T,): the tiles' flat (B, H, nqb, nkb) places, ascending


def chunks(mask, bq: int, bk: int) -> Iterator[tuple[int, int, Tensor]]:
    """(first query block, first key block, booleans (B, H, rows, keys)) over `mask` on the
    CPU: whole blocks, about `_CHUNK_ENTRIES` entries (never less than one block), all keys of
    a row of blocks first."""
    b, h, n, s = mask.shape
    if n == 0 or s == 0:
        return
    rows, keys = chunk_shape(b, h, n, s, bq, bk)
    for i0 in range(0, n, rows):
        for j0 in range(0, s, keys):
            got = mask.block(i0, min(i0 + rows, n), j0, min(j0 + keys, s))
            yield i0 // bq, j0 // bk, got.cpu().expand(b, h, *got.shape[2:])


def chunk_shape(b: int, h: int, n: int, s: int, bq: int, bk: int) -> tuple[int, int]:
    """(rows, keys) of one evaluation of a (B, H, N, S) mask on a bq × bk grid: whole blocks,
    all keys of a row of blocks where `_CHUNK_ENTRIES` allows, at least one block."""
    per_bh = max(1, _CHUNK_ENTRIES // (b * h))
    keys = min(-(-s // bk) * bk, max(bk, per_bh // bq // bk * bk))
    return min(-(-n // bq) * bq, max(bq, per_bh // keys // bq * bq)), keys


def _cells(got: Tensor, bq: int, bk: int) -> Tensor:
    """Booleans (B, H, r, k) as uint8 blocks (B, H, ceil(r/bq), bq, ceil(k/bk), bk), zero
    past r and k."""
    b, h, r, k = got.shape
    x = got.view(torch.uint8)  # a sum of bytes runs several times faster than any/all
    if r % bq or k % bk:
        x = torch.nn.functional.pad(x, (0, -k % bk, 0, -r % bq))
    return x.reshape(b, h, x.shape[2] // bq, bq, x.shape[3] // bk, bk)


def reduce_chunk(got: Tensor, bq: int, bk: int, tiles: bool) -> tuple[Tensor, int, Tensor | None]:
    """Block classes int8 (B, H, ceil(r/bq), ceil(k/bk)) of booleans (B, H, r, k), the
    entries they allow, and with `tiles` the partial blocks' booleans (P, bq, bk) uint8 in
    row-major order."""
    cells = _cells(got, bq, bk)
    counts = cells.sum(5, dtype=torch.int32).sum(3)  # (B, H, rq, rk)
    r, k = got.shape[2:]
    area = bq * bk
    if r % bq or k % bk:  # the real entries of each block
        rows = (r - torch.arange(counts.shape[2]) * bq).clamp(max=bq)
        area = rows[:, None] * (k - torch.arange(counts.shape[3]) * bk).clamp(max=bk)
    cls = (counts > 0).to(torch.int8) + (counts == area).to(torch.int8)  # EMPTY, PARTIAL, FULL
    kept = cells.permute(0, 1, 2, 4, 3, 5)[cls == PARTIAL] if tiles else None  # (P, bq, bk)
    return cls, int(counts.sum()), kept


def scan(mask, bq: int, bk: int, *, tiles: bool = False, repeatable: bool = False) -> BlockScan:
    """Every entry of `mask` evaluated once: its block classes on the bq × bk grid, the entries
    it allows and, with `tiles`, its partial blocks' booleans. Memory: the classes, the tiles
    and one chunk. `repeatable`: evaluate the first chunk twice and refuse a mask that changes
    (a plan is cached on the mask)."""
    b, h, n, s = mask.shape
    nqb, nkb = -(-n // bq), -(-s // bk)
    classes = torch.full((b, h, nqb, nkb), EMPTY, dtype=torch.int8)
    kept, where = _Pieces(), _Pieces()  # partial blocks' tiles, their flat (B, H, nqb, nkb) places
    allowed = 0
    for qb, kb, got in chunks(mask, bq, bk):
        if repeatable and qb == kb == 0:
            _check_repeatable(mask, got)
        cls, count, part = reduce_chunk(got, bq, bk, tiles)
        classes[:, :, qb : qb + cls.shape[2], kb : kb + cls.shape[3]] = cls
        allowed += count
        if tiles and part.shape[0]:
            kept.add(part)
            at = (cls == PARTIAL).nonzero()  # (P, 4): b, h, row and column in the chunk
            where.add(((at[:, 0] * h + at[:, 1]) * nqb + qb + at[:, 2]) * nkb + kb + at[:, 3])
    if not tiles:
        return BlockScan(classes, allowed, None)
    out, flat = kept.cat((0, bq, bk), torch.uint8), where.cat((0,), torch.int64)
    if bool((flat[1:] < flat[:-1]).any()):  # chunks that split rows of blocks: put in order
        order = torch.argsort(flat)
        out, flat = out[order], flat[order]
    return BlockScan(classes, allowed, out, flat)


class _Pieces:
    """Tensors to concatenate at the end, small ones joined every 64 so that few stay alive
    (thousands of small live tensors slow every op under `attnkit.analysis.PeakTensors`);
    large ones are not copied twice."""

    def __init__(self):
        self.done: list[Tensor] = []
        self.recent: list[Tensor] = []

    def add(self, x: Tensor) -> None:
        self.recent.append(x)
        if len(self.recent) == 64:
            small = sum(t.nbytes for t in self.recent) <= _JOIN_BYTES
            self.done += [torch.cat(self.recent)] if small else self.recent
            self.recent = []

    def cat(self, empty: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        parts, self.done, self.recent = self.done + self.recent, [], []
        return torch.cat(parts) if parts else torch.zeros(empty, dtype=dtype)


def tile_table(classes: Tensor) -> Tensor:
    """int32 tile table of block classes whose partial blocks' tiles are in row-major order:
    `TILE_EMPTY`, `TILE_FULL`, or the block's tile."""
    table = torch.where(classes == FULL, TILE_FULL, TILE_EMPTY).to(torch.int32)
    part = classes == PARTIAL
    table[part] = torch.arange(int(part.sum()), dtype=torch.int32)
    return table


def regrid(fine: BlockScan, fq: int, fk: int, bq: int, bk: int, n: int, s: int) -> BlockScan:
    """The scan on the grid bq × bk from a scan with tiles on fq × fk (bq, bk multiples of
    fq, fk), without evaluating the mask again: a block is full where its cells are, empty
    where they are, and its tile is put together from theirs. The fine tiles are no larger
    than the coarse ones (each partial cell lies in a partial block)."""
    b, h, nqf, nkf = fine.classes.shape
    rq, rk = bq // fq, bk // fk
    nqb, nkb = -(-n // bq), -(-s // bk)

    def blocks(fill: int) -> Tensor:  # (B, H, nqb, nkb, rq, rk), cells outside N, S = fill
        pad = (0, nkb * rk - nkf, 0, nqb * rq - nqf)
        c = torch.nn.functional.pad(fine.classes, pad, value=fill) if any(pad) else fine.classes
        return c.view(b, h, nqb, rq, nkb, rk).permute(0, 1, 2, 4, 3, 5)

    low, high = blocks(FULL), blocks(EMPTY)
    full, seen = low.amin((4, 5)) == FULL, high.amax((4, 5)) != EMPTY
    classes = torch.where(full, FULL, torch.where(seen, PARTIAL, EMPTY)).to(torch.int8)
    part = classes == PARTIAL
    at = part.nonzero()  # (P, 4): b, h, query block, key block, row-major
    sub = low[part]  # (P, rq, rk): the partial blocks' cell classes
    qf = at[:, 2, None] * rq + torch.arange(rq)  # (P, rq) fine rows
    kf = at[:, 3, None] * rk + torch.arange(rk)  # (P, rk)
    base = (at[:, 0] * h + at[:, 1])[:, None, None] * nqf
    flat = (base + qf[:, :, None]) * nkf + kf[:, None, :]  # cells past N, S are not partial
    order = torch.searchsorted(fine.places, flat)  # (P, rq, rk): the k-th place is tile k
    count = fine.tiles.shape[0]  # with_sentinels: count = ones, count + 1 = zeros
    idx = torch.where(sub == PARTIAL, order, torch.where(sub == FULL, count, count + 1))
    grid = with_sentinels(fine.tiles)[idx]  # (P, rq, rk, fq, fk)
    tiles = grid.permute(0, 1, 3, 2, 4).reshape(-1, bq, bk)  # (P, bq, bk)
    if n % bq or s % bk:  # full cells at the edges hold ones past N, S
        inside_q = at[:, 2, None] * bq + torch.arange(bq) < n  # (P, bq)
        inside_k = at[:, 3, None] * bk + torch.arange(bk) < s  # (P, bk)
        tiles *= inside_q[:, :, None] & inside_k[:, None, :]
    return BlockScan(classes, fine.allowed, tiles, part.flatten().nonzero().flatten())


def with_sentinels(tiles: Tensor) -> Tensor:
    """tiles (T, bq, bk) followed by an all-ones and an all-zeros tile, so that indexing with a
    table entry gives the block's booleans for every class: t >= 0 its tile, `TILE_FULL` (-2)
    the ones, `TILE_EMPTY` (-1) the zeros."""
    full_empty = torch.zeros(2, *tiles.shape[1:], dtype=tiles.dtype, device=tiles.device)
    full_empty[0] = 1
    return torch.cat([tiles, full_empty])


def _check_repeatable(mask, first: Tensor) -> None:
    """A plan is computed once and cached on the mask: a predicate whose answers change
    between calls (random draws, a tensor it reads being changed) would be skipped by a stale
    plan. Catch what one second evaluation of the first chunk can."""
    again = mask.block(0, first.shape[2], 0, first.shape[3]).cpu()
    if not torch.equal(first, again.expand_as(first)):
        raise ValueError(
            f"{mask.describe()}: the mask gave different booleans for the same block on two "
            "evaluations; a predicate (masks.from_function) must be deterministic, since its "
            "plan is computed on first use and cached on the mask"
        )
