"""FlexAttention's `BlockMask` and attnkit's structured masks, both ways.

Legend: B batch, H heads, N queries, S keys; bq × bk one block of the (N, S) score grid
(a BlockMask's ``BLOCK_SIZE``); nqb = ceil(N / bq), nkb = ceil(S / bk).

A BlockMask (`torch.nn.attention.flex_attention.create_block_mask`, ``BlockMask.from_kv_blocks``)
lists, per query block, the key blocks that need its ``mask_mod`` (``kv_num_blocks`` /
``kv_indices``) and those that need no mask (``full_kv_num_blocks`` / ``full_kv_indices``);
every other block is skipped. That is what FlexAttention's compiled kernels compute, so it is
what `from_block_mask` means: key j is allowed for query i iff its block is full, or listed and
``mask_mod(b, h, i, j)`` holds. (torch's uncompiled fallback ignores the lists and applies
``mask_mod`` everywhere; the two agree for every mask `create_block_mask` makes.)

`to_block_mask` goes the other way, for FlexAttention's kernels on CUDA: the block classes
come from attnkit's plan of the mask (row intervals, tiles of partial blocks), and the
mask_mod reads the same plan, so both hold O(N + partial blocks · bq · bk), never N × S.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.functional._block_scan import TILE_EMPTY, TILE_FULL, reduce_chunk
from attnkit.functional._index_fns import IndexFn
from attnkit.functional._runs import block_classes
from attnkit.functional.structured import (
    EMPTY,
    FULL,
    PARTIAL,
    StructuredMask,
)

__all__ = ["from_block_mask", "to_block_mask"]

_LARGE = 1 << 30  # FlexAttention's BLOCK_SIZE of the "no mask" BlockMask it makes for None


def _flex():
    import torch.nn.attention.flex_attention as flex  # cheap: no torch._dynamo import

    return flex


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def is_noop_block_mask(block_mask) -> bool:
    """FlexAttention's stand-in for ``block_mask=None`` (one huge full-size block)."""
    return tuple(block_mask.BLOCK_SIZE) == (_LARGE, _LARGE)


# --------------------------------------------------------------------------- from a BlockMask


class FlexBlocks(StructuredMask):
    """A FlexAttention `BlockMask` as an attnkit structured mask (see the module docstring)."""

    def __init__(self, block_mask):
        flex = _flex()
        if not isinstance(block_mask, flex.BlockMask):
            raise ValueError(
                f"from_block_mask: block_mask must be a torch BlockMask (create_block_mask), "
                f"got {type(block_mask).__name__}"
            )
        if getattr(flex, "_sliced_mask_mod_error", None) is block_mask.mask_mod:
            raise RuntimeError("Cannot use mask_mod from a sliced BlockMask")  # torch's words
        if is_noop_block_mask(block_mask):
            raise ValueError(
                "from_block_mask: this BlockMask stands for no mask (FlexAttention's default for "
                "block_mask=None): it has no sequence lengths; pass mask=None instead"
            )
        self.block_mask = block_mask
        self.n, self.s = (int(x) for x in block_mask.seq_lengths)
        self.bq, self.bk = (int(x) for x in block_mask.BLOCK_SIZE)
        self.batch, self.heads = (int(x) for x in block_mask.kv_num_blocks.shape[:2])
        self.device = block_mask.kv_num_blocks.device
        self.classes = _flex_classes(block_mask, self.n, self.s)  # (B|1, H|1, nqb, nkb) int8
        self.noop = block_mask.mask_mod is flex.noop_mask
        self.mod = IndexFn(block_mask.mask_mod, self.batch, self.heads, self.device)

    def block(self, i0, i1, j0, j1):
        shape = (self.batch, self.heads, i1 - i0, j1 - j0)
        sub = self.classes[
            :, :, i0 // self.bq : -(-i1 // self.bq), j0 // self.bk : -(-j1 // self.bk)
        ]
        if sub.numel() and bool((sub == sub.flatten()[0]).all()):  # one class: no per-key map
            cls = int(sub.flatten()[0])
            if cls == PARTIAL and not self.noop:
                return self.mod(i0, i1, j0, j1)
            return torch.full(shape, cls != EMPTY, dtype=torch.bool, device=self.device)
        rows = torch.arange(i0, i1, device=self.device) // self.bq  # (nq,)
        cols = torch.arange(j0, j1, device=self.device) // self.bk  # (nk,)
        cls = self.classes[:, :, rows][..., cols]  # (B|1, H|1, nq, nk)
        allowed = cls == FULL
        partial = cls == PARTIAL
        if self.noop:
            return allowed | partial
        if i1 > i0 and j1 > j0 and bool(partial.any()):
            allowed = allowed | (partial & self.mod(i0, i1, j0, j1))
        return allowed

    def plan_tiles(self, bq: int, bk: int, device) -> tuple[Tensor, Tensor]:
        """The tile table and tiles of `attnkit.functional._mask_plan` on a bq × bk grid,
        evaluating the mask_mod only where the BlockMask lists a partial block: a plan block
        that meets none is empty, one that meets only full blocks is full."""
        meets_any, meets_partial = _regrid(self.classes, self.n, self.s, self.bq, self.bk, bq, bk)
        b, h, nqb, nkb = meets_any.shape
        table = torch.full((b, h, nqb, nkb), TILE_EMPTY, dtype=torch.int32)
        table[meets_any & ~meets_partial] = TILE_FULL
        tiles: list[Tensor] = []
        count = 0
        candidates = meets_partial.any(1).any(0)  # (nqb, nkb): some batch row / head needs it
        for qb in range(nqb):
            i0, i1 = qb * bq, min(qb * bq + bq, self.n)
            for k0, k1 in _runs(candidates[qb]):  # one mask_mod call per run of tiles
                j0, j1 = k0 * bk, min(k1 * bk, self.s)
                got = self.block(i0, i1, j0, j1).cpu()  # (B, H, nq, run of keys)
                cls, _, part = reduce_chunk(got.expand(b, h, *got.shape[2:]), bq, bk, True)
                cls = cls[:, :, 0]  # (B, H, k1 - k0)
                ids = torch.full(cls.shape, TILE_EMPTY, dtype=torch.int32)
                ids[cls == FULL] = TILE_FULL
                ids[cls == PARTIAL] = torch.arange(count, count + part.shape[0], dtype=torch.int32)
                table[:, :, qb, k0:k1] = ids
                tiles.append(part)  # (P, bq, bk), in table order
                count += part.shape[0]
        stacked = torch.cat(tiles) if tiles else torch.zeros(0, bq, bk, dtype=torch.uint8)
        return table.to(device), stacked.to(device)

    def describe(self):
        name = getattr(self.block_mask.mask_mod, "__name__", "mask_mod")
        return f"BlockMask({name}, blocks {self.bq}×{self.bk})"

    def to(self, device):
        same = torch.device(device) == self.device
        return self if same else FlexBlocks(self.block_mask.to(device))


