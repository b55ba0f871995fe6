"""The compiled kernel's arguments: the ctypes mirror of ``struct Args`` (_native/args.h) and how
a call's tensors, plan and cotangent fill it (`native` and `_native_mod` call the kernel with
it), and the count of computed entries that tests read (`count_work`).

Legend: B batch, H query heads, N queries, S keys, D head width, Dv value head width.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator

import torch
from torch import Tensor

from attnkit.functional._dropout import NO_DROPOUT
from attnkit.functional._grid import backward_query_block, query_block

__all__ = ["Args", "count_work", "kernel_args", "point_at_cotangent"]


class Args(ctypes.Structure):
    """Mirror of ``struct Args`` in _native/args.h (same order, same types)."""

    _fields_ = [
        *[(n, ctypes.c_int64) for n in ("B", "H", "Hkv", "N", "S", "D", "Dv", "bq", "bk")],
        ("causal", ctypes.c_int64),
        ("keep_t", ctypes.c_int64),
        ("nthreads", ctypes.c_int64),
        ("seed", ctypes.c_uint64),
        ("scale", ctypes.c_float),
        ("inv_keep", ctypes.c_float),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("mask", ctypes.c_void_p),
        ("mask_st", ctypes.c_int64 * 4),
        ("bias", ctypes.c_void_p),
        ("bias_st", ctypes.c_int64 * 4),
        ("out", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("dout", ctypes.c_void_p),
        ("dout_st", ctypes.c_int64 * 4),
        ("dlse", ctypes.c_void_p),
        ("dq", ctypes.c_void_p),
        ("dk", ctypes.c_void_p),
        ("dv", ctypes.c_void_p),
        ("rows", ctypes.c_void_p),
        ("rows_bst", ctypes.c_int64),
        ("rows_half", ctypes.c_int64),
        ("rows_k", ctypes.c_int64),
        ("rows_kst", ctypes.c_int64),
        ("table", ctypes.c_void_p),
        ("table_st", ctypes.c_int64 * 2),
        ("tiles", ctypes.c_void_p),
        ("work", ctypes.c_void_p),
        # score functions (`_native_mod`)
        ("softcap", ctypes.c_float),
        ("alibi", ctypes.c_void_p),
        ("alibi_offset", ctypes.c_int64),
        ("alibi_symmetric", ctypes.c_int64),
        ("alibi_post", ctypes.c_int64),
        ("rel", ctypes.c_void_p),
        ("rel_qpos", ctypes.c_void_p),
        ("rel_kpos", ctypes.c_void_p),
        ("rel_zero", ctypes.c_int64),
        ("rel_len", ctypes.c_int64),
        ("rel_post", ctypes.c_int64),
        ("rel_grad", ctypes.c_void_p),
        ("groups", ctypes.c_int64),
        ("qrows", ctypes.c_void_p),
    ]


def _broadcast(t: Tensor, full: tuple[int, int, int, int]) -> tuple[Tensor, list[int]]:
    """A (…, N|1, S|1) tensor as a (B, H, N, S) view without copying, and its strides."""
    view = t[(None,) * (4 - t.dim())].expand(full)
    return view, list(view.stride())


def kernel_args(
    q, k, v, mask, bias, causal, scale, keep_t, inv_keep, seed, structure, blocks, groups=1,
    qrows=None, bands=False,
) -> Args:  # fmt: skip
    """The kernel's arguments. `groups`: the token axis interleaves that many independent
    sequences (`Args::groups` in _native/args.h), N and S counting one sequence's. `qrows`:
    the query row map (`Args::qrows`), int64 (N,) contiguous, or None. `bands`: a plain
    backward (no score functions), whose bands keep full query blocks
    (`_grid.backward_query_block`)."""
    b, h, n, d = q.shape
    n, s = n // groups, k.shape[2] // groups
    rows, table, tiles = structure
    if tiles is not None:  # the tiles fix the grid of both passes
        blocks = tuple(tiles.shape[1:])
    else:  # rows alone: query blocks sized to the rows' spans (`_grid.choose_block_q`)
        plain = bands and mask is None and bias is None and keep_t == NO_DROPOUT
        pick = backward_query_block if plain else query_block
        blocks = (min(blocks[0], pick(rows, blocks[0])), blocks[1])
    a = Args(
        B=b, H=h, Hkv=k.shape[1], N=n, S=s, D=d, Dv=v.shape[3], bq=blocks[0], bk=blocks[1],
        causal=int(causal), keep_t=keep_t, nthreads=torch.get_num_threads(), seed=seed,
        scale=scale, inv_keep=inv_keep, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(),
        groups=groups, qrows=None if qrows is None else qrows.data_ptr(),
    )  # fmt: skip
    full = (b, h, n, s)
    if mask is not None:
        view, a.mask_st[:] = _broadcast(mask, full)
        a.mask = view.data_ptr()
    if bias is not None:
        view, a.bias_st[:] = _broadcast(bias, full)
        a.bias = view.data_ptr()
    if rows is not None:  # (2, K, B|1, N) int64, contiguous
        a.rows, a.rows_half = rows.data_ptr(), rows[0].numel()
        a.rows_k, a.rows_kst = rows.shape[1], rows[0, 0].numel()
        a.rows_bst = n if rows.shape[2] != 1 else 0
    if table is not None:  # (B|1, H|1, nqb, nkb) int32, contiguous
        a.table, a.tiles = table.data_ptr(), tiles.data_ptr()
        a.table_st[:] = [table.stride(i) if table.shape[i] != 1 else 0 for i in (0, 1)]
    if _work is not None:
        a.work = _work.data_ptr()
    return a


# Score entries the kernel computes, counted while `count_work` is active (eager calls only).
_work: Tensor | None = None


@contextlib.contextmanager
def count_work() -> Iterator[Tensor]:
    """Count the score entries (query, key pairs) the kernel computes inside the block, forward
    and backward together: a 1-element int64 tensor, filled as calls run. The cost model's
    count of computed blocks (`attnkit.analysis`) is tested against it."""
    global _work
    before, _work = _work, torch.zeros(1, dtype=torch.int64)
    try:
        yield _work
    finally:
        _work = before


def point_at_cotangent(a: Args, dout: Tensor) -> None:
    """Point the kernel's `a` at dout (B, H, N, Dv, float32) through its strides
    (``Args::dout_st``), with no copy: the cotangent of ``out.sum().backward()`` is one value
    broadcast (strides all 0), and making it contiguous cost a (B, H, N, Dv) tensor and its
    page faults (32 MiB at N=16384, H=8, D=64) in every backward. The kernel copies each row
    it reads into its own buffer anyway (dO' = dO / keep)."""
    a.dout = dout.data_ptr()
    a.dout_st[:] = list(dout.stride())
