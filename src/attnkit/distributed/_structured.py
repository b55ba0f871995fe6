"""A structured mask over a ring: which keys of which rank a rank's queries can see.

Legend: B batch, H query heads, Hkv key/value heads (G = H/Hkv), N the full sequence length,
n = N/P the local length, P ranks, r this rank; dst a rank whose queries see keys of src.

A `StructuredMask` given to `ring_attention` describes the GLOBAL (N, N) score grid, and every
rank passes the same description. So every rank can work out, without a message, which keys
of any rank the queries of any other rank may attend to (`Schedule.see`), and both sides of a
transfer agree on it: src sends a span of its keys to dst exactly when dst receives it.

A rank's shard is one run of global positions ("contiguous") or two ("zigzag": chunks r and
2P-1-r, `layout.positions`). A span is a contiguous run of one chunk, so its global positions
are g0 … g0+L-1 and the mask on (this rank's query rows, the span) is a crop of the global
description with the key axis shifted by g0 (`GlobalMask.crop`): row intervals and runs of
keys stay runs (lo - g0, hi - g0), boolean tensors are sliced, and anything else (predicates,
non-contiguous documents, unions with those) is evaluated on the global grid block by block.

Everything here could move to `attnkit.functional` (a crop of a description at gathered rows
and shifted keys is not specific to rings).
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import torch
from torch import Tensor

from attnkit.distributed._block import part, q_heads
from attnkit.distributed.layout import positions
from attnkit.functional._block_scan import chunk_shape
from attnkit.functional._blocks import STRUCTURED_BLOCK_K, STRUCTURED_BLOCK_Q
from attnkit.functional._mask_plan import MaskPlan, _split, plan_mask
from attnkit.functional._row_masks import RowRuns
from attnkit.functional.structured import StructuredMask, _Dense

__all__ = ["GlobalMask", "Schedule", "Span", "exchange_pattern"]


class Span(NamedTuple):
    """Keys of a piece's run that a rank's queries may see: a contiguous run of one chunk."""

    i: int  # which run of the piece
    sub: slice  # the span's columns within that run (what a message carries)
    cols: slice  # the same columns of src's shard
    g0: int  # the global position of its first key


def chunks(n: int, rank: int, world: int, layout: str) -> list[tuple[int, int, int]]:
    """(local start, length, global start) of each run of global positions of a shard."""
    if layout == "contiguous":
        return [(0, n, rank * n)]
    c = n // 2
    return [(0, c, rank * c), (c, c, (2 * world - 1 - rank) * c)]


class GlobalMask:
    """A description over the global sequence, split once per call into the runs of keys of
    its row-interval and run factors (lo, hi: (K, B|1, N), `_mask_plan._split`), its boolean
    tensors and the rest."""

    def __init__(self, mask: StructuredMask, device):
        runs, dense, rest = _split(mask)
        self.lo = self.hi = None
        if runs is not None:
            self.lo, self.hi = (x.to(device) for x in torch.broadcast_tensors(*runs))
        self.dense: list[Tensor] = [f.t.to(device) for f in dense]
        self.rest = None
        if rest:
            self.rest = functools.reduce(lambda a, b: a & b, [f.to(device) for f in rest])
        self.batch, self.heads, self.device = mask.batch, mask.heads, torch.device(device)

    @property
    def intervals_only(self) -> bool:
        return self.lo is not None and not self.dense and self.rest is None

    def crop(self, qpos: Tensor, g0: int, length: int) -> StructuredMask:
        """The mask on global query rows ``qpos`` (nq,) and keys g0 … g0+length-1: a
        (B|1, H|1, nq, length) description, the keys numbered from 0."""
        nq, out = qpos.numel(), []
        if self.lo is not None:
            lo, hi = self.lo[:, :, qpos] - g0, self.hi[:, :, qpos] - g0  # (K, B|1, nq)
            out.append(RowRuns(lo, hi, length, "rows"))
        for t in self.dense:  # (B|1, H|1, N|1, N|1): keys first, so only nq rows are copied
            t = t[..., g0 : g0 + length] if t.shape[3] != 1 else t
            out.append(_Dense(t[:, :, qpos] if t.shape[2] != 1 else t, nq, length))
        if self.rest is not None:
            out.append(_Gathered(self.rest, qpos, g0, length))
        return functools.reduce(lambda a, b: a & b, out)

    def touching(self, qpos: Tensor, g0: int, length: int, batch: slice) -> Tensor | None:
        """(nq,) bool: rows of batch rows ``batch`` whose runs reach into the keys (an upper
        bound of the rows that see any of them); None without row intervals or runs."""
        if self.lo is None:
            return None
        lo, hi = (t[:, batch] if t.shape[1] > 1 else t for t in (self.lo, self.hi))
        lo, hi = lo[:, :, qpos].clamp(min=g0), hi[:, :, qpos].clamp(max=g0 + length)
        return (lo < hi).flatten(0, 1).any(0)  # (K·B|1, nq) -> (nq,)

    def seen(self, qpos: Tensor, g0: int, length: int) -> Tensor:
        """(B|1, H|1, length) bool: the keys g0 … g0+length-1 that some query of ``qpos`` may
        attend to. O(K·nq + length) from the runs; where the mask has other parts as well,
        those are evaluated only on the rows and key span the runs leave."""
        shape = (self.batch, self.heads, length)
        rows, k0, k1 = slice(None), 0, length
        if self.lo is not None:
            a = (self.lo[:, :, qpos] - g0).clamp(0, length).transpose(0, 1)  # (B|1, K, nq)
            z = (self.hi[:, :, qpos] - g0).clamp(0, length).transpose(0, 1)
            ok = a < z
            diff = torch.zeros(a.shape[0], length + 1, dtype=torch.long, device=a.device)
            a, z, add = a.flatten(1), z.flatten(1), ok.flatten(1).long()  # (B|1, K·nq)
            diff.scatter_add_(1, a, add).scatter_add_(1, z, -add)
            bound = (diff.cumsum(1)[:, :length] > 0)[:, None]  # (B|1, 1, length)
            if self.intervals_only or not bool(ok.any()):
                return bound.expand(shape)
            # first to last row and key (a range keeps a zigzag shard's rows in two runs)
            rows, hit = (x.nonzero().flatten() for x in (ok.any(1).any(0), bound.any(1).any(0)))
            rows, k0, k1 = slice(int(rows[0]), int(rows[-1]) + 1), int(hit[0]), int(hit[-1]) + 1
        qpos = qpos[rows]
        crop = self.crop(qpos, g0, length)
        seen = torch.zeros(shape, dtype=torch.bool, device=self.device)
        # rows in chunks of the plans' budget (`_block_scan`): O(chunk) temporaries at any span
        span = max(1, k1 - k0)
        step = chunk_shape(self.batch, self.heads, max(1, qpos.numel()), span, 1, span)[0]
        for i0 in range(0, qpos.numel(), step):
            blk = crop.block(i0, min(i0 + step, qpos.numel()), k0, k1)  # (B|1, H|1, r, span)
            seen[..., k0:k1] |= blk.any(2)
        return seen


class _Gathered(StructuredMask):
    """``mask`` on global query rows ``qpos`` and keys g0 … g0+length-1, evaluated on the
    global grid one contiguous run of rows at a time (a zigzag shard has two)."""

    def __init__(self, mask: StructuredMask, qpos: Tensor, g0: int, length: int):
        self.mask, self.qpos, self.g0 = mask, qpos, g0
        self.n, self.s = qpos.numel(), length
        self.batch, self.heads, self.device = mask.batch, mask.heads, mask.device
        breaks = ((qpos[1:] - qpos[:-1]) != 1).nonzero().flatten() + 1
        edges = [0, *breaks.tolist(), self.n]
        self.runs = [(a, z, int(qpos[a])) for a, z in itertools.pairwise(edges) if z > a]

    def block(self, i0, i1, j0, j1):
        got = [
            self.mask.block(p + max(i0, a) - a, p + min(i1, z) - a, self.g0 + j0, self.g0 + j1)
            for a, z, p in self.runs
            if max(i0, a) < min(i1, z)
        ]
        return got[0] if len(got) == 1 else torch.cat(got, dim=2)

    def describe(self):
        return f"{self.mask.describe()} at {self.n} rows, keys from {self.g0}"


class Schedule:
    """Who needs what, for one call: per (dst, src) the keys of src seen by dst's queries
    (computed for the pairs this rank sends or receives, kept for the backward pass), the
    spans of each piece that travel, and the mask plan of each visit."""

    def __init__(self, mask: GlobalMask, parts, rank: int, world: int, layout: str, n: int, g):
        self.mask, self.parts, self.g = mask, parts, g
        self.rank, self.world, self.layout, self.n = rank, world, layout, n
        self.pos = [positions(n * world, r, world, layout).to(mask.device) for r in range(world)]
        self._see: dict[tuple[int, int], Tensor] = {}

    def see(self, dst: int, src: int) -> Tensor:
        """(B|1, H|1, n) bool over src's keys in shard order: seen by some query of dst."""
        if (dst, src) not in self._see:
            got = [
                self.mask.seen(self.pos[dst], g0, length)
                for _, length, g0 in chunks(self.n, src, self.world, self.layout)
            ]
            self._see[dst, src] = torch.cat(got, dim=2)
        return self._see[dst, src]

    def spans(self, dst: int, src: int, c: int) -> list[Span]:
        """The spans of piece ``c`` of src's keys that dst's queries may see: per run of the
        piece and chunk, from its first to its last seen key (none where nothing is seen)."""
        bs, hs, cs = self.parts[c]
        seen = part(self.see(dst, src), bs, q_heads(hs, self.g)).flatten(0, 1).any(0)  # (n,)
        out = []
        for i, run in enumerate(cs):
            j0, j1, _ = run.indices(self.n)
            for start, length, g0 in chunks(self.n, src, self.world, self.layout):
                a, z = max(j0, start), min(j1, start + length)
                hit = seen[a:z].nonzero().flatten() if a < z else seen[:0]
                if hit.numel():
                    f, e = a + int(hit[0]), a + int(hit[-1]) + 1
                    out.append(Span(i, slice(f - j0, e - j0), slice(f, e), g0 + f - start))
        return out

    def rows(self, span: Span, bs: slice) -> slice:
        """This rank's query rows that may see the span: the first to the last whose row
        intervals reach into it (every row where the mask has none)."""
        length = span.cols.stop - span.cols.start
        touch = self.mask.touching(self.pos[self.rank], span.g0, length, bs)
        if touch is None:
            return slice(0, self.n)
        hit = touch.nonzero().flatten()
        return slice(int(hit[0]), int(hit[-1]) + 1) if hit.numel() else slice(0, 0)

    def plan(self, rows: slice, span: Span, bs: slice, hq: slice) -> MaskPlan:
        """The kernel's `MaskPlan` for (query rows, span) of the piece's batch rows and heads:
        row intervals shifted to the span's keys, boolean tensors sliced, and tiles of the
        rest on the kernels' structured grid (at most rows × span bytes, freed after it)."""
        length = span.cols.stop - span.cols.start
        crop = self.mask.crop(self.pos[self.rank][rows], span.g0, length)
        mp = plan_mask(crop, STRUCTURED_BLOCK_Q, STRUCTURED_BLOCK_K, self.mask.device)
        r = None if mp.rows is None else (mp.rows[:, :, bs] if mp.rows.shape[2] > 1 else mp.rows)
        table = None if mp.table is None else part(mp.table, bs, hq).contiguous()
        rows_ = None if r is None else r.contiguous()
        return MaskPlan(rows_, part(mp.dense, bs, hq), table, mp.tiles)


