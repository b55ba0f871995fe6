"""Ring attention: exact attention over a sequence split across the ranks of a process group.

Legend: B batch, H query heads, Hkv key/value heads, n = N/P local sequence length, D head
width, Dv value width, P ranks, r this rank.

Each rank keeps its queries; the key/value blocks travel around the ring r -> r+1 with
non-blocking send/recv, started before the computation they should hide (Liu et al. 2023,
"Ring Attention with Blockwise Transformers"). The ring runs piece by piece: a block of
128 KiB or more of K + V is cut into up to 16 pieces (`_block.pieces`: runs of batch rows or
heads, or, with fewer than 16 (batch row, head) pairs, runs of key positions of each; for
a causal zigzag ring the same run of both chunks, so every rank works in every piece), and
the loops are ``for piece: for step:``, so that only one piece of K/V and of the dK/dV
accumulators travels at a time, ~1/C of a block. Attention is per (batch row, head), and a
run of keys is a smaller key block (merged by lse; its dK/dV depend on it alone; dQ adds),
so the pieces change results only by rounding. A rank's own block (the causal diagonal) is
computed whole, once per (batch, head) rectangle. Partial results are merged by
log-sum-exp (lse merged in float64 for float32, see `merge_into`):

    lse = logaddexp_i lse_i,   out = sum_i exp(lse_i - lse) out_i

The backward pass is FlashAttention-2's Algorithm 2 restricted to one key block at a time:
given the GLOBAL (merged) out and lse, P_ij = exp(S_ij - lse_i) and D_i = rowsum(dO_i * O_i)
are exact, so each block's dq/dk/dv contributions are exact and simply add. dq stays home
(the own block's kernel writes it, and adds into dK/dV, in place); the dk/dv accumulator of
a piece travels around the ring behind its K/V piece and arrives back at the owner after P-1
hops. Peak live tensors of a step, in units of one (B, H, n, D) tensor: 5 at P=1 (out, dout,
dq, dk, dv); a ring adds one piece's K/V, accumulators and kernel results (~10/C) and one
(batch row, head)'s dq from the kernel: 5.9 at P=2 and P=4 with B=1, H=4 (was 8.7
and 10.7 with whole-block steps; asserted in tests/distributed).

Causal geometry per (query shard r, key shard src): contiguous: src < r full, src == r causal,
src > r skipped. Zigzag (rank r holds chunks r and 2P-1-r): src == r causal; src < r all queries
against the first (early) half of the keys; src > r the second (late) half of the queries
against all keys; every other pair is fully masked. All non-skipped non-diagonal blocks are
non-causal, and every rank does the same work.

Structured masks (a `StructuredMask` over the whole sequence) take another schedule, in
`_structured_ring`: a rank receives only the key spans its queries may see, straight from
their owners, and skips the rest without waiting.

Bias: the block of an additive bias for (my queries, src's keys) is cut from this rank's
rows of a tensor bias by src's global positions, or computed by ``bias_fn`` from both sides'
global positions; it never travels. Its gradient is the block's dS (Algorithm 2 line 13),
scattered back into the same columns, on this rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from attnkit.distributed._block import (
    _ALL,
    BiasFn,
    Pool,
    block_backward,
    block_forward,
    check_bias,
    gather_masks,
    merge_into,
    part,
    position_cache,
    q_heads,
    travel_pieces,
    visit_fns,
    visits,
)
from attnkit.distributed._structured_ring import structured_ring
from attnkit.distributed.layout import check_layout
from attnkit.functional.attention import AttentionOutput
from attnkit.functional.structured import StructuredMask

__all__ = ["ring_attention"]


# --------------------------------------------------------------------------- the ring


def group_info(group) -> tuple[int, int]:
    """(rank, world) in ``group``; (0, 1) when torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _peer(group, local: int) -> int:
    return local if group is None else dist.get_global_rank(group, local)


