"""The PyTorch chunked kernel with a score function (any device, any vectorised callable).

Legend as in `attnkit.functional.chunked`: B batch, H query heads, Hkv key/value heads
(G = H // Hkv), N queries, S keys, D / Dv head widths; bq/bk block sizes, nq/nk the current ones.

A user's score function is a black box to differentiate, so the blocks are written in
differentiable PyTorch ops (online softmax, FlashAttention-2's Algorithm 1) and each query block
runs under non-reentrant activation checkpointing (`torch.utils.checkpoint`): the forward keeps
only each block's output and lse, the backward recomputes one query block at a time
(O(B·H·bq·S) live) and autograd carries the gradient through the function into the scores and
into every tensor it closes over (a learned table, slopes), found by autograd itself, not by
inspecting the closure. Second-order gradients come the same way. Dropout draws the same bits as
the other chunked kernels (a hash of seed, row and key), so the recomputation keeps the same
entries.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attnkit.functional import score_mods
from attnkit.functional._dropout import block_keep, row_ids

_NEG_INF = float("-inf")


def _block_scores(pl, s, i0, i1, j0, j1, cut, mask4, bias4, allowed, score_mod):
    """Scores of block (B, H, nq, nk): score_mod, + bias, masks -> -inf (out of place)."""
    b, h, nq, nk = pl.b, pl.h, i1 - i0, j1 - j0
    s4 = s.view(b, h, nq, nk)  # (B*Hkv, G*nq, nk) -> (B, H, nq, nk)
    idx = score_mods.indices(b, h, i0, i1, j0, j1, pl.dev)
    s4 = score_mods.apply(score_mod, s4, *idx)
    if bias4 is not None:
        s4 = s4 + _slice(bias4, i0, i1, j0, j1).to(pl.cdt)
    keep = None if mask4 is None else _slice(mask4, i0, i1, j0, j1)
    if allowed is not None:
        keep = allowed if keep is None else keep & allowed
    if cut:
        rows = idx[2][0, 0] + (pl.s - pl.n)  # (nq, 1), bottom-right causal
        below = idx[3][0, 0] <= rows  # (nq, nk)
        keep = below if keep is None else keep & below
    if keep is not None:
        s4 = s4.masked_fill(~keep, _NEG_INF)
    return s4.reshape(b * pl.hkv, pl.g * nq, nk)  # (B*Hkv, G*nq, nk)


def _slice(t4: Tensor, i0: int, i1: int, j0: int, j1: int) -> Tensor:
    # a broadcastable (B|1, H|1, N|1, S|1) tensor cut to the block
    t = t4[:, :, i0:i1] if t4.shape[2] != 1 else t4
    return t[..., j0:j1] if t4.shape[3] != 1 else t


def _row_block(pl, i0, i1, q, k, v, mask4, bias4, score_mod, seed, t_keep):
    """Output (B, H, nq, Dv) and lse (B, H, nq) of query rows i0:i1, differentiably."""
    b, hkv, g, nq = pl.b, pl.hkv, pl.g, i1 - i0
    q5 = q.view(b, hkv, g, pl.n, pl.d)[:, :, :, i0:i1]  # (B, Hkv, G, nq, D)
    qb = (q5.to(pl.cdt) * pl.scale).reshape(b * hkv, g * nq, pl.d)  # (B*Hkv, G*nq, D)
    kt = k.to(pl.cdt).reshape(b * hkv, pl.s, pl.d).transpose(1, 2)  # (B*Hkv, D, S)
    vv = v.to(pl.cdt).reshape(b * hkv, pl.s, pl.dv)  # (B*Hkv, S, Dv)
    like = {"dtype": pl.cdt, "device": pl.dev}
    m = torch.full((b * hkv, g * nq, 1), _NEG_INF, **like)  # running max (a constant shift)
    l = torch.zeros(b * hkv, g * nq, 1, **like)  # running sum of exp
    acc = torch.zeros(b * hkv, g * nq, pl.dv, **like)  # unnormalised output
    rows = row_ids(b, pl.h, pl.n, i0, i1, pl.dev) if seed is not None else None
    for j0, j1, cut, allowed in pl.k_blocks(i0, i1):
        s = torch.bmm(qb, kt[:, :, j0:j1])  # (B*Hkv, G*nq, nk)
        s = _block_scores(pl, s, i0, i1, j0, j1, cut, mask4, bias4, allowed, score_mod)
        # the max is only a shift that cancels in out and lse: no gradient through it
        m_new = torch.maximum(m, s.detach().amax(-1, keepdim=True))
        m_safe = m_new.nan_to_num(neginf=0.0)  # rows that saw nothing yet: shift by 0
        p = torch.exp(s - m_safe)  # (B*Hkv, G*nq, nk)
        alpha = torch.exp(m - m_safe)
        l = l * alpha + p.sum(-1, keepdim=True)  # softmax normaliser: before dropout
        if seed is not None:
            p = p * block_keep(seed, rows, j0, j1 - j0, t_keep, pl.cdt).view(p.shape)
        acc = acc * alpha + torch.bmm(p, vv[:, j0:j1])
        m = m_new
    seen = l > 0  # l == 0 exactly when the row saw nothing: out 0, lse -inf, gradient 0
    l_safe = torch.where(seen, l, 1.0)
    out = acc * (pl.inv_keep / l_safe)  # acc is 0 in unseen rows
    lse = torch.where(seen, m.nan_to_num(neginf=0.0) + l_safe.log(), _NEG_INF)
    return out.view(b, pl.h, nq, pl.dv), lse.view(b, pl.h, nq)


def mod_attention(pl, q, k, v, mask4, bias4, score_mod, seed, t_keep):
    """(out (B, H, N, Dv) in q.dtype, lse (B, H, N)) with `score_mod`, query block by query
    block; `pl` is the chunked kernel's `_Plan` (sizes, blocking, structured mask walk)."""
    grads = torch.is_grad_enabled()
    outs, lses = [], []
    for i0, i1 in pl.q_blocks():
        args = (pl, i0, i1, q, k, v, mask4, bias4, score_mod, seed, t_keep)
        if grads:
            o, lse = checkpoint(_row_block, *args, use_reentrant=False, preserve_rng_state=False)
        else:
            o, lse = _row_block(*args)
        outs.append(o)
        lses.append(lse)
    out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]  # (B, H, N, Dv)
    lse = torch.cat(lses, dim=2) if len(lses) > 1 else lses[0]  # (B, H, N)
    return out.to(q.dtype), lse
