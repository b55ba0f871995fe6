"""What a blocked kernel needs of a structured mask: row intervals, a dense remainder, tiles.

Legend: B batch, H heads, N queries, S keys; bq × bk the kernel's score blocks.

A `StructuredMask` is split into the AND of three parts, each read the cheapest way:

* ``rows`` int64 (2, K, B|1, N): lo and hi of the K runs of keys (`_runs`) of the
  intersection of every factor that is row intervals (causal, window, prefix, contiguous
  documents) or runs of them (`|` of those). A kernel derives each query block's key spans
  from them and masks each row to its own runs with one fill per gap.
* ``dense``: the boolean tensors the user combined in (key padding masks, say), ANDed, read
  through broadcast strides as today.
* ``table`` int32 (B|1, H|1, nqb, nkb) and ``tiles`` uint8 (T, bq, bk) for the rest
  (predicates, non-contiguous documents, unions): per block -1 empty (skipped), -2 full (no
  mask), t >= 0 partial, masked by tile t. Only partial blocks are stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from attnkit.functional._block_scan import (
    TILE_EMPTY,
    TILE_FULL,
    regrid,
    scan,
    tile_table,
    with_sentinels,
)
from attnkit.functional._blocks import STRUCTURED_BLOCK_K, STRUCTURED_BLOCK_Q
from attnkit.functional._grid import (
    FINE_GRID,
    FINE_LIMIT,
    choose_block_q,
    choose_tile_grid,
    set_query_block,
)
from attnkit.functional._runs import MAX_RUNS, intersect_runs, runs_block
from attnkit.functional.structured import StructuredMask, _And, _Dense

__all__ = [
    "TILE_EMPTY",
    "TILE_FULL",
    "MaskPlan",
    "call_plan",
    "dense_with_plan",
    "kernel_plan",
    "key_blocks",
    "plan_mask",
    "with_sentinels",
]


class MaskPlan(NamedTuple):
    rows: Tensor | None  # int64 (2, K, B|1, N)
    dense: Tensor | None  # bool, broadcastable to (B, H, N, S)
    table: Tensor | None  # int32 (B|1, H|1, nqb, nkb)
    tiles: Tensor | None  # uint8 (T, bq, bk)


def plan_mask(mask: StructuredMask, block_q: int, block_k: int, device, given=None) -> MaskPlan:
    """Split `mask` into row intervals, a dense remainder and tiles on a bq × bk grid.

    The plan is kept on the mask (per grid and device): a mask built once and passed to every
    step of a training loop is classified once, as FlexAttention's block mask is. Masks are
    descriptions and are not changed after they are built; change the tensors a mask was
    built from (its ids, say) and build a new mask.

    `given`: the table and tiles of the mask's factors that are neither intervals nor
    tensors, where the caller has them already (`kernel_plan`)."""
    key = (block_q, block_k, str(device))
    cache = mask.__dict__.setdefault("_plans", {})
    if key not in cache:
        cache[key] = _plan(mask, block_q, block_k, device, given)
    return cache[key]


def kernel_plan(mask: StructuredMask, device) -> MaskPlan:
    """`plan_mask` on the blocks chosen for this mask (`_grid.choose_tile_grid` for tiles,
    `_grid.choose_block_q` for row intervals alone); cached on the mask like `plan_mask`."""
    key = ("auto", str(device))
    cache = mask.__dict__.setdefault("_plans", {})
    if key not in cache:
        rest = _split(mask)[2]
        # a mask that tiles itself (a FlexAttention BlockMask) keeps the structured grid: the
        # grid search would evaluate it everywhere, which its block lists exist to avoid
        fine = None
        if rest and not any(hasattr(f, "plan_tiles") for f in rest):
            fine = _fine_scan(_and_all(rest))
        if fine is not None:  # one evaluation: the grid is chosen from it, the tiles pooled
            bq, bk = choose_tile_grid(fine.classes)
            coarse = regrid(fine, *FINE_GRID, bq, bk, mask.n, mask.s)
            plan = plan_mask(mask, bq, bk, device, (tile_table(coarse.classes), coarse.tiles))
        else:
            plan = plan_mask(mask, STRUCTURED_BLOCK_Q, STRUCTURED_BLOCK_K, device)
            if plan.rows is not None:
                set_query_block(plan.rows, choose_block_q(plan.rows, mask.s))
        cache[key] = plan
    return cache[key]


def _fine_scan(mask: StructuredMask):
    """The mask read once on the finest candidate grid, with its partial cells' booleans (no
    larger than the tiles of any coarser grid); None past `_grid.FINE_LIMIT` cells."""
    b, h, n, s = mask.shape
    fq, fk = FINE_GRID
    if b * h * -(-n // fq) * -(-s // fk) > FINE_LIMIT:
        return None
    return scan(mask, fq, fk, tiles=True, repeatable=True)


def call_plan(mask: StructuredMask, device, block_q, block_k, fit: bool) -> MaskPlan:
    """The plan of one kernel call: blocks sized to the mask where `fit` (the compiled kernel,
    no block sizes given), else the given blocks or the structured grid."""
    if fit:
        return kernel_plan(mask, device)
    return plan_mask(mask, block_q or STRUCTURED_BLOCK_Q, block_k or STRUCTURED_BLOCK_K, device)


def _split(mask: StructuredMask):
    """The factors of `mask`: the runs of its row intervals and runs (None without any),
    boolean tensors, and the rest (factors whose runs would make more than `MAX_RUNS`)."""
    factors = mask.factors() if isinstance(mask, _And) else [mask]
    runs, dense, rest = None, [], []
    for f in factors:
        got = f.key_runs()
        if got is not None and runs is not None:
            got = intersect_runs(runs, got)
        if got is not None and got[0].shape[0] <= MAX_RUNS:
            runs = got
        elif isinstance(f, _Dense):
            dense.append(f)
        else:
            rest.append(f)
    return runs, dense, rest


def _and_all(parts: list[StructuredMask]) -> StructuredMask:
    out = parts[0]
    for f in parts[1:]:
        out = out & f
    return out


def _plan(mask: StructuredMask, block_q: int, block_k: int, device, given=None) -> MaskPlan:
    runs, dense_parts, rest = _split(mask)
    dense = None
    for f in dense_parts:
        t = f.t.to(device)
        dense = t if dense is None else dense & t
    stacked = None
    if runs is not None:  # (2, K, B|1, N)
        stacked = torch.stack(torch.broadcast_tensors(*runs)).to(device).contiguous()
    table = tiles = None
    if given is not None:
        table, tiles = (x.to(device) for x in given)
    elif rest:
        other = _and_all(rest)
        # a mask that knows its own block structure (a FlexAttention BlockMask) tiles itself
        tile = getattr(other, "plan_tiles", None) or (lambda *a: _tiles(other, *a))
        table, tiles = tile(block_q, block_k, device)
    return MaskPlan(stacked, dense, table, tiles)


def _tiles(mask: StructuredMask, bq: int, bk: int, device) -> tuple[Tensor, Tensor]:
    """`mask` evaluated once, a chunk of blocks at a time (`_block_scan.scan`): its tile table
    and its partial blocks' booleans."""
    got = scan(mask, bq, bk, tiles=True, repeatable=True)
    return tile_table(got.classes).to(device), got.tiles.to(device)