def check_mask(mask: StructuredMask, b: int, h: int, length: int, name: str) -> None:
    """ValueErrors naming ``mask`` for a structured mask that is not over the global grid."""
    if (mask.n, mask.s) != (length, length) or mask.batch not in (1, b) or mask.heads not in (1, h):
        raise ValueError(
            f"{name}: a structured mask must describe the whole sequence, shape "
            f"(B|1={b}, H|1={h}, N={length}, N={length}) (the same on every rank), got "
            f"{mask.shape}"
        )


def exchange_pattern(
    mask: StructuredMask, world: int, *, layout: str = "contiguous"
) -> list[dict[int, int]]:
    """For each rank of a ring of ``world`` ranks, the other ranks whose keys its queries may
    attend to under ``mask`` (a description over the whole sequence), each with the number
    of its key positions seen: what `ring_attention` with this mask receives, in keys per
    (batch row, key/value head) when they are contiguous in each chunk (a window, documents,
    a prefix). Computed from the description alone, as every rank of the ring does."""
    if mask.n != mask.s:
        raise ValueError(f"exchange_pattern: mask must be square (N, N), got {mask.shape}")
    n = positions(mask.n, 0, world, layout).numel()  # checks that N splits into the layout
    sched = Schedule(GlobalMask(mask, "cpu"), [], 0, world, layout, n, 1)
    return [
        {
            src: seen
            for src in range(world)
            if src != dst and (seen := int(sched.see(dst, src).flatten(0, 1).any(0).sum()))
        }
        for dst in range(world)
    ]