def exchange(send: list[Tensor], recv: list[Tensor], group, rank: int, world: int):
    """Start sending ``send`` to rank+1 and receiving ``recv`` from rank-1; returns the requests."""
    nxt, prv = _peer(group, (rank + 1) % world), _peer(group, (rank - 1) % world)
    ops = [dist.P2POp(dist.isend, t, nxt, group) for t in send]
    ops += [dist.P2POp(dist.irecv, t, prv, group) for t in recv]
    return dist.batch_isend_irecv(ops)


def _wait(reqs) -> None:
    for r in reqs:
        r.wait()


def _kv_ring(own: list[list[Tensor]], pool: Pool, group, rank: int, world: int):
    """Yields (c, step, piece c of the block in hand: its K runs, then its V runs),
    piece-outer: for each piece c, steps 0 … P-1 (our own piece, then rank-1's, …).

    Before a piece is yielded (computed by the caller) the transfer that brings the piece of
    the next step is in flight: it forwards the piece in hand to rank+1, or during a piece's
    last step (when nothing is forwarded) it starts the next piece's first hop, so that a
    step 0 that computes nothing (`_first`) waits on nothing. It is waited on after the
    yield, and received buffers go back to ``pool`` once forwarded (our own pieces are views
    of the inputs: kept). So a rank holds two K/V pieces at a time, whatever P is.
    """

    def start(kvp):
        recv = [pool.take(t) for t in kvp]
        return exchange(list(kvp), recv, group, rank, world), recv

    flight = start(own[0]) if world > 1 else None
    for c, kvp in enumerate(own):
        for step in range(world):
            last = step == world - 1
            if 0 < step < world - 1:
                flight = start(kvp)
            elif step > 0 and c + 1 < len(own):
                flight = start(own[c + 1])
            yield c, step, kvp
            if not last:
                _wait(flight[0])
            if step > 0:
                pool.give(kvp)  # forwarded (the wait above), or at the last step not at all
            if not last:
                kvp = flight[1]


def _first(cs: tuple[slice, ...]) -> bool:
    """Whether a piece holds the first key run of its (batch, head) rectangle: that piece's
    step 0 computes the rectangle's own (diagonal) block whole, never cut by key runs."""
    return not cs[0].start


