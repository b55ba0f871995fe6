"""The PyTorch chunked kernel: online softmax over query and key blocks, O(block) extra memory,
on any device (`attnkit.functional.chunked.chunked_attention` chooses it or the compiled one).

Legend: B batch, H query heads, Hkv key/value heads (G = H // Hkv queries share one kv head),
N queries, S keys, D query/key head width, Dv value head width; bq/bk block sizes, nq/nk the
sizes of the current (possibly shorter, last) block.

Follows FlashAttention-2 (Dao 2023): Algorithm 1 (forward, running max and sum per row,
rescaled accumulator) and Algorithm 2 (backward, probabilities recomputed block by block from
the saved log-sum-exp, D_i = rowsum(dO_i * O_i)). Nothing of size N×S is ever allocated.

GQA without repeating k/v: the G query heads of one kv head are stacked along the row axis,
(B, H, N, D) -> (B*Hkv, G*nq, D), so one bmm against (B*Hkv, D, nk) serves all of them.

`_Plan` (the blocking and mask geometry), `_forward` and `_backward` are also the block
computations of ring attention (`attnkit.distributed._block`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit.functional._double_backward import kernel_grads
from attnkit.functional._dropout import NO_DROPOUT, block_keep, row_ids
from attnkit.functional._mask_plan import TILE_FULL, dense_with_plan, key_blocks, with_sentinels
from attnkit.functional._runs import runs_block

_NEG_INF = float("-inf")


def _as4d(t: Tensor | None) -> Tensor | None:
    # (…, N or 1, S or 1) -> (B or 1, H or 1, N or 1, S or 1), a view
    return None if t is None else t[(None,) * (4 - t.dim())]


def _block5(t4: Tensor, i0: int, i1: int, j0: int, j1: int, hkv: int, g: int) -> Tensor:
    """Slice a broadcastable (B|1, H|1, N|1, S|1) tensor to the block, as 5-D for s5."""
    t = t4[:, :, i0:i1] if t4.shape[2] != 1 else t4
    t = t[..., j0:j1] if t4.shape[3] != 1 else t
    return _heads5(t, hkv, g)


def _heads5(t: Tensor, hkv: int, g: int) -> Tensor:
    # (Bm, H, r, c) -> (Bm, Hkv, G, r, c)  or  (Bm, 1, r, c) -> (Bm, 1, 1, r, c)
    return t.unflatten(1, (hkv, g)) if t.shape[1] != 1 else t.unsqueeze(2)


class _Workspace:
    """Block-sized scratch buffers reused across blocks.

    A fresh multi-MiB tensor per block fragments glibc's heap once its mmap threshold adapts:
    measured +40 MiB RSS in one backward at N=2048, for no live data.
    """

    def __init__(self, device: torch.device):
        self.bufs: dict[str, Tensor] = {}
        self.device = device

    def __call__(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        n = math.prod(shape)
        buf = self.bufs.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype:
            buf = self.bufs[name] = torch.empty(n, dtype=dtype, device=self.device)
        return buf[:n].view(shape)


class _Plan:
    """Sizes, blocking and mask geometry (causal, a structured mask's `MaskPlan`) shared by
    forward and backward."""

    def __init__(
        self, q: Tensor, k: Tensor, v: Tensor, causal: bool, bq: int, bk: int, structure=None
    ):
        self.b, self.h, self.n, self.d = q.shape
        self.hkv, self.s, self.dv = k.shape[1], k.shape[2], v.shape[3]
        self.g = self.h // self.hkv
        self.cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
        self.dev = q.device  # every buffer lives on the inputs' device
        self.causal, self.structure = causal, structure
        if structure is not None and structure.tiles is not None:
            bq, bk = structure.tiles.shape[1:]  # the tiles' grid
            self.tiles = with_sentinels(structure.tiles)
        self.bq, self.bk = bq, bk

    def q_blocks(self):
        for i0 in range(0, self.n, self.bq):
            yield i0, min(i0 + self.bq, self.n)

    def k_blocks(self, i0: int, i1: int):
        """Key blocks (j0, j1) of query rows i0:i1 (`_mask_plan.key_blocks`), with whether the
        causal mask cuts through them and the structured mask's booleans there
        ((B|1, H|1, nq, nk), None: no limit)."""
        off = self.s - self.n  # bottom-right alignment: query i sees keys j <= i + off
        walk = (self.structure, i0, i1, self.n, self.s, self.bq, self.bk, self.causal)
        for j0, j1, ids, col in key_blocks(*walk):
            cut = self.causal and j1 - 1 > i0 + off
            yield j0, j1, cut, self._allowed(i0, i1, j0, j1, ids, col)

    def _allowed(self, i0, i1, j0, j1, ids=None, col=0):
        """The structured mask's booleans on the block: rows' runs & the tile."""
        st, allowed = self.structure, None
        if st is None:
            return None
        if st.rows is not None:
            allowed = runs_block(st.rows[0], st.rows[1], i0, i1, j0, j1)
        if ids is not None and not bool((ids == TILE_FULL).all()):
            tile = self.tiles[ids.long()]  # (B|1, H|1, bq, bk)
            tile = tile[:, :, : i1 - i0, col : col + j1 - j0].bool()  # (B|1, H|1, nq, nk)
            allowed = tile if allowed is None else allowed & tile
        return allowed


def _scores(pl, s, i0, i1, j0, j1, cut, mask4, bias4, allowed):
    """Add bias and apply masks in place on s (B*Hkv, G*nq, nk); masked entries -> -inf."""
    s5 = s.view(pl.b, pl.hkv, pl.g, i1 - i0, j1 - j0)  # (B, Hkv, G, nq, nk)
    if bias4 is not None:
        s5.add_(_block5(bias4, i0, i1, j0, j1, pl.hkv, pl.g))
    if mask4 is not None:
        s5.masked_fill_(_block5(mask4, i0, i1, j0, j1, pl.hkv, pl.g).logical_not(), _NEG_INF)
    if allowed is not None:
        s5.masked_fill_(_heads5(allowed, pl.hkv, pl.g).logical_not(), _NEG_INF)
    if cut:
        rows = torch.arange(i0, i1, device=pl.dev).unsqueeze(1) + (pl.s - pl.n)  # (nq, 1)
        above = torch.arange(j0, j1, device=pl.dev) > rows  # (nq, nk) above the diagonal
        s5.masked_fill_(above, _NEG_INF)
    return s5


def _forward(pl, q, k, v, mask4, bias4, t_keep, seed):
    b, hkv, g, n = pl.b, pl.hkv, pl.g, pl.n
    q5 = q.view(b, hkv, g, n, pl.d)  # (B, Hkv, G, N, D)
    kt = k.to(pl.cdt).reshape(b * hkv, pl.s, pl.d).transpose(1, 2)  # (B*Hkv, D, S)
    vv = v.to(pl.cdt).reshape(b * hkv, pl.s, pl.dv)  # (B*Hkv, S, Dv)
    out = torch.zeros(b, hkv, g, n, pl.dv, dtype=pl.cdt, device=pl.dev)
    lse = torch.full((b, hkv, g, n), _NEG_INF, dtype=pl.cdt, device=pl.dev)
    ws = _Workspace(pl.dev)
    for i0, i1 in pl.q_blocks():
        nq = i1 - i0
        # pre-scaled per block (a small copy, not one of size N·D): (B*Hkv, G*nq, D)
        qb = (q5[:, :, :, i0:i1].to(pl.cdt) * pl.scale).reshape(b * hkv, g * nq, pl.d)
        like = {"dtype": pl.cdt, "device": pl.dev}
        m = torch.full((b * hkv, g * nq, 1), _NEG_INF, **like)  # running max
        l = torch.zeros(b * hkv, g * nq, 1, **like)  # running sum of exp
        acc = torch.zeros(b * hkv, g * nq, pl.dv, **like)  # unnormalised output
        rows = row_ids(b, pl.h, n, i0, i1, pl.dev) if seed is not None else None  # for dropout
        for j0, j1, cut, allowed in pl.k_blocks(i0, i1):
            nk = j1 - j0
            s = torch.bmm(qb, kt[:, :, j0:j1], out=ws("s", (b * hkv, g * nq, nk), pl.cdt))
            _scores(pl, s, i0, i1, j0, j1, cut, mask4, bias4, allowed)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            # rows with nothing visible yet keep max -inf; shift them by 0 so exp gives 0, not NaN
            m_safe = m_new.nan_to_num(neginf=0.0)
            s.sub_(m_safe).exp_()  # P~ = exp(S - m), Algorithm 1 line 10
            alpha = (m - m_safe).exp_()
            l.mul_(alpha).add_(s.sum(-1, keepdim=True))  # softmax normaliser: before dropout
            if seed is not None:  # the 2^32/T rescale is applied once, at the end
                s.mul_(block_keep(seed, rows, j0, nk, t_keep, pl.cdt, ws).view(s.shape))
            acc.mul_(alpha).baddbmm_(s, vv[:, j0:j1])
            m = m_new
        # l == 0 exactly when the row saw nothing: out 0, lse -inf (no 0/0)
        inv = torch.where(l > 0, pl.inv_keep / l, 0.0)
        out[:, :, :, i0:i1] = (acc * inv).view(b, hkv, g, nq, pl.dv)  # (B, Hkv, G, nq, Dv)
        lse[:, :, :, i0:i1] = (m.nan_to_num(neginf=0.0) + l.log()).view(b, hkv, g, nq)
    return out.view(b, pl.h, n, pl.dv), lse.view(b, pl.h, n)


def _backward(pl, q, k, v, mask4, bias4, out, lse, dout, dlse, t_keep, seed, want_dbias):
    b, hkv, g, n, s_len = pl.b, pl.hkv, pl.g, pl.n, pl.s
    cdt = pl.cdt
    kk = k.to(cdt).reshape(b * hkv, s_len, pl.d)  # (B*Hkv, S, D)
    vv = v.to(cdt).reshape(b * hkv, s_len, pl.dv)  # (B*Hkv, S, Dv)
    q5 = q.view(b, hkv, g, n, pl.d)  # (B, Hkv, G, N, D)
    do5 = dout.reshape(b, hkv, g, n, pl.dv)  # (B, Hkv, G, N, Dv); may be an expanded view
    o5 = out.view(b, hkv, g, n, pl.dv)  # (B, Hkv, G, N, Dv)
    lse4 = lse.view(b, hkv, g, n)  # (B, Hkv, G, N)
    dlse4 = dlse.view(b, hkv, g, n) if dlse is not None else None  # (B, Hkv, G, N)
    dq = torch.empty(b, hkv, g, n, pl.d, dtype=cdt, device=pl.dev)
    dk = torch.zeros(b * hkv, s_len, pl.d, dtype=cdt, device=pl.dev)
    dv = torch.zeros(b * hkv, s_len, pl.dv, dtype=cdt, device=pl.dev)
    dbias4 = torch.zeros(bias4.shape, dtype=cdt, device=pl.dev) if want_dbias else None
    ws = _Workspace(pl.dev)
    red = [i for i, e in enumerate(bias4.shape) if e == 1] if want_dbias else []
    for i0, i1 in pl.q_blocks():
        nq = i1 - i0
        rows = (b * hkv, g * nq)  # per-block copies only: nothing of size N·D is duplicated
        qb = (q5[:, :, :, i0:i1].to(cdt) * pl.scale).reshape(*rows, pl.d)  # (B*Hkv, G*nq, D)
        dob = do5[:, :, :, i0:i1].to(cdt).reshape(*rows, pl.dv)  # (B*Hkv, G*nq, Dv)
        # D_i = rowsum(dO_i * O_i), Algorithm 2 line 4; a gradient on lse adds P_ij * dlse_i
        # to dS_ij, i.e. subtracts dlse_i from D_i.
        dlt = (dob * o5[:, :, :, i0:i1].to(cdt).reshape(*rows, pl.dv)).sum(-1, keepdim=True)
        if dlse4 is not None:
            dlt -= dlse4[:, :, :, i0:i1].to(cdt).reshape(*rows, 1)
        if seed is not None:
            dob = dob * pl.inv_keep  # dropout's 2^32/T folded into dO (never in place: user's)
        # empty rows have lse -inf: shift them by 0 so that P = exp(-inf) = 0, not NaN
        neg_lse = -lse4[:, :, :, i0:i1].to(cdt).nan_to_num(neginf=0.0).reshape(*rows, 1)
        dqb = torch.zeros(b * hkv, g * nq, pl.d, dtype=cdt, device=pl.dev)
        drop_rows = row_ids(b, pl.h, n, i0, i1, pl.dev) if seed is not None else None
        for j0, j1, cut, allowed in pl.k_blocks(i0, i1):
            nk = j1 - j0
            # S - lse in the gemm's accumulator (beta = 1), then bias and masks
            blk = (b * hkv, g * nq, nk)  # (B*Hkv, G*nq, nk)
            s = torch.baddbmm(neg_lse, qb, kk[:, j0:j1].transpose(1, 2), out=ws("s", blk, cdt))
            _scores(pl, s, i0, i1, j0, j1, cut, mask4, bias4, allowed)
            p = s.exp_()  # P = exp(S - lse), Algorithm 2 line 11
            dp = torch.bmm(dob, vv[:, j0:j1].transpose(1, 2), out=ws("dp", blk, cdt))
            if seed is not None:
                keep = block_keep(seed, drop_rows, j0, nk, t_keep, cdt, ws).view(blk)
                pk = keep.mul_(p)  # P * keep, in the keep buffer (one block buffer fewer)
                dv[:, j0:j1].baddbmm_(pk.transpose(1, 2), dob)
                # dS = P * (keep * dP~ - D) = (P * keep) * dP~ - P * D, line 13 with dropout
                ds = dp.mul_(pk).sub_(p.mul_(dlt))
            else:
                dv[:, j0:j1].baddbmm_(p.transpose(1, 2), dob)
                ds = dp.sub_(dlt).mul_(p)  # dS = P * (dP - D), Algorithm 2 line 13
            if dbias4 is not None:
                ds4 = ds.view(b, pl.h, nq, nk)  # (B, H, nq, nk)
                ds4 = ds4.sum(red, keepdim=True) if red else ds4
                ri = slice(i0, i1) if bias4.shape[2] != 1 else slice(None)
                ci = slice(j0, j1) if bias4.shape[3] != 1 else slice(None)
                dbias4[:, :, ri, ci] += ds4
            dqb.baddbmm_(ds, kk[:, j0:j1])
            dk[:, j0:j1].baddbmm_(ds.transpose(1, 2), qb)
        dq[:, :, :, i0:i1] = dqb.view(b, hkv, g, nq, pl.d)  # (B, Hkv, G, nq, D)
    dq = dq.view(b, pl.h, n, pl.d).mul_(pl.scale)  # dk needs no scale: q was pre-scaled
    return dq, dk.view(k.shape), dv.view(v.shape), dbias4


class _ChunkedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, bias, causal, scale, t_keep, seed, bq, bk, structure=None):
        pl = _Plan(q, k, v, causal, bq, bk, structure)
        pl.scale, pl.inv_keep = scale, (NO_DROPOUT / t_keep if t_keep else 0.0)
        mask4, bias4 = _as4d(mask), _as4d(bias)
        out, lse = _forward(pl, q, k, v, mask4, bias4, t_keep, seed)
        # the seed is saved like a tensor (as the compiled kernel's operator does), not kept aside
        ctx.save_for_backward(q, k, v, mask, bias, out, lse, seed)
        ctx.pl, ctx.t_keep = pl, t_keep
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, mask, bias, out, lse, seed = ctx.saved_tensors
        want_dbias = bias is not None and ctx.needs_input_grad[4]
        pl = ctx.pl
        if torch.is_grad_enabled():
            # create_graph=True: the blocks' in-place arithmetic cannot be differentiated; the
            # same gradient in differentiable ops, over all of (B, H, N, S) (`_double_backward`)
            st = pl.structure
            plan = (None,) * 3 if st is None else (st.rows, st.table, st.tiles)
            whole = dense_with_plan(mask, *plan, pl.n, pl.s)
            dq, dk, dv, dbias = kernel_grads(
                q, k, v, dout, dlse, whole, bias, pl.causal, pl.scale, ctx.t_keep, pl.inv_keep,
                seed, want_dbias,
            )  # fmt: skip
            dbias = dbias.to(bias.dtype) if want_dbias else None
            return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, dbias) + (None,) * 7
        dq, dk, dv, dbias4 = _backward(
            pl, q, k, v, _as4d(mask), _as4d(bias), out, lse, dout, dlse, ctx.t_keep, seed,
            want_dbias,
        )  # fmt: skip
        dbias = dbias4.view(bias.shape).to(bias.dtype) if want_dbias else None
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, dbias) + (None,) * 7
