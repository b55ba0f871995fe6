"""The score entries and blocks attnkit's compiled kernel computes under a mask, exactly.

Legend: B batch, H query heads, N queries, S keys; bq × bk the kernel's score blocks.

A dense kernel computes all B·H·N·S score entries; the mask allows fewer (its density); a
blocked kernel that skips what is masked lands in between, because it computes whole blocks.
The compiled CPU kernel behind the ``chunked`` backend (`attnkit.functional.native`) walks,
for each batch row, head and block of bq query rows, the key blocks that
`attnkit.functional._mask_plan.key_blocks` lists: the span [min lo, max hi) of the rows' key
intervals cut by the causal end, in steps of bk from its first key (row-interval masks:
windows, documents, prefix-LM, causal); on the tile grid, less the empty tiles, for the rest
(`masks.from_function`, documents whose ids are not contiguous, unions with gaps).
`kernel_work` walks the same generator with the kernel's own block sizes, so its count equals
the counter on the kernel (`native.count_work()`); the tests hold them equal.

Where the blocks add work: a query block's key span is as wide as the union of its rows'
intervals. A causal window of w keys over blocks of bq rows spans w + bq - 1 keys per block,
so the kernel computes about N·(w + bq - 1) entries for the N·w the mask allows; a query block
that straddles two documents spans both. Except where every row of a block sees at most
`ROW_PATH_KEYS[pass_]` keys of a wider span (a narrow window): the kernel then computes each
row over its own keys alone (_native/row_path.h), N·w entries for a window of w; in both
passes, where every tile of `TILE_ROWS` rows of a block spans at most `TILE_KEYS` keys (short
documents, a strided mask's short sequences): each tile over the union of its rows' keys
(_native/tile_path.h, tile_backward.h); and, in a plain forward, where rows have several runs
of keys (a 2-D neighbourhood in token order, unions): each tile over the union of its rows'
offsets j - i, run by run (_native/offset_path.h), and so does a plain backward on AVX-512
and AVX2 builds (_native/offset_runs.h).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from attnkit.functional._blocks import (
    BACKWARD_BAND_KEYS,
    BACKWARD_BLOCK_K,
    BACKWARD_BLOCK_Q,
    BACKWARD_ROW_KEYS,
    FORWARD_BLOCK_K,
    FORWARD_BLOCK_Q,
    forward_blocks,
)
from attnkit.functional._grid import (
    backward_query_block,
    offset_bands,
    offset_runs,
    query_block,
    shared_tiles,
)
from attnkit.functional._mask_plan import MaskPlan, kernel_plan, key_blocks
from attnkit.functional.reordered import Reordered, group_call
from attnkit.functional.structured import StructuredMask, causal_intervals

__all__ = ["PASSES", "KernelWork", "kernel_work"]

# The compiled kernel's blocks per pass (bq, bk); a mask with tiles puts both passes on the
# tile grid chosen for the mask (`_grid.choose_tile_grid`); row intervals alone may shorten
# the query blocks (`_grid.choose_block_q`), and a full forward without a mask's structure
# from N = 768 on takes wider query blocks (`_blocks.forward_blocks`).
PASSES = {
    "forward": (FORWARD_BLOCK_Q, FORWARD_BLOCK_K),
    "backward": (BACKWARD_BLOCK_Q, BACKWARD_BLOCK_K),
}


# _native/row_path.h's kRowPathKeys / kRowPathKeysBackward: the widest row of a row-path block.
# A plain backward (no bias, dropout, score function, nor a dense part in the mask's plan) also
# takes blocks of wider rows, up to BACKWARD_BAND_KEYS, where a tile of 8 rows is a band's
# (_native/offset_backward.h; keys within its caches: S up to ~32K at D=64), counting each
# row's own keys as the row path does.
ROW_PATH_KEYS = {"forward": 64, "backward": BACKWARD_ROW_KEYS}
# _native/tile_path.h's kTileRows, kTileKeys: the tiles of rows and their widest span
TILE_ROWS, TILE_KEYS = 8, 32
# _native/offset_path.h's kOffsetRuns, kOffsetRunKeys, kOffsetKeys: the forward's offset path
# (rows of several runs, plain calls): runs a row, the widest union of one run's offsets over
# a tile's rows, of all runs' together
OFFSET_RUNS, OFFSET_RUN_KEYS, OFFSET_KEYS = 16, 64, 512
_BIG, _SMALL = 2**62, -(2**62)


@dataclass(frozen=True)
class KernelWork:
    """Score entries of one attention call (B·H heads, N queries, S keys), one pass."""

    dense: int  # B·H·N·S: what a kernel that skips nothing computes
    allowed: int  # (query, key) pairs the mask lets attend, over B·H (B·H·N·S·density)
    computed: int  # entries the compiled kernel computes: the sum of its blocks' sizes
    blocks: int  # blocks it computes (up to block_q × block_k each: edge blocks are cut)
    block_q: int  # query rows per block
    block_k: int  # keys per block (the grid's step; a block's first key is where its span starts)

    def to_dict(self) -> dict:
        return {
            "dense": self.dense,
            "allowed": self.allowed,
            "computed": self.computed,
            "blocks": self.blocks,
            "block_q": self.block_q,
            "block_k": self.block_k,
        }


def kernel_work(
    mask: StructuredMask | None = None,
    *,
    n: int | None = None,
    s: int | None = None,
    causal: bool = False,
    pass_: str = "forward",
    batch: int = 1,
    heads: int = 1,
    grad: bool = True,
    plain: bool = True,
) -> KernelWork:
    """What `attnkit.attention(q, k, v, mask=mask, causal=causal, backend="chunked")` computes
    on the compiled CPU kernel, q (B, H, N, D), k and v (B, Hkv, S, ·), in one pass.

    Args:
        mask: a structured mask (`attnkit.masks.window`, `document`, `prefix`,
            `from_function`, and their `&`/`|`), or None (no mask). Boolean tensors combined
            into it are applied inside blocks and skip nothing.
        n, s: queries N and keys S; default the mask's (required without a mask; S
            defaults to N).
        causal: query i sees keys j <= i + S - N (bottom-right, as attnkit); with a mask it
            is folded in as `attention` does (mask & causal).
        pass_: "forward" or "backward": the kernel's blocks differ (`PASSES`) unless the mask
            has tiles. `native.count_work()` counts both passes together.
        batch, heads: B and H of the call (the mask's own batch and heads must be 1 or these).
            Key/value heads (GQA) change nothing: every query head walks its own blocks.
        grad: whether the call's inputs want gradients: without, a 2-D neighbourhood's
            forward runs in token order (`reordered.natural_runs`), not reordered; with,
            both passes do where the backward's offset path takes rows of several runs
            (`_grid.offset_runs`: AVX-512 and AVX2 builds), else both run reordered.
        plain: the call has no bias, dropout or score function (nor a dense part in the mask):
            its forward computes rows of several runs on the offset path, and its backward
            bands of 33 to 64 keys a row (the same entries as the row path) and rows of
            several runs (the forward's entries) on its offset paths (AVX-512 builds of the
            kernel; rows of several runs on AVX2 builds too; unless
            ATTNKIT_OFFSET_BACKWARD=0); False: on the blocks, as the forward does them.
    """
    if pass_ not in PASSES:
        raise ValueError(f"pass_ must be 'forward' or 'backward', got {pass_!r}")
    n, s = _sizes(mask, n, s)
    for name, value in (("batch", batch), ("heads", heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
        own = 1 if mask is None else getattr(mask, name)
        if own not in (1, value):
            raise ValueError(f"mask has {name} {own}: the call's {name} must be {own}, got {value}")
    if isinstance(mask, Reordered) and not causal and n > 0:
        natural = (not grad and pass_ == "forward") or (grad and offset_runs())
        if mask.natural is not None and natural:
            got = kernel_work(mask.natural, pass_=pass_, batch=batch, heads=heads)
            return replace(got, allowed=_allowed(mask, n, s, False, got.dense))
        return _reordered(mask, pass_, batch, heads)
    plan = None
    if mask is not None:
        if causal:  # what `attention` does: causal joins the mask as row intervals
            mask, causal = mask & causal_intervals(n, s), False
        plan = kernel_plan(mask, "cpu")
    bq, bk = PASSES[pass_] if plan is None or plan.tiles is None else tuple(plan.tiles.shape[1:])
    if pass_ == "forward" and (plan is None or plan.tiles is None):
        structured = plan is not None and (plan.rows is not None or plan.table is not None)
        bq, bk = forward_blocks(n, causal, structured)
    plain = plain and (plan is None or plan.dense is None)  # the kernel's `plain_scores`
    # the backward's offset path: AVX-512 builds (the kernel's default routing)
    bands = pass_ == "backward" and plain and offset_bands()
    runs = pass_ == "backward" and plain and offset_runs()  # rows of several runs
    if plan is not None and plan.tiles is None:  # rows alone: query blocks sized to them
        pick = backward_query_block if pass_ == "backward" and plain else query_block
        bq = min(bq, pick(plan.rows, bq))
    walks = _walks(plan)
    computed = blocks = 0
    for one in walks:
        for i0 in range(0, n, bq):
            i1 = min(i0 + bq, n)
            spans = [(j0, j1) for j0, j1, _, _ in key_blocks(one, i0, i1, n, s, bq, bk, causal)]
            offsets = plain if pass_ == "forward" else runs  # offset_path.h, offset_runs.h
            path = _offset_path(one, i0, i1, n, s, causal) if offsets else None
            keys = _row_keys(one, i0, i1, n, s, causal, spans)
            path = path or _path(keys, spans, pass_, bands, i0)
            if path is not None:  # each row or tile over its own keys, no blocks
                computed += path[1]
                continue
            computed += sum((i1 - i0) * (j1 - j0) for j0, j1 in spans)
            blocks += len(spans)
    repeat = batch * heads // len(walks)  # walks that are the same as one of `walks`
    dense = batch * heads * n * s
    return KernelWork(
        dense=dense,
        allowed=_allowed(mask, n, s, causal, dense),
        computed=computed * repeat,
        blocks=blocks * repeat,
        block_q=bq,
        block_k=bk,
    )


def _reordered(mask: Reordered, pass_: str, batch: int, heads: int) -> KernelWork:
    """A reordered mask's call (`reordered.run_reordered`): its inner mask on the gathered
    tokens, or its interleaved sequences (`Groups`) read in place, one call of B·g rows; the
    allowed pairs are the mask's own."""
    if mask.groups is None:
        got = kernel_work(mask.inner, pass_=pass_, batch=batch, heads=heads)
    else:
        g = mask.groups.count
        n = mask.n // g
        call = group_call(mask.groups, n)
        got = kernel_work(
            call["m"], n=n, s=n, causal=call["causal"], pass_=pass_, batch=batch * g, heads=heads
        )
    dense = batch * heads * mask.n * mask.s
    return replace(got, dense=dense, allowed=_allowed(mask, mask.n, mask.s, False, dense))


def _sizes(mask: StructuredMask | None, n: int | None, s: int | None) -> tuple[int, int]:
    if mask is None:
        if n is None:
            raise ValueError("n is required without a mask")
        s = n if s is None else s
    else:
        if not isinstance(mask, StructuredMask):
            got = type(mask).__name__
            raise ValueError(f"mask must be a StructuredMask (masks.window, ...), got {got}")
        given = (mask.n if n is None else n, mask.s if s is None else s)
        if given != (mask.n, mask.s):
            raise ValueError(
                f"mask describes N={mask.n} queries and S={mask.s} keys, not N={given[0]}, "
                f"S={given[1]}"
            )
        n, s = mask.n, mask.s
    for name, value in (("n", n), ("s", s)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return n, s


def _row_keys(plan: MaskPlan | None, i0, i1, n, s, causal, spans) -> tuple | None:
    """Rows i0:i1's keys [lo, hi) within the blocks' span, cut by the causal limit
    (_native/row_path.h's `row_span`), or None where neither the row nor the tile path can
    take them (tiles, or rows with several runs)."""
    if plan is not None and (
        plan.table is not None or (plan.rows is not None and plan.rows.shape[1] > 1)
    ):
        return None
    first, end = (spans[0][0], spans[-1][1]) if spans else (0, 0)
    i = torch.arange(i0, i1)
    lo, hi = torch.full_like(i, first), torch.full_like(i, end)
    if plan is not None and plan.rows is not None:
        lo = plan.rows[0, 0, 0, i0:i1].clamp(min=first)
        hi = plan.rows[1, 0, 0, i0:i1].clamp(max=end)
    if causal:
        hi = torch.minimum(hi, i + s - n + 1)
    return lo, torch.maximum(hi, lo)


def _row_path(keys: tuple | None, spans, limit) -> int | None:
    """The entries rows compute on the row path (_native/row_path.h's `row_path`: every row
    at most `limit` keys, the blocks' span wider than the widest), from their `_row_keys`, or
    None where they do not take it."""
    if keys is None:
        return None
    first, end = (spans[0][0], spans[-1][1]) if spans else (0, 0)
    width = keys[1] - keys[0]
    widest = int(width.max())
    return int(width.sum()) if widest <= limit and end - first > widest else None


def _tile_path(keys: tuple | None, rows: int | None) -> int | None:
    """The entries rows compute on the tile path (_native/tile_path.h's
    `tile_path`): at least TILE_ROWS rows, TILE_ROWS at a time, each tile over the union of
    its rows' keys (rows that see nothing add nothing); None where a tile spans more than
    TILE_KEYS keys, the rows are fewer (or `keys` is None), or, where the row path takes them
    too (`rows` not None), a tile computes over 5/4 of the entries its rows see."""
    if keys is None or len(keys[0]) < TILE_ROWS:
        return None
    computed = 0
    for t in range(0, len(keys[0]), TILE_ROWS):
        lo, hi = keys[0][t : t + TILE_ROWS], keys[1][t : t + TILE_ROWS]
        seen = lo < hi
        span = int(hi[seen].max() - lo[seen].min()) if bool(seen.any()) else 0
        entries = len(lo) * span
        if span > TILE_KEYS or (rows is not None and 4 * entries > 5 * int((hi - lo).sum())):
            return None
        computed += entries
    return computed


def _path(keys: tuple | None, spans, pass_: str, bands: bool, i0: int) -> tuple[str, int] | None:
    """("tiles", entries) or ("rows", entries) where a query block (rows from i0) takes the
    tile path, the row path or (`bands`) the backward's offset path, None for the
    blocks (_native/forward.h's `forward_block`, backward_block.h's `backward_block`)."""
    rows = _row_path(keys, spans, ROW_PATH_KEYS[pass_])
    if rows is None and bands:  # a band's tile among rows of up to BACKWARD_BAND_KEYS keys
        wide = _row_path(keys, spans, BACKWARD_BAND_KEYS)
        if wide is not None and bool(shared_tiles(keys[0], keys[1], i0).any()):
            rows = wide
    tiles = _tile_path(keys, rows)  # both passes (tile_path.h, tile_backward.h)
    if tiles is not None:
        return "tiles", tiles
    return None if rows is None else ("rows", rows)


def _offset_path(plan: MaskPlan | None, i0, i1, n, s, causal) -> tuple[str, int] | None:
    """("offsets", entries) where rows i0:i1 take the forward's offset path
    (_native/offset_path.h's `offset_path`: rows of several runs, no tiles, at least TILE_ROWS
    rows; each tile of TILE_ROWS rows computes, for each run, the union over its rows of the
    run's offsets from the row's query, j - i; a run's union at most OFFSET_RUN_KEYS, all runs'
    at most OFFSET_KEYS, the block's tiles at most 5/4 of the entries its rows see), else None.
    Only for plain calls: one with a bias, dense mask, dropout or score function keeps the
    blocks."""
    if plan is None or plan.table is not None or plan.rows is None:
        return None
    runs = plan.rows.shape[1]
    if runs == 1 or runs > OFFSET_RUNS or i1 - i0 < TILE_ROWS:
        return None
    i = torch.arange(i0, i1)
    lo, hi = plan.rows[0, :, 0, i0:i1], plan.rows[1, :, 0, i0:i1]  # (K, nq)
    if causal:
        hi = torch.minimum(hi, i + s - n + 1)
    seen = lo < hi
    pad = -(i1 - i0) % TILE_ROWS
    first = torch.nn.functional.pad(torch.where(seen, lo - i, _BIG), (0, pad), value=_BIG)
    last = torch.nn.functional.pad(torch.where(seen, hi - i, _SMALL), (0, pad), value=_SMALL)
    dlo = first.view(runs, -1, TILE_ROWS).min(-1).values  # (K, tiles): each run's union
    dhi = last.view(runs, -1, TILE_ROWS).max(-1).values
    width = torch.where(dlo < dhi, dhi - dlo, 0)
    total = width.sum(0)  # (tiles,)
    if bool((width > OFFSET_RUN_KEYS).any()) or bool((total > OFFSET_KEYS).any()):
        return None
    rows = torch.full_like(total, TILE_ROWS)
    rows[-1] = i1 - i0 - TILE_ROWS * (len(total) - 1)
    computed = int((rows * total).sum())
    allowed = int(torch.where(seen, hi - lo, 0).sum())
    return ("offsets", computed) if 4 * computed <= 5 * allowed else None


def _walks(plan: MaskPlan | None) -> list[MaskPlan | None]:
    """One plan per (batch row, head) whose blocks differ, in the kernel's order: the kernel
    reads row b of the intervals and row (b, h) of the tile table, or row 0 of a broadcast one."""
    if plan is None:
        return [None]
    rows, table = plan.rows, plan.table
    nb = max(1 if rows is None else rows.shape[2], 1 if table is None else table.shape[0])
    nh = 1 if table is None else table.shape[1]
    walks = []
    for b in range(nb):
        for h in range(nh):
            r = None if rows is None else rows[:, :, b % rows.shape[2], None]  # (2, K, 1, N)
            t = None
            if table is not None:
                t = table[b % table.shape[0], h % table.shape[1]][None, None]  # (1, 1, nqb, nkb)
            walks.append(plan._replace(rows=r, table=t))
    return walks


def _allowed(mask: StructuredMask | None, n: int, s: int, causal: bool, dense: int) -> int:
    """Pairs the mask allows over B·H, from its `.density` (over its own (B|1, H|1, N, S))."""
    if mask is None:
        mask = causal_intervals(n, s) if causal else None
    if mask is None or dense == 0:
        return dense
    return round(mask.density * dense)