def from_block_mask(block_mask) -> StructuredMask:
    """FlexAttention's `BlockMask` (``create_block_mask(mask_mod, B, H, N, S)``) as an attnkit
    structured mask of shape (B|1, H|1, N, S), True = may attend.

    It means what FlexAttention's kernels compute: a key is allowed where its block is listed
    full, or listed partial and ``mask_mod(b, h, q_idx, kv_idx)`` holds; unlisted blocks are
    masked. attnkit's kernels skip the unlisted blocks, apply nothing to full ones and
    evaluate the mask_mod only on the partial ones, one block at a time (vectorised over the
    block, or per element under torch.vmap if it was written that way); nothing N × S is built.
    A sliced BlockMask (``block_mask[0]``) raises RuntimeError, as in FlexAttention.

    The result is kept on the BlockMask, so a block mask made once and passed at every
    training step is planned once (its tiles built on the first step), as in FlexAttention."""
    kept = getattr(block_mask, "__dict__", {}).get("_attnkit_mask")
    if kept is None:
        kept = FlexBlocks(block_mask)
        block_mask.__dict__["_attnkit_mask"] = kept
    return kept


def _flex_classes(block_mask, n: int, s: int) -> Tensor:
    """EMPTY / PARTIAL / FULL per block of a BlockMask: (B|1, H|1, nqb, nkb) int8."""
    bq, bk = block_mask.BLOCK_SIZE
    nqb, nkb = -(-n // bq), -(-s // bk)
    out = None
    for num, idx, cls in (
        (block_mask.kv_num_blocks, block_mask.kv_indices, PARTIAL),
        (block_mask.full_kv_num_blocks, block_mask.full_kv_indices, FULL),
    ):
        if num is None:
            continue
        num, idx = num[:, :, :nqb], idx[:, :, :nqb].long()  # (B, H, nqb), (B, H, nqb, K)
        listed = torch.arange(idx.shape[-1], device=idx.device) < num[..., None]
        idx = torch.where(listed & (idx < nkb), idx, nkb)  # unused slots -> a spare column
        if out is None:
            out = torch.zeros(*idx.shape[:3], nkb + 1, dtype=torch.int8, device=idx.device)
        out.scatter_(-1, idx, torch.full_like(idx, cls, dtype=torch.int8))
    return out[..., :nkb]


def _runs(flags: Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of True in a 1-D bool tensor."""
    idx = flags.nonzero().flatten().tolist()
    runs: list[tuple[int, int]] = []
    for i in idx:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def _regrid(classes: Tensor, n, s, fq, fk, bq, bk) -> tuple[Tensor, Tensor]:
    """For each block of a bq × bk grid: does it meet a non-empty / a partial block of the
    fq × fk grid of `classes`? Two (B|1, H|1, nqb, nkb) bool, from 2-D prefix sums (O(blocks))."""

    def spans(length, old, new):  # the old blocks each new block meets: [first, last + 1)
        starts = torch.arange(0, length, new)
        ends = (starts + new).clamp(max=length)
        return starts // old, (ends - 1) // old + 1

    r0, r1 = spans(n, fq, bq)
    c0, c1 = spans(s, fk, bk)

    def meets(sel: Tensor) -> Tensor:
        c = torch.nn.functional.pad(sel.cpu().int().cumsum(2).cumsum(3), (1, 0, 1, 0))
        total = c[:, :, r1][..., c1] - c[:, :, r0][..., c1] - c[:, :, r1][..., c0]
        return (total + c[:, :, r0][..., c0]) > 0

    return meets(classes != EMPTY), meets(classes == PARTIAL)


# --------------------------------------------------------------------------- to a BlockMask


def to_block_mask(mask: StructuredMask, block_size: int | tuple[int, int] = 128, device=None):
    """An attnkit structured mask as FlexAttention's `BlockMask`, for its kernels (CUDA).

    The block lists come from the mask's block classes on the ``block_size`` grid (empty
    blocks unlisted, full blocks in ``full_kv_*``, the rest partial), and the mask_mod reads
    the mask's plan: its row intervals (causal, windows, prefix, contiguous documents) as two
    (B|1, N) integer arrays, its boolean tensors as they are, and everything else as one
    stored tile per partial block. A mask made by `from_block_mask` comes back as its
    BlockMask when the block size and device agree."""
    if not isinstance(mask, StructuredMask):
        got = f"{mask.dtype} {_shape(mask)}" if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"to_block_mask: mask must be a structured mask, got {got}")
    bq, bk = (block_size, block_size) if isinstance(block_size, int) else tuple(block_size)
    for what, x in (("block_size", bq), ("block_size", bk)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"to_block_mask: {what} must be integers >= 1, got {block_size!r}")
    device = mask.device if device is None else torch.device(device)
    if isinstance(mask, FlexBlocks) and (mask.bq, mask.bk) == (bq, bk) and mask.device == device:
        return mask.block_mask
    from attnkit.functional._mask_plan import plan_mask

    plan = plan_mask(mask, bq, bk, device)
    classes = _plan_classes(plan, mask, bq, bk, device)  # (B|1, H|1, nqb, nkb)
    partial_num, partial_idx = _ordered(classes == PARTIAL)
    full_num, full_idx = _ordered(classes == FULL)
    return _flex().BlockMask.from_kv_blocks(
        partial_num, partial_idx, full_num, full_idx, BLOCK_SIZE=(bq, bk),
        mask_mod=_plan_mask_mod(plan, bq, bk), seq_lengths=(mask.n, mask.s),
    )  # fmt: skip


def _ordered(sel: Tensor) -> tuple[Tensor, Tensor]:
    """A block selection (B, H, nqb, nkb) as FlexAttention's (count, indices): the selected
    key blocks of each row first, in order."""
    num = sel.sum(-1, dtype=torch.int32)  # (B, H, nqb)
    idx = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num, idx


def _plan_classes(plan, mask: StructuredMask, bq: int, bk: int, device) -> Tensor:
    """Block classes of a plan, each part's classes combined by AND: the minimum
    (EMPTY < PARTIAL < FULL). A block where two partial parts meet stays PARTIAL."""
    nqb, nkb = -(-mask.n // bq), -(-mask.s // bk)
    out = torch.full((1, 1, nqb, nkb), FULL, dtype=torch.int8, device=device)
    if plan.rows is not None:
        rows = block_classes(plan.rows[0], plan.rows[1], mask.s, bq, bk)
        out = torch.minimum(out, rows.to(device))
    if plan.table is not None:
        t = plan.table.to(device)
        tab = torch.where(t == TILE_EMPTY, EMPTY, torch.where(t == TILE_FULL, FULL, PARTIAL))
        out = torch.minimum(out, tab.to(torch.int8))
    if plan.dense is not None:
        out = torch.minimum(out, _dense_classes(plan.dense.to(device), bq, bk))
    return out.expand(mask.batch, mask.heads, nqb, nkb).contiguous()


def _dense_classes(t: Tensor, bq: int, bk: int) -> Tensor:
    """Block classes of a boolean (B|1, H|1, N|1, S|1) tensor, its size-1 axes left to
    broadcast (a key padding mask (B, 1, 1, S) is read once per key block, not per query)."""
    t = t[(None,) * (4 - t.dim())]

    def fold(x: Tensor, dim: int, blk: int, fill: bool, op) -> Tensor:
        if x.shape[dim] == 1:
            return x
        nb = -(-x.shape[dim] // blk)
        pad = [0, 0] * (3 - dim) + [0, nb * blk - x.shape[dim]]
        x = torch.nn.functional.pad(x, pad, value=fill)
        return op(x.unflatten(dim, (nb, blk)), dim + 1)

    anyv = fold(fold(t, 2, bq, False, torch.any), 3, bk, False, torch.any)
    allv = fold(fold(t, 2, bq, True, torch.all), 3, bk, True, torch.all)
    cls = torch.where(allv, FULL, torch.where(anyv, PARTIAL, EMPTY))
    return cls.to(torch.int8)


def _plan_mask_mod(plan, bq: int, bk: int):
    """FlexAttention's mask_mod of a plan: row intervals & dense part & tiles, read by index.

    Traceable (FlexAttention compiles it into its kernel: only indexing and comparisons), and
    vectorised as well (broadcast index tensors give a block), so it is tested on the CPU."""
    from attnkit.functional._mask_plan import with_sentinels

    rows, dense, table, tiles = plan.rows, plan.dense, plan.table, plan.tiles
    if dense is not None:
        dense = dense[(None,) * (4 - dense.dim())]
    if table is not None:
        tiles = with_sentinels(tiles)  # (T + 2, bq, bk): ..., all ones (-2), all zeros (-1)
        table = torch.where(table < 0, table + tiles.shape[0], table)  # no negative index

    def at(t: Tensor, dim: int, idx: Tensor) -> Tensor:
        return idx if t.shape[dim] > 1 else idx * 0  # size 1: broadcast, read index 0

    affine = None if rows is None or rows.shape[1] != 1 else _affine_rows(rows[0, 0], rows[1, 0])

    def mask_mod(b, h, q_idx, kv_idx):
        ok = q_idx >= 0
        if affine is not None:  # arithmetic, as a hand-written mask_mod: no loads per element
            (a_lo, *lo_range), (a_hi, *hi_range) = affine
            ok = ok & (kv_idx >= (q_idx + a_lo).clamp(*lo_range))
            ok = ok & (kv_idx < (q_idx + a_hi).clamp(*hi_range))
        elif rows is not None:  # (2, K, B|1, N): in one of the row's runs
            seen = q_idx < 0
            for lo, hi in zip(rows[0], rows[1], strict=True):  # (B|1, N) each
                if lo.shape[0] == 1:  # one row per query: 1-D loads
                    seen = seen | ((kv_idx >= lo[0][q_idx]) & (kv_idx < hi[0][q_idx]))
                else:
                    seen = seen | ((kv_idx >= lo[b, q_idx]) & (kv_idx < hi[b, q_idx]))
            ok = ok & seen
        if dense is not None:
            idx = (at(dense, 0, b), at(dense, 1, h), at(dense, 2, q_idx), at(dense, 3, kv_idx))
            ok = ok & dense[idx]
        if table is not None:
            tid = table[at(table, 0, b), at(table, 1, h), q_idx // bq, kv_idx // bk]
            ok = ok & (tiles[tid, q_idx % bq, kv_idx % bk] != 0)
        return ok

    return mask_mod


def _affine_rows(lo: Tensor, hi: Tensor):
    """Row intervals [lo_q, hi_q) whose bounds are both q + a clamped to [c, d], for integers
    a, c, d — the causal limit, windows (one- and two-sided, any offset) and prefix-LM — as
    ((a, c, d) of lo, (a, c, d) of hi); None for anything else (documents, per-batch rows).

    Each bound is checked against its formula on every row, so the arithmetic mask_mod equals
    the one that reads the arrays. It matters on the GPU: a mask_mod runs once per score, and
    two loads per score made attnkit's window 3.7x slower than FlexAttention's own
    arithmetic mask_mod with the same block lists (H200, N = 4096)."""
    if lo.dim() != 2 or lo.shape[0] != 1 or hi.shape != lo.shape or lo.shape[1] == 0:
        return None
    if lo.device.type == "meta":  # no values to read: the mask_mod reads the arrays
        return None
    q = torch.arange(lo.shape[1], device=lo.device, dtype=lo.dtype)  # (N,)
    found = []
    for x in (lo[0], hi[0]):  # x non-decreasing: the clamps are its first and last values
        c, d = int(x[0]), int(x[-1])
        # the slope-1 part reaches one end or the other (first row, or last row)
        for a in (c, d - (x.numel() - 1)):
            if torch.equal(x, (q + a).clamp(c, d)):
                found.append((a, c, d))
                break
        else:
            return None
    return tuple(found)