def _pieces(kc: Tensor, vc: Tensor, world: int, layout: str, causal: bool):
    """The pieces (`_block.travel_pieces`; pairs of key runs for a causal zigzag ring, whose
    ranks then do the same work per piece) and ours: per piece its K runs, then its V runs."""
    parts = travel_pieces(kc, vc, world, halves=causal and layout == "zigzag")
    own = [[kc[bs, hs, c] for c in cs] + [vc[bs, hs, c] for c in cs] for bs, hs, cs in parts]
    return parts, own


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, bias, bias_fn, causal, scale, layout, group):
        rank, world = group_info(group)
        cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
        qc, kc, vc = (t.to(cdt).contiguous() for t in (q, k, v))
        b, h, n, _ = q.shape
        g, (parts, own) = h // k.shape[1], _pieces(kc, vc, world, layout, causal)
        pos = position_cache(n, rank, world, layout, q.device)
        masks = gather_masks(mask, group, world)
        see, bias_of = visit_fns(bias, bias_fn, pos, rank, world, layout, causal, n, cdt)
        out = lse = None
        for c, step, kvp in _kv_ring(own, Pool(), group, rank, world):
            bs, hs, cs = parts[c]
            hq, src = q_heads(hs, g), (rank - step) % world
            m_src = None if masks is None else part(masks[src], bs, hq)
            if step == 0:  # our own block (the causal diagonal), every row: no merge
                if not _first(cs):
                    continue
                bb = bias_of(rank, _ALL, _ALL)
                m = None if m_src is None else m_src.bool()
                o_b, l_b = block_forward(
                    qc[bs, hq], kc[bs, hs], vc[bs, hs], m, part(bb, bs, hq), causal, scale
                )
                if len(parts) == 1:  # the whole block: the kernel's results are ours
                    out, lse = o_b, l_b
                    continue
                if out is None:  # lse merged in float64: 2/D of a unit buys float32's error
                    out = q.new_empty(b, h, n, v.shape[3], dtype=cdt)
                    lse = q.new_empty(b, h, n, dtype=torch.float64)
                out[bs, hq], lse[bs, hq] = o_b, l_b
                continue
            for _, rows, _, _, bb, m, k_b, v_b in visits(kvp, cs, m_src, src, see, bias_of):
                o_b, l_b = block_forward(
                    qc[bs, hq][:, :, rows], k_b, v_b, m, part(bb, bs, hq), False, scale
                )
                merge_into(out[bs, hq], lse[bs, hq], rows, o_b, l_b)
                del o_b, l_b, bb, m
        lse = lse.to(cdt)
        ctx.save_for_backward(qc, kc, vc, mask, bias, out, lse)
        ctx.args = (bias_fn, causal, scale, layout, group, q.dtype, k.dtype, v.dtype)
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        qc, kc, vc, mask, bias, out, lse = ctx.saved_tensors
        bias_fn, causal, scale, layout, group, qdt, kdt, vdt = ctx.args
        rank, world = group_info(group)
        cdt, (h, n) = qc.dtype, qc.shape[1:3]
        g, (parts, own) = h // kc.shape[1], _pieces(kc, vc, world, layout, causal)
        pos = position_cache(n, rank, world, layout, qc.device)
        masks = gather_masks(mask, group, world)
        see, bias_of = visit_fns(bias, bias_fn, pos, rank, world, layout, causal, n, cdt)
        want_dbias = bias is not None and ctx.needs_input_grad[4]
        # this rank's query rows against every key: the gradient never leaves the rank
        dbias = torch.zeros(bias.shape, dtype=cdt, device=bias.device) if want_dbias else None
        dout = dout.to(cdt)
        dlse = None if dlse is None else dlse.to(cdt)
        # the own blocks' kernels write dq and add into dk, dv (`block_backward`'s into=)
        dq, dk_own, dv_own = torch.empty_like(qc), torch.zeros_like(kc), torch.zeros_like(vc)
        pool, moving, home = Pool(), None, None

        def grads(bs, hq, rows, k_b, v_b, m, bb, cz, into=None):
            sl = lambda t: t[bs, hq][:, :, rows]  # noqa: E731
            return block_backward(
                sl(dout), None if dlse is None else sl(dlse), sl(qc), k_b, v_b, sl(out),
                sl(lse), m, part(bb, bs, hq), cz, scale, want_dbias, into,
            )  # fmt: skip

        def arrive(hop):
            # a dK/dV transfer started earlier: its send is done (the buffer is free again)
            # and what it received is the accumulator for our next step, or after the last
            # hop everyone else's share of a piece of our own block
            reqs, sent, recv = hop
            _wait(reqs)
            pool.give(sent)
            return recv

        def settle_home():
            # our own piece's accumulator, started home during the previous piece's last
            # step, waited on after a computation of this piece (or at the very end)
            nonlocal home
            hc, hop = home
            acc, home = arrive(hop), None
            bs, hs, cs = parts[hc]
            for i, run in enumerate(cs):  # acc: the runs' dK, then their dV
                dk_own[bs, hs, run] += acc[i]
                dv_own[bs, hs, run] += acc[len(cs) + i]
            pool.give(acc)

        for c, step, kvp in _kv_ring(own, pool, group, rank, world):
            bs, hs, cs = parts[c]
            hq, src = q_heads(hs, g), (rank - step) % world
            m_src = None if masks is None else part(masks[src], bs, hq)
            if step == 0:
                if _first(cs):  # our own block (the causal diagonal) whole, in place
                    bb = bias_of(rank, _ALL, _ALL)
                    m = None if m_src is None else m_src.bool()
                    into = (dq[bs, hq], dk_own[bs, hs], dv_own[bs, hs])
                    *_, gb = grads(bs, hq, _ALL, kc[bs, hs], vc[bs, hs], m, bb, causal, into)
                    if want_dbias:
                        part(dbias, bs, hq).index_add_(3, pos(rank), gb)
                    del bb, m, gb
                continue
            gkv = []  # (run, its columns in the piece, dk, dv)
            for i, rows, cols, sub, bb, m, k_b, v_b in visits(kvp, cs, m_src, src, see, bias_of):
                gq, gk, gv, gb = grads(bs, hq, rows, k_b, v_b, m, bb, False)
                dq[bs, hq][:, :, rows] += gq
                if want_dbias:  # (B|1, H|1, nq, nk) into src's key columns
                    part(dbias, bs, hq)[:, :, rows].index_add_(3, pos(src)[cols], gb)
                gkv.append((i, sub, gk, gv))
                del gq, gk, gv, gb, bb, m
            if home is not None:  # the previous piece's accumulator, back at its owner
                settle_home()
            # src's accumulator for this piece starts here (step 1) or arrives from rank-1,
            # gains ours and moves on: P-1 hops, the reduce-scatter's minimum
            acc = [pool.take(t).zero_() for t in kvp] if step == 1 else arrive(moving)
            for i, sub, gk, gv in gkv:
                acc[i][:, :, sub] += gk
                acc[len(cs) + i][:, :, sub] += gv
            del gkv
            recv = [pool.take(t) for t in acc]
            moving = (exchange(acc, recv, group, rank, world), acc, recv)
            if step + 1 == world:  # it goes home; ours arrives, added during the next piece
                home, moving = (c, moving), None
        if home is not None:
            settle_home()
        dbias = dbias.to(bias.dtype) if want_dbias else None
        return (dq.to(qdt), dk_own.to(kdt), dv_own.to(vdt), None, dbias) + (None,) * 5


