"""One (query shard, key block) pair of ring attention: geometry, bias, kernels, the lse merge.

Legend: B batch, H query heads, Hkv key/value heads, n = N/P local sequence length, D head
width, Dv value width, P ranks, r this rank, src the rank whose key block is visiting;
nq/nk the rows/columns of one block (n, or n/2 for a zigzag half).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from attnkit.distributed.layout import positions
from attnkit.functional import _chunked_torch, chunked, native
from attnkit.functional._dropout import NO_DROPOUT

_ALL = slice(None)
# pieces per block: a rank holds one piece's K/V, dK/dV accumulators and their transfers at
# a time, ~10/PIECES units (ring.py's docstring), against ~1/PIECES of extra calls and messages
PIECES = 16
# a piece's K + V are at least this many bytes (fewer pieces for a smaller block, one below
# it): under it the pieces' per-call and per-message costs would outweigh the memory they
# save (tests set 0 to cut even tiny blocks into PIECES)
MIN_PIECE_BYTES = 128 << 10


Piece = tuple[slice, slice, tuple[slice, ...]]  # batch rows, kv heads, key runs


def pieces(b: int, hkv: int, n: int, want: int = PIECES, halves: bool = False) -> list[Piece]:
    """(batch rows, key/value heads, key runs) boxes covering (B, Hkv, n), about ``want``.

    With B·Hkv >= want: runs of batch rows (every head), or one batch row with a run of heads,
    every position. Otherwise every (batch row, head) alone, its keys cut into runs; with
    ``halves`` (zigzag, n even) a piece is a PAIR of runs, the same offsets in both halves
    of the shard (its two chunks), so that every piece holds keys of both chunks and a
    causal zigzag ring gives every rank the same work per piece (`block_geometry`: a rank
    sees either the first half of a block's keys with all its rows, or all keys with half
    its rows). Each run is a contiguous view of a contiguous (B, Hkv, n, …) tensor (sent as
    it is), and the (batch, head) rectangle one of the (B, H, …) query-side tensors (query
    heads g·h0 … g·h1, G = H/Hkv). Attention is per (batch, head), and a run of keys is a
    smaller key block (merged by lse like any other; its dK/dV depend on it alone; dQ adds),
    so cutting the work this way changes no result beyond rounding.
    """
    if b * hkv >= want:
        if b >= want:
            return [(slice(b0, b1), _ALL, (_ALL,)) for b0, b1 in _split(b, want)]
        per = -(-want // b)  # head runs per batch row, <= hkv
        return [
            (slice(i, i + 1), slice(h0, h1), (_ALL,))
            for i in range(b)
            for h0, h1 in _split(hkv, per)
        ]
    halves = halves and n % 2 == 0
    span = n // 2 if halves else n  # runs are cut from one half, mirrored in the other
    runs = min(span, -(-want // (b * hkv)))  # pieces per (batch row, head)
    cut = [
        (slice(j0, j1), slice(span + j0, span + j1)) if halves else (slice(j0, j1),)
        for j0, j1 in _split(span, runs)
    ]
    return [
        (slice(i, i + 1), slice(h, h + 1), c) for i in range(b) for h in range(hkv) for c in cut
    ]


def travel_pieces(k: Tensor, v: Tensor, world: int, halves: bool = False) -> list[Piece]:
    """The pieces a block of K (B, Hkv, n, D), V (B, Hkv, n, Dv) travels in (`pieces`): as
    many as it has MIN_PIECE_BYTES of K + V, at most PIECES; one when nothing travels."""
    size = (k.numel() + v.numel()) * k.element_size()
    want = min(PIECES, size // max(1, MIN_PIECE_BYTES))
    if world == 1 or want <= 1:
        return [(_ALL, _ALL, (_ALL,))]
    return pieces(*k.shape[:3], want=want, halves=halves)


def _split(n: int, k: int) -> list[tuple[int, int]]:
    cut = [n * i // k for i in range(k + 1)]
    return [(a, z) for a, z in itertools.pairwise(cut) if z > a]


def position_cache(n: int, rank: int, world: int, layout: str, device):
    """src -> the global positions (n,) of src's shard, on ``device`` (cached per call)."""
    cache: dict[int, Tensor] = {}

    def pos(src: int) -> Tensor:
        if src not in cache:
            cache[src] = positions(n * world, src, world, layout).to(device)
        return cache[src]

    return pos


