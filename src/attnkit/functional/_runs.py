"""Rows that see several runs of keys: query i may attend keys in any of K disjoint runs
lo_ki <= j < hi_ki (k < K), what `|` of row-interval masks gives (a local window or a far
band, a causal window or the first keys).

Legend: B batch, N queries, S keys, K runs per row, M runs before merging.

Runs are held as two int64 tensors (K, B|1, N), per row sorted by lo, disjoint and not
touching (a union of touching runs is one run), with the empty runs (lo = hi = 0) last. A
kernel visits every key of a run once and masks each row to the union of its own runs, so no
key enters a softmax twice: merging overlapping runs is what makes that hold.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.functional._block_scan import EMPTY, FULL, PARTIAL

__all__ = [
    "MAX_RUNS",
    "block_classes",
    "intersect_runs",
    "merge_runs",
    "runs_block",
    "union_runs",
]

# Runs per row past which a union is left to the tile table: the compiled kernel masks each
# row of each block with one pass over its runs, and a 2-D neighbourhood of 15 × 15 (15 runs of
# 15 keys in raster order) should still fit.
MAX_RUNS = 16

_BIG = torch.iinfo(torch.int64).max
_SMALL = torch.iinfo(torch.int64).min


def merge_runs(lo: Tensor, hi: Tensor) -> tuple[Tensor, Tensor]:
    """Runs lo, hi (M, B, N) in any order, possibly overlapping or empty, as the sorted,
    disjoint, non-touching runs (K, B, N) of their union, K >= 1 the most any row needs;
    empty runs (0, 0) last."""
    seen = lo < hi
    key, order = torch.where(seen, lo, _BIG).sort(0)  # (M, B, N): empty runs sort last
    end = torch.where(seen, hi, _SMALL).gather(0, order)
    seen = seen.gather(0, order)
    reach = end.cummax(0).values  # the furthest end of the runs so far
    before = torch.cat([torch.full_like(reach[:1], _SMALL), reach[:-1]])
    new = seen & (key > before)  # a run that starts past every earlier end starts a group
    count = new.sum(0)  # (B, N): runs of each row after merging
    k = max(1, int(count.max())) if count.numel() else 1
    group = torch.where(seen, new.cumsum(0) - 1, k)  # empty runs into a slot that is dropped
    shape = (k + 1, *lo.shape[1:])
    out_lo = torch.full(shape, _BIG, dtype=lo.dtype, device=lo.device)
    out_hi = torch.full(shape, _SMALL, dtype=lo.dtype, device=lo.device)
    out_lo = out_lo.scatter_reduce(0, group, key, "amin")[:k]
    out_hi = out_hi.scatter_reduce(0, group, end, "amax")[:k]
    used = torch.arange(k, device=lo.device)[:, None, None] < count  # (K, B, N)
    return torch.where(used, out_lo, 0), torch.where(used, out_hi, 0)


def _broadcast(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor]):
    """Runs (Ka, B|1, N) and (Kb, B|1, N) over a common batch: (Ka, B, N), (Kb, B, N)."""
    batch = max(a[0].shape[1], b[0].shape[1])
    out = []
    for lo, hi in (a, b):
        shape = (lo.shape[0], batch, lo.shape[2])
        out.append((lo.expand(shape), hi.expand(shape)))
    return out


def union_runs(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """The runs of keys seen under a or under b, merged."""
    (la, ha), (lb, hb) = _broadcast(a, b)
    return merge_runs(torch.cat([la, lb]), torch.cat([ha, hb]))


def intersect_runs(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """The runs of keys seen under a and under b: every pair's intersection, merged."""
    (la, ha), (lb, hb) = _broadcast(a, b)
    lo = torch.maximum(la[:, None], lb[None]).flatten(0, 1)  # (Ka·Kb, B, N)
    hi = torch.minimum(ha[:, None], hb[None]).flatten(0, 1)
    return merge_runs(lo, hi)


def runs_block(lo: Tensor, hi: Tensor, i0: int, i1: int, j0: int, j1: int) -> Tensor:
    """Runs lo, hi (K, B|1, N) on rows i0:i1 and keys j0:j1 as booleans (B|1, 1, nq, nk):
    key j is allowed for row i iff some run holds it."""
    keys = torch.arange(j0, j1, device=lo.device)  # (nk,)
    lo, hi = lo[:, :, i0:i1, None], hi[:, :, i0:i1, None]  # (K, B|1, nq, 1)
    return ((keys >= lo) & (keys < hi)).any(0)[:, None]  # (B|1, 1, nq, nk)


def block_classes(lo: Tensor, hi: Tensor, s: int, bq: int, bk: int) -> Tensor:
    """Block classes (B|1, 1, nqb, nkb) int8 (EMPTY, PARTIAL, FULL) of runs lo, hi
    (K, B|1, N) on the bq × bk grid, exactly, in O(K·B·N + B·nqb·nkb): each run reaches into a
    range of key blocks and covers a range of them, counted per query block by a difference
    array along the key blocks. A block is full when every one of its rows has a run that
    covers it (runs are disjoint and do not touch: one run, not two, covers a row's block)."""
    k, b, n = lo.shape
    nqb, nkb = -(-n // bq), -(-s // bk)
    dev = lo.device
    seen = lo < hi
    where = torch.arange(b, device=dev)[:, None] * nqb + torch.arange(n, device=dev) // bq
    where = where.expand(k, b, n) * (nkb + 1)  # (K, B, N): each row's query block, flat

    def rows_in(first: Tensor, last: Tensor) -> Tensor:  # (B, nqb, nkb): rows per block
        ok = (seen & (first < last)).long().flatten()  # no boolean indexing: meta tensors work
        diff = torch.zeros(b * nqb * (nkb + 1), dtype=torch.int64, device=dev)
        diff.index_add_(0, (where + first.clamp(0, nkb)).flatten(), ok)
        diff.index_add_(0, (where + last.clamp(0, nkb)).flatten(), -ok)
        return diff.view(b, nqb, nkb + 1).cumsum(-1)[..., :nkb]

    touched = rows_in(lo // bk, -(-hi // bk))
    covered = rows_in(-(-lo // bk), torch.where(hi >= s, nkb, hi // bk))
    rows = (n - torch.arange(nqb, device=dev) * bq).clamp(max=bq)[:, None]  # (nqb, 1)
    out = torch.where(covered == rows, FULL, torch.where(touched > 0, PARTIAL, EMPTY))
    out = out.to(torch.int8)
    return out[:, None]  # (B|1, 1, nqb, nkb)
