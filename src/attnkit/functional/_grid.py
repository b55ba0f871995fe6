"""Block sizes that follow a structured mask's shape.

Legend: B batch, H heads, N queries, S keys; bq × bk the kernel's score blocks.

A blocked kernel computes whole blocks: a query block of a row-interval mask costs
bq × (the span of its rows' keys), a tile plan every non-empty block's bq × bk. Large blocks
run the products fastest per entry; small ones waste less where the mask is narrow (a 9-key
window in 128-row blocks computes 136 keys per row, 15× what it uses) or scattered (a 2-D
neighbourhood touches few keys of each 128 × 256 block). The choices below minimise an
estimate of the time: the entries computed, plus per block call a fixed cost and a cost per
query row (the row loop's set-up, the output's rescaling), in entries' worth of time. Fitted to
the compiled forward on AMD EPYC Zen 4 (1 thread, H=8, D=64, N=4096; windows of 9 and 64
keys, 16-token documents and causal at 16-128 rows per block): a call ≈ 384 entries, a row
≈ 40 (a 16 × 32 block costs twice its entries), and 16-row blocks ≈ 1.2× the time per entry
of 128-row ones (causal: 1188 vs 1092 ms).
"""

from __future__ import annotations

import os
import weakref

import torch
from torch import Tensor

from attnkit.functional._blocks import (
    BACKWARD_BAND_KEYS,
    BACKWARD_ROW_KEYS,
    STRUCTURED_BLOCK_K,
    STRUCTURED_BLOCK_Q,
)

__all__ = [
    "FINE_GRID",
    "FINE_LIMIT",
    "backward_query_block",
    "choose_block_q",
    "choose_tile_grid",
    "offset_bands",
    "offset_runs",
    "query_block",
    "set_query_block",
    "shared_tiles",
    "tile_grid_cost",
]

_CALL_COST, _ROW_COST = 384, 40  # entries' worth of time per block call and per row in it
# time per entry against 128-row blocks: a short block re-reads the key block per fewer rows
_ENTRY_COST = {128: 1.0, 64: 1.03, 32: 1.08, 16: 1.2}
_FORWARD_BLOCK_K = 512  # the compiled forward's key block (`_blocks.FORWARD_BLOCK_K`)
_TILE_GRIDS = ((128, 256), (64, 128), (64, 64), (32, 64), (32, 32), (16, 32))
FINE_GRID = (16, 32)  # the finest candidate: the others' block maps are pooled from its map
FINE_LIMIT = 1 << 25  # fine-map cells (bytes) past which the default grid is kept


# The query block chosen for a plan's row intervals, keyed by the plan's `rows` tensor (which the
# plan cache keeps alive): the kernel's arguments carry tensors, and this int rides with them.
# (By id, dropped when the tensor is: a WeakKeyDictionary compares tensors with ==.)
_BANDS: dict[int, tuple[int, bool]] = {}  # id(rows) -> _bands
_QUERY_BLOCKS: dict[int, int] = {}
_BANDS: dict[int, tuple[int, bool]] = {}  # id(rows) -> _bands


def set_query_block(rows: Tensor, bq: int) -> None:
    if id(rows) not in _QUERY_BLOCKS:
        weakref.finalize(rows, _QUERY_BLOCKS.pop, id(rows), None)
    _QUERY_BLOCKS[id(rows)] = bq


def query_block(rows: Tensor | None, default: int) -> int:
    """The query block chosen for these row intervals (`choose_block_q`), else `default`."""
    return default if rows is None else _QUERY_BLOCKS.get(id(rows), default)