def q_heads(heads: slice, g: int) -> slice:
    """The query heads (of H = G·Hkv) served by the key/value heads ``heads``."""
    return heads if heads == _ALL else slice(heads.start * g, heads.stop * g)


def part(t: Tensor | None, rows: slice, heads: slice) -> Tensor | None:
    """t[rows, heads] of a (B|1, H|1, …) tensor, leaving broadcast (size-1) dims whole."""
    if t is None:
        return None
    return t[rows if t.shape[0] > 1 else _ALL, heads if t.shape[1] > 1 else _ALL]


def gather_masks(mask: Tensor | None, group, world: int) -> list[Tensor] | None:
    """src -> src's key-padding mask as uint8 (every backend sends bytes), by one all-gather:
    n bytes per (B|1, H|1) row each, so every rank may hold all of them."""
    if mask is None:
        return None
    m8 = mask.to(torch.uint8).contiguous()
    if world == 1:
        return [m8]
    got = [torch.empty_like(m8) for _ in range(world)]
    dist.all_gather(got, m8, group=group)
    return got


class Pool:
    """Free transfer buffers: a piece's, once computed and sent on, is reused for a piece
    that arrives, so the ring allocates a few buffers per call. The pieces differ in shape
    (K or V, key runs one position apart): a buffer serves any piece it is large enough for."""

    def __init__(self):
        self.free: list[Tensor] = []  # flat (numel,) buffers

    def take(self, like: Tensor) -> Tensor:
        """An uninitialised contiguous tensor shaped like ``like``."""
        n, fits = like.numel(), None
        for i, buf in enumerate(self.free):
            ok = buf.dtype == like.dtype and buf.device == like.device and buf.numel() >= n
            if ok and (fits is None or buf.numel() < self.free[fits].numel()):
                fits = i  # the smallest that fits
        flat = self.free.pop(fits) if fits is not None else like.new_empty(n)
        return flat[:n].view(like.shape)

    def give(self, ts) -> None:
        for t in ts:  # a view of a flat buffer from take(): its _base is that buffer
            self.free.append(t if t._base is None else t._base)


def _native_ok(q: Tensor, want_dbias: bool = False) -> bool:
    # the compiled kernel takes a bias but does not return its gradient
    return (
        q.device.type == "cpu"
        and q.dtype == torch.float32
        and not want_dbias
        and native.available()
    )


def _plan(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, structure=None):
    bq, bk = (
        (chunked.CAUSAL_BLOCK_Q, chunked.CAUSAL_BLOCK_K)
        if causal
        else (chunked.DEFAULT_BLOCK_Q, chunked.DEFAULT_BLOCK_K)
    )
    pl = _chunked_torch._Plan(q, k, v, causal, bq, bk, structure)  # tiles, if any, fix the grid
    pl.scale, pl.inv_keep = scale, 1.0  # no dropout: inv_keep only rescales 1/l
    return pl


def block_forward(
    q, k, v, mask, bias, causal: bool, scale: float, plan=None
) -> tuple[Tensor, Tensor]:
    """One query block against one key block: out (B, H, nq, Dv) and lse (B, H, nq).

    q, k, v in the compute dtype (float32 or float64); mask bool broadcastable to
    (B, H, nq, nk) or None; bias (B|1, H|1, nq, nk) in the compute dtype or None; ``plan``
    a structured mask's `MaskPlan` on this block (its dense part given as ``mask``), or None.
    The compiled CPU kernel for float32 on the CPU, the PyTorch chunked kernel elsewhere.
    """
    if _native_ok(q):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        rest = () if plan is None else (plan.rows, plan.table, plan.tiles)
        return native._forward(q, k, v, mask, bias, causal, scale, NO_DROPOUT, 1.0, None, *rest)
    pl = _plan(q, k, v, causal, scale, plan)
    return _chunked_torch._forward(pl, q, k, v, _chunked_torch._as4d(mask), bias, NO_DROPOUT, None)