def check_inputs(q, k, v, mask, name: str = "ring_attention") -> None:
    """ValueErrors naming the argument, for the shard shapes the strategies accept."""
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name}: {arg} must have shape (B, H, N/P, D), got {got}")
    b, h, n, d = q.shape
    if k.shape[0] != b or k.shape[3] != d or h % k.shape[1] or k.shape[2] != n:
        raise ValueError(
            f"{name}: k must have shape (B={b}, Hkv dividing {h}, N/P={n}, D={d}) "
            f"(self-attention shards), got {tuple(k.shape)}"
        )
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"{name}: v must have shape {tuple(k.shape[:3])} + (Dv,), got {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise ValueError(
            f"{name}: q, k, v must share one float dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if mask is not None:
        ok = isinstance(mask, Tensor) and mask.dtype == torch.bool and mask.dim() == 4
        ok = ok and mask.shape[0] in (1, b) and mask.shape[1] in (1, h) and mask.shape[2] == 1
        if not ok or mask.shape[3] != n:
            got = (tuple(mask.shape), mask.dtype) if isinstance(mask, Tensor) else type(mask)
            raise ValueError(
                f"{name}: mask must be a boolean key-padding mask of this rank's keys, shape "
                f"(B|1, H|1, 1, N/P={n}) with True = may attend, got {got}"
            )


