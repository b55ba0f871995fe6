"""One (query shard, key block) pair of ring attention: geometry, bias, kernels, the lse merge.

Legend: B batch, H query heads, Hkv key/value heads, n = N/P local sequence length, D head
width, Dv value width, P ranks, r this rank, src the rank whose key block is visiting;
nq/nk the rows/columns of one block (n, or n/2 for a zigzag half).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import Tensor

from attnkit.functional import chunked, native
from attnkit.functional._dropout import NO_DROPOUT

_ALL = slice(None)
PIECES = 4  # transfers per block: the double buffers hold 1 + 1/PIECES blocks, not 2
# a block whose K/V are smaller travels whole: there the pieces' per-call and per-message
# costs would outweigh the memory they save (tests set 0 to cut even tiny blocks)
MIN_PIECE_BYTES = 1 << 20


def pieces(b: int, hkv: int, want: int = PIECES) -> list[tuple[slice, slice]]:
    """(batch, key/value head) rectangles covering (B, Hkv), about ``want`` of them.

    Each is one batch row with a run of heads or a run of batch rows with every head, so
    that it is a contiguous view of a contiguous (B, Hkv, …) tensor (sent as it is) and of
    (B, H, …) query-side tensors (heads g·h0 … g·h1, G = H/Hkv). Attention is computed per
    (batch, head), so cutting the work this way changes no number.
    """
    if b >= want:
        return [(slice(b0, b1), _ALL) for b0, b1 in _split(b, want)]
    per = min(hkv, -(-want // b))  # head runs per batch row
    return [(slice(i, i + 1), slice(h0, h1)) for i in range(b) for h0, h1 in _split(hkv, per)]


def _split(n: int, k: int) -> list[tuple[int, int]]:
    cut = [n * i // k for i in range(k + 1)]
    return [(a, z) for a, z in itertools.pairwise(cut) if z > a]


def q_heads(heads: slice, g: int) -> slice:
    """The query heads (of H = G·Hkv) served by the key/value heads ``heads``."""
    return heads if heads == _ALL else slice(heads.start * g, heads.stop * g)


def part(t: Tensor | None, rows: slice, heads: slice) -> Tensor | None:
    """t[rows, heads] of a (B|1, H|1, …) tensor, leaving broadcast (size-1) dims whole."""
    if t is None:
        return None
    return t[rows if t.shape[0] > 1 else _ALL, heads if t.shape[1] > 1 else _ALL]


class Pool:
    """Free receive buffers by shape: the pieces of a block, once computed and sent on, are
    reused for the pieces that arrive, so the ring allocates its buffers once per call."""

    def __init__(self):
        self.free: dict[tuple, list[Tensor]] = {}

    def take(self, like: Tensor) -> Tensor:
        got = self.free.get((like.shape, like.dtype))
        return got.pop() if got else torch.empty_like(like, memory_format=torch.contiguous_format)

    def give(self, ts) -> None:
        for t in ts:
            self.free.setdefault((t.shape, t.dtype), []).append(t)


def _native_ok(q: Tensor, want_dbias: bool = False) -> bool:
    # the compiled kernel takes a bias but does not return its gradient
    return (
        q.device.type == "cpu"
        and q.dtype == torch.float32
        and not want_dbias
        and native.available()
    )


def _plan(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> chunked._Plan:
    bq, bk = (
        (chunked.CAUSAL_BLOCK_Q, chunked.CAUSAL_BLOCK_K)
        if causal
        else (chunked.DEFAULT_BLOCK_Q, chunked.DEFAULT_BLOCK_K)
    )
    pl = chunked._Plan(q, k, v, causal, bq, bk)
    pl.scale, pl.inv_keep = scale, 1.0  # no dropout: inv_keep only rescales 1/l
    return pl


def block_forward(q, k, v, mask, bias, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """One query block against one key block: out (B, H, nq, Dv) and lse (B, H, nq).

    q, k, v in the compute dtype (float32 or float64); mask bool (B|1, H|1, 1, nk) or None;
    bias (B|1, H|1, nq, nk) in the compute dtype or None. The compiled CPU kernel for float32
    on the CPU, the PyTorch chunked kernel elsewhere.
    """
    if _native_ok(q):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return native._forward(q, k, v, mask, bias, causal, scale, NO_DROPOUT, 1.0, None)
    pl = _plan(q, k, v, causal, scale)
    return chunked._forward(pl, q, k, v, chunked._as4d(mask), bias, NO_DROPOUT, None)


def block_backward(dout, dlse, q, k, v, out, lse, mask, bias, causal, scale, want_dbias):
    """dq, dk, dv, dbias (or None) of one block given the GLOBAL out (B, H, nq, Dv), lse (B, H, nq).

    dbias has the block bias's shape (B|1, H|1, nq, nk), summed over its broadcast dims.
    """
    if _native_ok(q, want_dbias):
        c = [t.contiguous() for t in (dout, q, k, v, out, lse)]
        dlse = None if dlse is None else dlse.contiguous()
        dq, dk, dv = native._backward(
            c[0], dlse, *c[1:], mask, bias, causal, scale, NO_DROPOUT, 1.0, None
        )
        return dq, dk, dv, None
    pl = _plan(q, k, v, causal, scale)
    return chunked._backward(
        pl, q, k, v, chunked._as4d(mask), bias, out, lse, dout, dlse, NO_DROPOUT, None, want_dbias
    )


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


def merge_into(out: Tensor, lse: Tensor, rows: slice, o_b: Tensor, l_b: Tensor) -> None:
    """out[rows], lse[rows] <- the log-sum-exp merge with a block's (o_b, l_b), in place.

    Rows that saw nothing so far or in this block have lse -inf; they are shifted by 0 so
    that exp(-inf - 0) = 0 (never -inf - -inf = NaN). o_b is consumed (scaled in place):
    the only temporaries are per row, (B, H, nq), never (B, H, nq, Dv). The same three
    roundings as wa * out + wb * o_b, so the result is bit for bit that expression's.
    """
    lo = lse[:, :, rows]  # (B, H, nq)
    new = torch.logaddexp(lo, l_b)
    safe = new.masked_fill(torch.isinf(new) & (new < 0), 0.0)
    o = out[:, :, rows]  # a view: the updates below write into out
    o.mul_((lo - safe).exp_().unsqueeze(-1))  # (B, H, nq, 1) broadcast over Dv
    o.add_(o_b.mul_((l_b - safe).exp_().unsqueeze(-1)))
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