def key_blocks(
    plan: MaskPlan | None, i0: int, i1: int, n: int, s: int, bq: int, bk: int, causal: bool
) -> Iterator[tuple[int, int, Tensor | None, int]]:
    """The key blocks (j0, j1) that query rows i0:i1 compute, with the tile table's entries
    there ((B|1, H|1) int32, None without tiles) and the block's first column in its tile.

    They cover the union of the rows' runs (rows that see nothing add nothing) up to the
    causal end (bottom-right: query i sees keys j <= i + S - N): each stretch of keys some row
    sees, in steps of bk from its first key; on the tiles' bq × bk grid, less the blocks the
    table marks empty, where there are tiles. The compiled kernel walks the same blocks
    (`key_blocks` in _native/masks.h); the PyTorch kernel and the cost model walk these."""
    end = min(s, i1 + s - n) if causal else s
    stretches = [(0, end)]
    if plan is not None and plan.rows is not None:
        stretches = _stretches(plan.rows[:, :, :, i0:i1], end)
    if plan is None or plan.table is None:
        for first, last in stretches:
            for j0 in range(first, last, bk):
                yield j0, min(j0 + bk, last), None, 0
        return
    qb = i0 // bq
    for first, last in stretches:
        for kb in range(first // bk, -(-last // bk)):
            ids = plan.table[:, :, qb, kb]  # (B|1, H|1): -1 empty, -2 full, t partial
            if bool((ids == TILE_EMPTY).all()):
                continue
            j0 = max(kb * bk, first)
            yield j0, min((kb + 1) * bk, last), ids, j0 - kb * bk


def _stretches(rows: Tensor, end: int) -> list[tuple[int, int]]:
    """The union of the runs rows (2, K, B|1, nq) as ascending, disjoint, non-touching
    stretches [first, last) cut at `end` (_native/masks.h's `key_blocks` does the same)."""
    lo, hi = rows[0].flatten(), rows[1].flatten().clamp(max=end)
    seen = lo < hi
    lo, hi = lo[seen], hi[seen]
    if lo.numel() == 0:
        return []
    lo, order = lo.sort(stable=True)
    hi = hi[order]
    reach = hi.cummax(0).values
    new = torch.ones(lo.numel(), dtype=torch.bool, device=lo.device)
    new[1:] = lo[1:] > reach[:-1]  # starts past every earlier end: a new stretch
    starts = new.nonzero().flatten()
    ends = torch.cat([starts[1:], starts.new_tensor([lo.numel()])]) - 1
    return list(zip(lo[starts].tolist(), reach[ends].tolist(), strict=True))


def dense_with_plan(
    mask: Tensor | None, rows: Tensor | None, table: Tensor | None, tiles: Tensor | None,
    n: int, s: int,
) -> Tensor | None:  # fmt: skip
    """The whole mask a kernel call applied, as one boolean (B|1, H|1, N, S) tensor: `mask`
    (the dense part) & the rows' runs & the tiles. For the differentiable second-order
    backward (`_double_backward`), which holds (B, H, N, S) probabilities anyway."""
    parts = [] if mask is None else [mask[(None,) * (4 - mask.dim())]]
    if rows is not None:
        parts.append(runs_block(rows[0], rows[1], 0, n, 0, s))
    if table is not None:
        bq, bk = tiles.shape[1:]
        grid = with_sentinels(tiles)[table.long()]  # (B|1, H|1, nqb, nkb, bq, bk)
        b, h, nqb, nkb = table.shape
        whole = grid.permute(0, 1, 2, 4, 3, 5).reshape(b, h, nqb * bq, nkb * bk)
        parts.append(whole[:, :, :n, :s].bool())
    if not parts:
        return None
    out = parts[0]
    for part in parts[1:]:
        out = out & part
    return out