def block_backward(dout, dlse, q, k, v, out, lse, mask, bias, causal, scale, want_dbias,
                   into=None, plan=None):  # fmt: skip
    """dq, dk, dv, dbias (or None) of one block given the GLOBAL out (B, H, nq, Dv), lse (B, H, nq).

    dbias has the block bias's shape (B|1, H|1, nq, nk), summed over its broadcast dims.
    ``into=(dq, dk, dv)``: dq is written there and dk, dv are added there (the compiled
    kernel does so without temporaries, `native._backward_into`), and the first three
    results are None. ``plan``: as in `block_forward`.
    """
    if _native_ok(q, want_dbias):
        c = [t.contiguous() for t in (dout, q, k, v, out, lse)]
        dlse = None if dlse is None else dlse.contiguous()
        rest = (mask, bias, causal, scale, NO_DROPOUT, 1.0, None)
        if plan is not None:
            rest += (plan.rows, plan.table, plan.tiles)
        if into is not None and all(t.is_contiguous() for t in into):
            native._backward_into(*into, c[0], dlse, *c[1:], *rest)
            return None, None, None, None
        dq, dk, dv = native._backward(c[0], dlse, *c[1:], *rest)
        gb = None
    else:
        pl = _plan(q, k, v, causal, scale, plan)
        dq, dk, dv, gb = _chunked_torch._backward(
            pl, q, k, v, _chunked_torch._as4d(mask), bias, out, lse, dout, dlse, NO_DROPOUT, None,
            want_dbias,
        )  # fmt: skip
    if into is None:
        return dq, dk, dv, gb
    into[0].copy_(dq)
    into[1].add_(dk)
    into[2].add_(dv)
    return None, None, None, gb


def block_geometry(rank: int, src: int, world: int, layout: str, causal: bool, n: int):
    """(query rows, key rows, causal) of this rank's queries against src's keys, or None."""
    if not causal:
        return _ALL, _ALL, False
    if src == rank:
        return _ALL, _ALL, True  # the diagonal: positions increase within a shard
    if layout == "contiguous":
        return (_ALL, _ALL, False) if src < rank else None
    half = n // 2
    if src < rank:  # src's early chunk precedes both of ours; its late chunk follows both
        return _ALL, slice(0, half), False
    return slice(half, None), _ALL, False  # only our late chunk sees src's chunks


def visiting(rank: int, src: int, world: int, layout: str, causal: bool, n: int, cs: slice):
    """For a block that travelled (src != rank): (query rows, key columns of src's shard,
    the same columns relative to the key run ``cs`` of a piece), or None when the run adds
    nothing to this rank's queries. Such blocks are never causal (`block_geometry`)."""
    geo = block_geometry(rank, src, world, layout, causal, n)
    if geo is None:
        return None
    rows, cols, _ = geo
    (c0, c1, _), (j0, j1, _) = cols.indices(n), cs.indices(n)
    a, z = max(c0, j0), min(c1, j1)
    return None if a >= z else (rows, slice(a, z), slice(a - j0, z - j0))


def merge_into(out: Tensor, lse: Tensor, rows: slice, o_b: Tensor, l_b: Tensor) -> None:
    """out[rows], lse[rows] <- the log-sum-exp merge with a block's (o_b, l_b), in place.

    out + wb·(o_b - out) with wb = exp(l_b - lse_new), which is wa·out + wb·o_b as wa + wb = 1,
    but its rounding error scales with the (usually small) weight of the new block rather than
    with |out|; and lse may be float64 for a float32 out (a ring merges P·(key runs) partial
    results: both keep float32 within the single-process error). Rows that saw nothing so
    far or in this block have lse -inf; they are shifted by 0 so that exp(-inf - 0) = 0
    (never -inf - -inf = NaN). o_b is consumed (overwritten): the only temporaries are per
    row, (B, H, nq), never (B, H, nq, Dv).
    """
    lo = lse[:, :, rows]  # (B, H, nq)
    l_b = l_b.to(lse.dtype)
    new = torch.logaddexp(lo, l_b)
    safe = new.masked_fill(torch.isinf(new) & (new < 0), 0.0)
    wb = (l_b - safe).exp_().to(out.dtype).unsqueeze(-1)  # (B, H, nq, 1) over Dv
    o = out[:, :, rows]  # a view: the update below writes into out
    o.add_(o_b.sub_(o).mul_(wb))
    lse[:, :, rows] = new


# --------------------------------------------------------------------------- bias


BiasFn = Callable[[Tensor, Tensor], Tensor]


