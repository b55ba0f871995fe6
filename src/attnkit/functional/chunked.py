"""Chunked attention: online softmax over query and key blocks, O(block) extra memory.

Legend: B batch, H query heads, Hkv key/value heads (G = H // Hkv queries share one kv head),
N queries, S keys, D query/key head width, Dv value head width; bq/bk block sizes, nq/nk the
sizes of the current (possibly shorter, last) block.

Follows FlashAttention-2 (Dao 2023): Algorithm 1 (forward, running max and sum per row,
rescaled accumulator) and Algorithm 2 (backward, probabilities recomputed block by block from
the saved log-sum-exp, D_i = rowsum(dO_i * O_i)). Nothing of size N×S is ever allocated.

GQA without repeating k/v: the G query heads of one kv head are stacked along the row axis,
(B, H, N, D) -> (B*Hkv, G*nq, D), so one bmm against (B*Hkv, D, nk) serves all of them.

This file is the PyTorch kernel. On the CPU, `chunked_attention` hands the same call to the
compiled kernel (`attnkit.functional.native`) where it is available: same function, same
dropped entries, about 2x faster with dropout.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit.functional import _chunked_mod, native
from attnkit.functional._double_backward import kernel_grads
from attnkit.functional._dropout import (
    NO_DROPOUT,
    block_keep,
    draw_seed,
    keep_threshold,
    row_ids,
)
from attnkit.functional._mask_plan import (
    TILE_FULL,
    call_plan,
    dense_with_plan,
    key_blocks,
    with_sentinels,
)
from attnkit.functional._runs import runs_block
from attnkit.functional.reordered import (
    merge_groups,
    reordered_call,
    run_reordered,
    split_groups,
)
from attnkit.functional.structured import StructuredMask

# The PyTorch kernel's blocks, tuned on the 2-core CPU (1 MiB L2 per core), N=2048, H=8, D=64,
# dropout 0.1, fwd+bwd: 128×1024 was fastest of 128×256 … 512×512 (one head's score block,
# 512 KiB, stays in L2; fewer, larger ops matter because every torch op pays dispatch and a
# thread barrier).
# Scratch is ~3 buffers of B·H·block_q·block_k floats (4 MiB each at B·H = 8).
# Causal prefers square 256×256 blocks: more of the triangle above the diagonal is skipped
# (N=2048 forward, 1 thread: 127 ms vs 269 ms with 128×1024).
# With dropout, 128×512 is as fast as 128×1024 (N=2048 fwd+bwd, 1 thread: 650 vs 695 ms, noisy)
# and halves the scratch: ~6.5 MiB at B·H = 8, 5% of the 128 MiB N×S float32 scores.
DEFAULT_BLOCK_Q = 128
DEFAULT_BLOCK_K = 1024
DROPOUT_BLOCK_K = 512
CAUSAL_BLOCK_Q = 256
CAUSAL_BLOCK_K = 256

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


def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | StructuredMask | None,
    bias: Tensor | None,
    causal: bool,
    scale: float,
    dropout_p: float,
    training: bool,
    block_q: int | None = None,
    block_k: int | None = None,
    kernel: str = "auto",
    score_mod=None,
    groups: int = 1,
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention in blocks; returns ``(out, lse)``.

    q (B, H, N, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) with H % Hkv == 0: query head h uses
    kv head h // (H // Hkv). ``mask`` is boolean, True = may attend, and ``bias`` is additive
    (may hold -inf); both broadcast to (B, H, N, S) and are only ever sliced per block.
    ``causal`` is aligned bottom-right when N != S: query i sees keys j <= i + S - N.
    A `StructuredMask` (`attnkit.masks.window`, `document`, `prefix`, ...) means its `.dense()`;
    both kernels visit only the key blocks it lets a query block see, apply no mask to full
    blocks and evaluate it inside partial ones, so time follows its density.

        S = scale * q k^T + bias, masked entries excluded;  P = softmax_j(S)
        out = dropout(P) @ v   (B, H, N, Dv), q.dtype;   lse = logsumexp_j(S)  (B, H, N)

    lse is float32 (float64 for float64 input) and differentiable, so partial results over
    key ranges can be merged. A row that may attend to nothing gets out 0, lse -inf and zero
    (finite) gradients. Dropout (only when ``training``) keeps each entry with probability
    T / 2^32, T = round(2^32 (1 - p)) clamped to [1, 2^32 - 1] (within 2^-33 of 1 - p for any
    p in (0, 1)), and rescales kept entries by 2^32 / T, so E[out] is exactly the no-dropout
    output; see ``_dropout``. float16/bfloat16
    are computed in float32. Extra memory is O(B·H·block_q·block_k) plus O(N·D) buffers.

    ``kernel``: "native" is the compiled CPU kernel (`attnkit.functional.native`), "torch" the
    PyTorch one below (any device, float64, gradients for ``bias``, chosen block sizes);
    "auto" takes the compiled one wherever `native.supports` the call and no block size is
    given. Both compute the same function and drop the same entries.

    ``score_mod(score, b, h, q_idx, kv_idx)`` (`attnkit.score_mods`) is applied to each block
    of scaled scores before ``bias`` and the masks; a call with one runs the PyTorch kernel of
    `_chunked_mod` (checkpointed query blocks, gradients through the function).

    ``groups`` = g > 1: the token axis holds g independent interleaved sequences (token t·g + r
    is position t of sequence r; N and S multiples of g), which ``mask`` (a structured mask of
    batch 1 over one sequence's N/g × S/g, or None) and ``causal`` describe; no bias, dropout
    or score function. The compiled kernel reads them in place; the PyTorch one gets them as
    rows of the batch (a copy).
    """
    if kernel not in ("auto", "native", "torch"):
        raise ValueError(f"kernel must be 'auto', 'native' or 'torch', got {kernel!r}")
    p_drop = dropout_p if training else 0.0
    t_keep, inv_keep = keep_threshold(p_drop)
    seed = draw_seed(q.device) if t_keep < NO_DROPOUT else None
    if groups > 1 and (bias is not None or score_mod is not None or t_keep < NO_DROPOUT):
        raise ValueError("chunked_attention: groups > 1 takes no bias, dropout or score_mod")
    shared = mask is None or (isinstance(mask, StructuredMask) and mask.batch == 1)
    if groups > 1 and not shared:
        got = "a tensor" if isinstance(mask, Tensor) else f"batch {mask.batch}"
        raise ValueError(
            f"chunked_attention: with groups > 1 the mask is one sequence's, shared by every "
            f"sequence and batch row (a structured mask of batch 1), got {got}"
        )
    if kernel == "native" and not native.supports(q, bias):
        raise ValueError(
            f"kernel='native' cannot run this call ({q.dtype} on {q.device}, bias needing a "
            f"gradient: {bias is not None and bias.requires_grad}, kernel built: "
            f"{native.available()})"
        )
    plain = score_mod is None  # a score function reads the positions: no reordering
    if plain and reordered_call(mask, q, k, bias, t_keep < NO_DROPOUT, causal):
        kw = dict(bias=None, scale=scale, dropout_p=0.0, training=False, block_q=block_q,
                  block_k=block_k, kernel=kernel)  # fmt: skip

        def attend(*qkv, m, causal=False, groups=1):
            return chunked_attention(*qkv, mask=m, causal=causal, groups=groups, **kw)

        return run_reordered(mask, q, k, v, attend)
    # Dv = 0: the compiled kernel's BLAS (oneMKL) prints an error line per product; the
    # PyTorch kernel gives the same empty out, lse and dropout draws, silently.
    native_fits = v.shape[-1] > 0 and native.supports(q, bias)
    on_native = kernel == "native" or (
        kernel == "auto" and block_q is None and block_k is None and native_fits
    )
    if groups > 1 and not on_native:  # the sequences as rows of the batch
        out, lse = chunked_attention(
            *(split_groups(t, groups) for t in (q, k, v)), mask=mask, bias=None, causal=causal,
            scale=scale, dropout_p=0.0, training=False, block_q=block_q, block_k=block_k,
            kernel=kernel,
        )  # fmt: skip
        return merge_groups(out, groups), merge_groups(lse, groups)
    structure = None
    if isinstance(mask, StructuredMask):
        fit = plain and on_native and block_q is None and block_k is None  # blocks fit the mask
        structure = call_plan(mask, q.device, block_q, block_k, fit)
        mask = structure.dense
    if score_mod is not None:  # the compiled kernel's built-ins, or differentiable blocks
        bq = block_q or (CAUSAL_BLOCK_Q if causal else DEFAULT_BLOCK_Q)
        bk = block_k or (CAUSAL_BLOCK_K if causal else DROPOUT_BLOCK_K)
        pl = _Plan(q, k, v, causal, bq, bk, structure)
        pl.scale, pl.inv_keep = scale, inv_keep
        fits = native_fits and kernel != "torch" and block_q is None and block_k is None
        return _chunked_mod.with_score_mod(
            pl, q, k, v, _as4d(mask), _as4d(bias), score_mod, t_keep, seed, fits, kernel
        )
    if on_native:
        return native.native_attention(
            q, k, v, mask=mask, bias=bias, causal=causal, scale=scale, keep_t=t_keep,
            inv_keep=inv_keep, seed=seed, plan=structure, groups=groups,
        )  # fmt: skip
    bq = block_q or (CAUSAL_BLOCK_Q if causal else DEFAULT_BLOCK_Q)
    bk = block_k or (
        CAUSAL_BLOCK_K if causal else (DROPOUT_BLOCK_K if p_drop > 0 else DEFAULT_BLOCK_K)
    )
    args = (causal, scale, t_keep, seed, bq, bk, structure)
    return _ChunkedAttention.apply(q, k, v, mask, bias, *args)