def shared_tiles(lo: Tensor, hi: Tensor, i0: int) -> Tensor:
    """For each tile of 8 rows (queries i0.., keys [lo, hi), (..., n) of one run): whether its
    rows share their offsets j - i, none empty (_native/offset_backward.h's `shared_offsets`,
    a band's tiles); a last tile of fewer rows: not."""
    n = lo.shape[-1] // 8 * 8
    i = torch.arange(i0, i0 + n, device=lo.device)
    dlo = (lo[..., :n] - i).unflatten(-1, (-1, 8))  # (..., n / 8, 8)
    dhi = (hi[..., :n] - i).unflatten(-1, (-1, 8))
    same = (dlo == dlo[..., :1]).all(-1) & (dhi == dhi[..., :1]).all(-1)
    return same & (dhi[..., 0] > dlo[..., 0])


def _bands(rows: Tensor) -> tuple[int, bool]:
    """(the most keys a row sees, whether at least half of the tiles are a band's), rows
    int64 (2, 1, B|1, N); cached by the tensor's identity like `query_block`."""
    if id(rows) not in _BANDS:
        weakref.finalize(rows, _BANDS.pop, id(rows), None)
        lo, hi = rows[0, 0], rows[1, 0]  # (B|1, N)
        widest = int((hi - lo).clamp(min=0).max()) if lo.numel() else 0
        shared = shared_tiles(lo, hi, 0)
        _BANDS[id(rows)] = (widest, shared.numel() > 0 and 2 * int(shared.sum()) >= shared.numel())
    return _BANDS[id(rows)]


def offset_bands() -> bool:
    """Whether the compiled backward computes bands on its offset path by default
    (_native/offset_backward.h's offset_switch): on AVX-512 builds
    (`_kernel_cache.kernel_isa`), unless ATTNKIT_OFFSET_BACKWARD=0."""
    from attnkit.functional._kernel_cache import kernel_isa  # the kernel's build, not loaded

    return os.environ.get("ATTNKIT_OFFSET_BACKWARD") != "0" and kernel_isa() == "avx512"


def offset_runs() -> bool:
    """Whether the compiled backward takes rows of several runs on its offset path
    (_native/offset_runs.h's runs_fit): ATTNKIT_OFFSET_BACKWARD=1, or unless it is 0 on
    AVX-512 and AVX2 builds (`_kernel_cache.kernel_isa`)."""
    from attnkit.functional._kernel_cache import kernel_isa  # the kernel's build, not loaded

    switch = os.environ.get("ATTNKIT_OFFSET_BACKWARD")
    return switch == "1" or (switch != "0" and kernel_isa() in ("avx512", "avx2"))


def backward_query_block(rows: Tensor | None, default: int) -> int:
    """The compiled backward's query block for a plain call (`_blocks.BACKWARD_BAND_KEYS`): the
    full `default` for rows of several runs where the backward takes them on its offset path
    (`offset_runs`; _native/offset_runs.h: its key lanes sum over each run's span, one canvas
    row's and the kernel's rows more) and for a band (rows of one run, at least half of the
    8-row tiles sharing their offsets) whose rows see at most BACKWARD_BAND_KEYS keys and some
    more than BACKWARD_ROW_KEYS where bands take it (`offset_bands`), else `query_block`'s.
    Measured (fwd+bwd, 1 thread, AMD EPYC Zen 4, loaded machine): the forward's 16-32-row
    blocks took 1.23x the time of 128-row ones for 15 x 15 on 128 x 128, 1.27x for 7 x 7 on
    64 x 64 (15 x 15 on 64 x 64: 0.85-1.47x, noisy)."""
    if rows is not None and rows.shape[1] > 1 and offset_runs():
        return default
    if rows is not None and rows.shape[1] == 1 and offset_bands():
        widest, band = _bands(rows)
        if band and BACKWARD_ROW_KEYS < widest <= BACKWARD_BAND_KEYS:
            return default
    return query_block(rows, default)


def _fold(x: Tensor, bq: int, fill: int, op) -> Tensor:
    """(B, N) -> (B, ceil(N / bq)), reduced over each block's rows."""
    b, n = x.shape
    pad = -n % bq
    return op(torch.nn.functional.pad(x, (0, pad), value=fill).view(b, -1, bq), dim=2).values