def check_bias(bias, bias_fn, q: Tensor, length: int, name: str) -> None:
    """ValueErrors naming ``bias`` / ``bias_fn`` for the forms the strategies accept.

    bias: float (B|1, H|1, N/P, N), this rank's query rows against every key in global
    position order. bias_fn: called on (query positions (1,), key positions (1,)) once here,
    with gradients enabled, to check its shape and that its result needs no gradient.
    """
    b, h, n, _ = q.shape
    if bias is not None and bias_fn is not None:
        raise ValueError(f"{name}: pass bias or bias_fn, not both")
    if bias is not None:
        ok = isinstance(bias, Tensor) and bias.is_floating_point() and bias.dim() == 4
        if (
            not ok
            or bias.shape[0] not in (1, b)
            or bias.shape[1] not in (1, h)
            or (tuple(bias.shape[2:]) != (n, length))
        ):
            got = (tuple(bias.shape), bias.dtype) if isinstance(bias, Tensor) else type(bias)
            raise ValueError(
                f"{name}: bias must be a float tensor of shape (B|1, H|1, N/P={n}, N={length}) "
                f"(this rank's queries against all keys in position order), got {got}"
            )
    if bias_fn is not None:
        if not callable(bias_fn):
            raise ValueError(f"{name}: bias_fn must be callable, got {type(bias_fn).__name__}")
        one = torch.zeros(1, dtype=torch.long, device=q.device)
        with torch.enable_grad():
            probe = bias_fn(one, one)
        ok = isinstance(probe, Tensor) and probe.is_floating_point() and probe.dim() == 4
        if not ok or probe.shape[0] not in (1, b) or probe.shape[1] not in (1, h):
            got = tuple(probe.shape) if isinstance(probe, Tensor) else type(probe).__name__
            raise ValueError(
                f"{name}: bias_fn(q_pos (nq,), k_pos (nk,)) must return a float tensor "
                f"(B|1, H|1, nq, nk); for (1,), (1,) it returned {got}"
            )
        if probe.requires_grad:
            raise ValueError(
                f"{name}: bias_fn's result requires grad, but bias_fn is treated as a constant "
                "(no gradient flows into it); pass a learned bias as the tensor bias= instead"
            )


def bias_block(bias, bias_fn: BiasFn | None, q_pos: Tensor, k_pos: Tensor, rows, cols, dtype):
    """The bias of one block, (B|1, H|1, nq, nk) in ``dtype``, or None.

    q_pos (n,) and k_pos (n,) are the global positions of this rank's queries and of the
    visiting key block (`layout.positions`); rows/cols the block's slices of them.
    """
    if bias is not None:
        blk = bias[:, :, rows].index_select(3, k_pos[cols])  # (B|1, H|1, nq, nk)
    elif bias_fn is not None:
        qp, kp = q_pos[rows], k_pos[cols]
        with torch.no_grad():
            blk = bias_fn(qp, kp)
        want = (qp.numel(), kp.numel())
        if blk.dim() != 4 or tuple(blk.shape[2:]) != want:
            raise ValueError(
                f"bias_fn must return (B|1, H|1, nq, nk) with (nq, nk) = {want}, "
                f"got {tuple(blk.shape)}"
            )
    else:
        return None
    return blk.to(dtype)


def visit_fns(bias, bias_fn, pos, rank, world, layout, causal, n, cdt):
    """This call's `visiting` (src, run) and `bias_block` (src, rows, cols), the other
    arguments fixed."""

    def see(src, run):
        return visiting(rank, src, world, layout, causal, n, run)

    def bias_of(src, rows, cols):
        return bias_block(bias, bias_fn, pos(rank), pos(src), rows, cols, cdt)

    return see, bias_of


def visits(kvp, cs, m_src, src, see, bias_of):
    """The key runs of the visiting piece ``kvp`` (its runs' K, then their V) that this rank's
    queries see: per run (i, query rows, key columns, the run's slice, its bias block, its key
    mask or None, K, V). The bias block and mask are dropped here before the next run's are
    made, so only one run's are alive at a time."""
    for i, run in enumerate(cs):
        vis = see(src, run)
        if vis is None:
            continue
        rows, cols, sub = vis
        bb = bias_of(src, rows, cols)
        m = None if m_src is None else m_src[..., cols].bool()
        yield i, rows, cols, sub, bb, m, kvp[i][:, :, sub], kvp[len(cs) + i][:, :, sub]
        del bb, m