def check_dropout(dropout_p, name: str) -> None:
    """Attention dropout is refused, not approximated: see the module docstrings."""
    if dropout_p != 0:
        raise ValueError(
            f"{name}: dropout_p must be 0, got {dropout_p!r}: attention dropout across ranks "
            "is not supported (no single-process run draws the same keep pattern, so it could "
            "not be checked); put dropout outside attention (on the residual branch) instead"
        )


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    mask: Tensor | StructuredMask | None = None,
    bias: Tensor | None = None,
    bias_fn: BiasFn | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    group=None,
    layout: str = "contiguous",
) -> AttentionOutput:
    """Exact self-attention over a sequence sharded across the ranks of ``group``.

    Args:
        q: this rank's queries (B, H, N/P, D), in ``layout`` (see `attnkit.distributed.layout`).
        k, v: this rank's keys (B, Hkv, N/P, D) and values (B, Hkv, N/P, Dv), same positions
            as q; H % Hkv == 0 (grouped-query attention without repeating k/v).
        causal: global position i sees keys j <= i (N = S, so no alignment question).
        mask: boolean key-padding mask of this rank's keys (B|1, H|1, 1, N/P), True = may
            attend; it travels around the ring with its keys. Or a structured mask
            (`attnkit.masks.window`, `document`, `prefix`, `from_function`, their ``&``/``|``)
            over the WHOLE sequence, (B|1, H|1, N, N) in global positions, the same on every
            rank, meaning its ``.dense()`` (ANDed with ``causal``): then each rank receives
            only the key spans its queries may see, straight from their owners, and skips
            the rest without waiting (`attnkit.distributed._structured_ring`); fold a key
            padding mask in with ``&`` (a (B, 1, 1, N) boolean tensor).
        bias: additive float bias (B|1, H|1, N/P, N): this rank's query rows (in its shard's
            order) against ALL N keys in global position order (what
            ``bias_full[:, :, positions(N, rank, P, layout)]`` gives), may hold -inf. The
            columns of the visiting key block are sliced out of it. Differentiable: its
            gradient is exact and stays on this rank. It costs N/P x N per (B|1, H|1), so
            it is for moderate N or learned biases.
        bias_fn: the long-sequence form: ``bias_fn(q_pos, k_pos)`` with the global positions
            (nq,), (nk,) (int64) of one block returns its bias (B|1, H|1, nq, nk), so no rank
            ever holds N columns; ALiBi (``-slope_h * (q_pos[:, None] - k_pos)``) and T5
            buckets of ``k_pos - q_pos`` are the uses. It is called once per piece of a
            block (a run of key positions) in the forward and again in the backward, and
            is a constant: a result that requires grad is a ValueError (pass a learned
            bias as ``bias``). Not with ``bias``.
        scale: multiplies q·kᵀ; defaults to 1/sqrt(D).
        dropout_p: must be 0 (ValueError otherwise). Attention dropout is refused rather than
            approximated: no single-process reference draws the same keep pattern.
        group: the process group (default the world); without an initialised process group
            the call is single-process attention.
        layout: "contiguous" or "zigzag" (balances causal work).

    Returns AttentionOutput(out (B, H, N/P, Dv) in q's dtype, None, lse (B, H, N/P) in float32,
    or float64 for float64 input). out and lse are differentiable; gradients for q, k, v are
    this rank's shards. A query that may attend to nothing (mask, causal and -inf bias
    together) gets out 0, lse -inf, gradient 0. Every rank must call with the same shapes,
    flags and layout.
    """
    check_layout(layout)
    structured = isinstance(mask, StructuredMask)
    check_inputs(q, k, v, None if structured else mask)
    check_dropout(dropout_p, "ring_attention")
    rank, world = group_info(group)
    check_bias(bias, bias_fn, q, q.shape[2] * world, "ring_attention")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if layout == "zigzag" and q.shape[2] % 2:
        raise ValueError(
            f"ring_attention: layout='zigzag' needs an even local length (two chunks), "
            f"got N/P={q.shape[2]}"
        )
    if structured:
        args = (mask, bias, bias_fn, bool(causal), scale, layout, group, rank, world)
        out, lse = structured_ring(q, k, v, *args)
    else:
        args = (mask, bias, bias_fn, bool(causal), scale, layout, group)
        out, lse = _RingAttention.apply(q, k, v, *args)
    return AttentionOutput(out, None, lse)