def choose_block_q(rows: Tensor, s: int) -> int:
    """Query rows per block for a plan's runs of keys, rows int64 (2, K, B|1, N): the one of
    128, 64, 32, 16 that minimises the estimated forward time. A block's keys are estimated
    as the sum over k of its rows' k-th runs' spans (an overestimate where they overlap).

    A band (a window: one run a row, `_bands`) of at most BACKWARD_ROW_KEYS keys a row keeps
    STRUCTURED_BLOCK_Q: its rows go a row at a time over their own keys in both passes (the
    row path, the forward's narrow path), whose work does not grow with the block, and a
    block's set-up (its runs, key blocks and path checks) is paid once for 128 rows instead of
    16 (wider bands' backward takes the blocks where the offset path is off: AVX2 builds).
    Measured (AMD EPYC Zen 4, 1 thread, N=4096, H=8, D=64, 16 -> 128 rows interleaved in one
    process, thread CPU time): windows of 1, 9 and 17 keys forward 0.93x, 0.94x and 0.95x the
    time, forward + backward 0.94x, 0.91x and 0.91x."""
    if rows.shape[1] == 1:
        widest, band = _bands(rows)
        if band and widest <= BACKWARD_ROW_KEYS:
            return STRUCTURED_BLOCK_Q
    lo, hi = rows[0].cpu().flatten(0, 1), rows[1].cpu().flatten(0, 1)  # (K·B|1, N)
    seen = lo < hi
    lo, hi = torch.where(seen, lo, s), torch.where(seen, hi, 0)
    best, best_cost = STRUCTURED_BLOCK_Q, None
    for bq in _ENTRY_COST:
        span = (_fold(hi, bq, 0, torch.max) - _fold(lo, bq, s, torch.min)).clamp(min=0)
        rows_in = torch.full_like(span, bq)
        rows_in[:, -1] = lo.shape[1] - bq * (span.shape[1] - 1)  # the last block's rows
        entries = float((rows_in * span).sum())
        calls = float((-(-span // _FORWARD_BLOCK_K)).sum())
        cost = entries * _ENTRY_COST[bq] + calls * (_CALL_COST + _ROW_COST * bq)
        if best_cost is None or cost < best_cost:
            best, best_cost = bq, cost
    return best


def choose_tile_grid(fine: Tensor) -> tuple[int, int]:
    """(bq, bk) of the tile grid for a mask evaluated block by block: the candidate grid whose
    non-empty blocks cost least, from the mask's block classes on `FINE_GRID` (int8
    (B, H, N / 16, S / 32), 0 = empty; `_block_scan.scan`)."""
    return tile_grid_cost(fine)[0]


def tile_grid_cost(fine: Tensor) -> tuple[tuple[int, int], float]:
    """`choose_tile_grid`'s grid and its estimated forward time, in entries' worth."""
    fq, fk = FINE_GRID
    touched = (fine != 0).flatten(0, 1).view(torch.uint8)  # (B·H, N / 16, S / 32)
    bh, nqf, nkf = touched.shape
    best, best_cost = (STRUCTURED_BLOCK_Q, STRUCTURED_BLOCK_K), None
    for bq, bk in _TILE_GRIDS:
        rq, rk = bq // fq, bk // fk
        pad = (0, -nkf % rk, 0, -nqf % rq)
        cells = torch.nn.functional.pad(touched, pad) if any(pad) else touched
        blocks = cells.view(bh, -(-nqf // rq), rq, -(-nkf // rk), rk)  # (B·H, N/bq, ., S/bk, .)
        calls = float(blocks.amax((2, 4)).sum())
        cost = calls * (bq * bk * _ENTRY_COST[bq] + _CALL_COST + _ROW_COST * bq)
        if best_cost is None or cost < best_cost:
            best, best_cost = (bq, bk), cost
    return best, best_cost
