"""Ring attention under a structured mask: a rank receives only the key spans its queries see.

Legend: B batch, H query heads, Hkv key/value heads (G = H/Hkv), N the full length, n = N/P,
D head width, Dv value width, P ranks, r this rank; C pieces per block (`_block.pieces`).

With a `StructuredMask` over the global sequence, every rank knows which keys of every rank
every other rank's queries may see (`_structured.Schedule`), so blocks need not be relayed
round the ring (where a rank forwards blocks it may not need itself). At step s = 1 … P-1 of
piece c, rank r sends to rank r+s the spans of its own piece c that r+s's queries may see,
and receives from r-s the spans of r-s's piece c that its own may see: both sides compute
the same spans from the description, so they agree without a message, and a span nobody on
the pair needs is neither sent, received nor waited for (a step with nothing posts nothing).
A causal window narrower than a shard thus talks to one neighbour (contiguous) or two
(zigzag), with only the keys the window reaches. For a mask that lets every query see every
rank the messages are the ring's: (P-1) blocks sent per rank and pass.

Each visited span is one kernel call on this rank's query rows that may see it (trimmed by
the row intervals) with the mask cropped to it (`Schedule.plan`: row intervals shifted to the
span's keys; masks without them evaluated block by block into tiles). Step 0 visits our own
spans. Results are merged by log-sum-exp (`_block.merge_into`) from out 0, lse -inf.

Backward: the same walk; each visited span's dK/dV go straight back to its owner (the reverse
pair of the same step, posted after the computation), and the previous step's arriving dK/dV
are added to ours after the next computation. Order: on every (sender, receiver) pair both
sides post their messages at the same points of the one (piece, step) order — the K/V of
step t+1 before computing step t, the dK/dV of step t after it — so sends and receives match
in order on any backend. Memory as the ring's: one piece's K/V in hand and one arriving, the
kernel's dK/dV of a piece sent and one arriving, the kernel's dQ of one piece's rows.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from attnkit.distributed._block import (
    Pool,
    bias_block,
    block_backward,
    block_forward,
    merge_into,
    part,
    q_heads,
    travel_pieces,
)
from attnkit.distributed._structured import GlobalMask, Schedule, check_mask
from attnkit.functional.structured import StructuredMask, causal_intervals


def _p2p(sends: list[tuple[int, Tensor]], recvs: list[tuple[int, Tensor]], group) -> list:
    """Post sends (peer, tensor) and receives (peer, buffer), peers as ranks of ``group``;
    returns the requests ([] when there is nothing to post)."""
    peer = (lambda p: p) if group is None else (lambda p: dist.get_global_rank(group, p))
    ops = [dist.P2POp(dist.isend, t, peer(p), group) for p, t in sends]
    ops += [dist.P2POp(dist.irecv, t, peer(p), group) for p, t in recvs]
    return dist.batch_isend_irecv(ops) if ops else []


def _wait(reqs) -> None:
    for r in reqs:
        r.wait()


def _own(kc: Tensor, vc: Tensor, piece, span) -> tuple[Tensor, Tensor]:
    """Our K and V of a span of a piece (views of the inputs)."""
    bs, hs, cs = piece
    return kc[bs, hs, cs[span.i]][:, :, span.sub], vc[bs, hs, cs[span.i]][:, :, span.sub]


def _rows(t: Tensor | None, bs: slice, hq: slice, rows: slice) -> Tensor | None:
    return None if t is None else t[bs, hq][:, :, rows]


def _walk(kc: Tensor, vc: Tensor, sched: Schedule, pool: Pool, group):
    """Yields (c, s, [(span, K, V)]) for every piece c and step s = 0 … P-1 in that order: the
    spans of rank r-s's piece c that our queries may see, with their K and V (ours at s = 0,
    received buffers otherwise, returned to ``pool`` after the yield). The transfer of the
    next (c, s) is posted before a yield and waited on after it."""
    rank, world, parts = sched.rank, sched.world, sched.parts
    order = [(c, s) for c in range(len(parts)) for s in range(world)]

    def own(c, sp):
        return _own(kc, vc, parts[c], sp)

    def start(c, s):
        dst, src = (rank + s) % world, (rank - s) % world
        sends = [x.contiguous() for sp in sched.spans(dst, rank, c) for x in own(c, sp)]
        got = sched.spans(rank, src, c)
        bufs = [pool.take(x) for sp in got for x in own(c, sp)]  # K, V, K, V …
        reqs = _p2p([(dst, t) for t in sends], [(src, b) for b in bufs], group)
        return reqs, sends, got, bufs

    flight = None
    for t, (c, s) in enumerate(order):
        nxt = order[t + 1] if t + 1 < len(order) else None
        coming = start(*nxt) if nxt is not None and nxt[1] > 0 else None
        if s == 0:
            yield c, s, [(sp, *own(c, sp)) for sp in sched.spans(rank, rank, c)]
        else:
            _, _, got, bufs = flight
            yield c, s, [(sp, bufs[2 * j], bufs[2 * j + 1]) for j, sp in enumerate(got)]
            pool.give(bufs)
        if coming is not None:
            _wait(coming[0])
        flight = coming


class _StructuredRing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, gmask, bias_fn, scale, layout, group, rank, world):
        cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
        qc, kc, vc = (t.to(cdt).contiguous() for t in (q, k, v))
        b, h, n, _ = q.shape
        g, parts = h // k.shape[1], travel_pieces(kc, vc, world, halves=layout == "zigzag")
        sched = Schedule(gmask, parts, rank, world, layout, n, g)
        out = q.new_zeros(b, h, n, v.shape[3], dtype=cdt)
        lse = q.new_full((b, h, n), float("-inf"), dtype=torch.float64)  # merged in float64
        for c, s, visits in _walk(kc, vc, sched, Pool(), group):
            bs, hs, _ = parts[c]
            hq, src = q_heads(hs, g), (rank - s) % world
            for sp, k_b, v_b in visits:
                rows = sched.rows(sp, bs)
                if rows.start >= rows.stop:
                    continue
                mp = sched.plan(rows, sp, bs, hq)
                bb = bias_block(bias, bias_fn, sched.pos[rank], sched.pos[src], rows, sp.cols, cdt)
                o_b, l_b = block_forward(
                    qc[bs, hq][:, :, rows], k_b, v_b, mp.dense, part(bb, bs, hq), False, scale, mp
                )
                merge_into(out[bs, hq], lse[bs, hq], rows, o_b, l_b)
                del o_b, l_b, bb, mp
        lse = lse.to(cdt)
        ctx.save_for_backward(qc, kc, vc, bias, out, lse)
        ctx.args = (sched, bias_fn, scale, group, q.dtype, k.dtype, v.dtype)
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        qc, kc, vc, bias, out, lse = ctx.saved_tensors
        sched, bias_fn, scale, group, qdt, kdt, vdt = ctx.args
        rank, world, parts, g, cdt = sched.rank, sched.world, sched.parts, sched.g, qc.dtype
        want_dbias = bias is not None and ctx.needs_input_grad[3]
        dbias = torch.zeros(bias.shape, dtype=cdt, device=bias.device) if want_dbias else None
        dout = dout.to(cdt)
        dlse = None if dlse is None else dlse.to(cdt)
        dq, dk, dv = torch.zeros_like(qc), torch.zeros_like(kc), torch.zeros_like(vc)
        pool, pending = Pool(), None

        def bias_of(src, rows, cols):
            return bias_block(bias, bias_fn, sched.pos[rank], sched.pos[src], rows, cols, cdt)

        def add_home(c, spans, grads):  # dK, dV of spans of our piece c, alternating
            for j, sp in enumerate(spans):
                gk, gv = _own(dk, dv, parts[c], sp)
                gk += grads[2 * j]
                gv += grads[2 * j + 1]

        def settle(hop):  # a dK/dV exchange posted after an earlier step: ours arrives
            reqs, _sent, c, spans, bufs = hop
            _wait(reqs)
            add_home(c, spans, bufs)
            pool.give(bufs)

        for c, s, visits in _walk(kc, vc, sched, pool, group):
            bs, hs, _ = parts[c]
            hq, src = q_heads(hs, g), (rank - s) % world
            grads = []  # per visited span its dK, dV, in the order the owner expects them
            for sp, k_b, v_b in visits:
                rows = sched.rows(sp, bs)
                if rows.start >= rows.stop:  # the owner expects a dK, dV per span it sent
                    grads += [torch.zeros_like(k_b), torch.zeros_like(v_b)]
                    continue
                mp = sched.plan(rows, sp, bs, hq)
                bb = part(bias_of(src, rows, sp.cols), bs, hq)
                sl = [_rows(t, bs, hq, rows) for t in (dout, dlse, qc, out, lse)]
                gq, gk, gv, gb = block_backward(
                    *sl[:3], k_b, v_b, *sl[3:], mp.dense, bb, False, scale, want_dbias, plan=mp
                )
                dq[bs, hq][:, :, rows] += gq
                if want_dbias:  # (B|1, H|1, nq, nk) into src's key columns
                    part(dbias, bs, hq)[:, :, rows].index_add_(3, sched.pos[src][sp.cols], gb)
                grads += [gk.contiguous(), gv.contiguous()]
                del gq, gk, gv, gb, bb, mp, sl
            if s == 0:
                add_home(c, [sp for sp, _, _ in visits], grads)
                continue
            # ours go straight back to src; what rank r+s computed for our piece c arrives
            dst = (rank + s) % world
            mine = sched.spans(dst, rank, c)
            bufs = [pool.take(x) for sp in mine for x in _own(kc, vc, parts[c], sp)]
            reqs = _p2p([(src, t) for t in grads], [(dst, b) for b in bufs], group)
            if pending is not None:
                settle(pending)
            pending = (reqs, grads, c, mine, bufs)
            del grads
        if pending is not None:
            settle(pending)
        dbias = dbias.to(bias.dtype) if want_dbias else None
        return (dq.to(qdt), dk.to(kdt), dv.to(vdt), dbias) + (None,) * 7


def structured_ring(
    q, k, v, mask: StructuredMask, bias, bias_fn, causal: bool, scale: float, layout: str, group,
    rank: int, world: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """`ring_attention` with a structured ``mask`` over the whole sequence (B|1, H|1, N, N):
    (out, lse) of this rank's queries."""
    b, h, n, _ = q.shape
    check_mask(mask, b, h, n * world, "ring_attention")
    if causal:
        mask = mask & causal_intervals(n * world, device=q.device)
    gmask = GlobalMask(mask, q.device)
    args = (gmask, bias_fn, scale, layout, group, rank, world)
    return _StructuredRing.apply(q, k, v, bias, *args)
