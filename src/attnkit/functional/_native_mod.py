"""Built-in score functions on the compiled CPU kernel (`attnkit.functional.native`).

Legend: B batch, H query heads, N queries, S keys, R rows of a relative-position table.

The kernel runs a score function of the form ``post(cap(pre(s)))`` (see ``struct Args`` in
``_native/attention_cpu.cpp``): at most one `softcap`, at most one `alibi` and at most one
`relative_bias`, each additive one before or after the cap. Anything else (a user's function,
two tables, slopes that want a gradient, a relative index of the user's own) runs on the PyTorch
chunked kernel (`_chunked_mod`).

A relative table reaches the kernel as O(H·(N + S)) data, never N×S: the table's row for query
i and key j is lut[kpos_j - qpos_i + zero], so the kernel reads vals = table[lut]ᵀ (H, L) at
kpos_j - qpos_i + zero: a contiguous slice of each head's row when the positions are the indices
(T5: the look-up table holds the bucket of every distance the call has, from
`relative_position_bucket` itself), a gather by kpos otherwise (Swin: the position of token
t = (y, x) of its window is y·(2M - 1) + x, whose difference is the table's 2-D offset). The
kernel's backward accumulates d vals (per thread, then summed) and autograd carries it through
the gather ``table[lut]`` into the table. A second-order gradient recomputes the call on the
PyTorch kernel in differentiable operations (`_chunked_mod`, same dropout bits).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.functional import native, score_mods
from attnkit.functional._blocks import (
    BACKWARD_BLOCK_K,
    BACKWARD_BLOCK_Q,
    FORWARD_BLOCK_K,
    FORWARD_BLOCK_Q,
)
from attnkit.functional._kernel_cache import load
from attnkit.functional._native_args import kernel_args, point_at_cotangent


@dataclass
class NativeMod:
    """A score function as the kernel's fields; `table` is the user's (gradients go to it)."""

    softcap: float = 0.0
    slopes: Tensor | None = None  # (H,) float32
    alibi_offset: int = 0
    alibi_symmetric: bool = False
    alibi_post: bool = False
    table: Tensor | None = None  # (R, H), the user's tensor
    lut: Tensor | None = None  # (L,) int64 rows of the table
    qpos: Tensor | None = None  # (N,) int64, None: the indices
    kpos: Tensor | None = None  # (S,) int64, None: the indices
    zero: int = 0
    rel_post: bool = False


def plan(fn, n: int, s: int) -> NativeMod | None:
    """`fn` as kernel fields for an (N, S) call, or None when the kernel cannot run it."""
    parts = fn.parts if isinstance(fn, score_mods.ScoreMod) else (fn,)
    nm, capped, seen = NativeMod(), False, set()
    for part in parts:
        kind = type(part)
        if kind in seen:  # one of each: the kernel has one slot per kind
            return None
        seen.add(kind)
        if isinstance(part, score_mods._Softcap):
            nm.softcap, capped = part.cap, True
        elif isinstance(part, score_mods._Alibi):
            if part.positions is not None or (
                part.slopes.requires_grad and torch.is_grad_enabled()
            ):
                return None  # the kernel reads no positions and computes no slope gradient
            nm.slopes = part.slopes.detach().to(torch.float32).contiguous()
            nm.alibi_offset, nm.alibi_symmetric, nm.alibi_post = (
                part.offset, part.symmetric, capped,
            )  # fmt: skip
        elif isinstance(part, score_mods._RelativeBias):
            if not _index(nm, part.index, n, s):
                return None
            nm.table, nm.rel_post = part.table, capped
        else:
            return None
    return nm


def _index(nm: NativeMod, index, n: int, s: int) -> bool:
    """Fill lut, qpos, kpos, zero (row = lut[kpos_j - qpos_i + zero]); False: not a built-in."""
    if isinstance(index, score_mods._T5Buckets):
        # positions = indices; kpos_j - qpos_i + zero runs over 0 .. N + S - 2 for zero = N - 1
        nm.lut = index(torch.zeros((), dtype=torch.int64), torch.arange(-(n - 1), s))
        nm.zero = n - 1
        return True
    if isinstance(index, score_mods._WindowOffsets):
        m = index.window_size
        c = (m - 1) * (2 * m - 1) + (m - 1)  # the largest position, and the centre row

        def pos(count: int) -> Tensor:  # y·(2M - 1) + x of tokens numbered row by row
            t = torch.arange(count, dtype=torch.int64)
            return (t // m) * (2 * m - 1) + t % m

        # row = (yq - yk + M - 1)(2M - 1) + (xq - xk + M - 1) = c - (kpos - qpos)
        nm.lut = c - torch.arange(-c, c + 1, dtype=torch.int64)
        nm.qpos, nm.kpos, nm.zero = pos(n), pos(s), c
        return True
    return False


def _as_function(nm: NativeMod, vals: Tensor | None):
    """The kernel's function in PyTorch ops, reading `vals` (H, L) as the kernel does: what a
    second-order gradient differentiates."""

    def add(score, post, h, q_idx, kv_idx):
        if nm.slopes is not None and nm.alibi_post == post:
            alibi = score_mods.alibi(
                nm.slopes, offset=nm.alibi_offset, symmetric=nm.alibi_symmetric
            )
            score = alibi(score, None, h, q_idx, kv_idx)
        if vals is not None and nm.rel_post == post:
            qp = q_idx if nm.qpos is None else nm.qpos[q_idx]
            kp = kv_idx if nm.kpos is None else nm.kpos[kv_idx]
            score = score + vals[h, kp - qp + nm.zero]
        return score

    def fn(score, b, h, q_idx, kv_idx):
        score = add(score, False, h, q_idx, kv_idx)
        if nm.softcap:
            score = torch.tanh(score / nm.softcap) * nm.softcap
        return add(score, True, h, q_idx, kv_idx)

    return fn


def _fill(a, nm: NativeMod, vals: Tensor | None, grad: Tensor | None) -> None:
    a.softcap = nm.softcap
    if nm.slopes is not None:
        a.alibi, a.alibi_offset = nm.slopes.data_ptr(), nm.alibi_offset
        a.alibi_symmetric, a.alibi_post = int(nm.alibi_symmetric), int(nm.alibi_post)
    if vals is not None:
        a.rel, a.rel_zero, a.rel_len, a.rel_post = (
            vals.data_ptr(), nm.zero, vals.shape[1], int(nm.rel_post),
        )  # fmt: skip
        a.rel_qpos = None if nm.qpos is None else nm.qpos.data_ptr()
        a.rel_kpos = None if nm.kpos is None else nm.kpos.data_ptr()
        if grad is not None:
            a.rel_grad = grad.data_ptr()


def _call(q, k, v, mask, bias, causal, scale, keep_t, inv_keep, seed, plan_parts, blocks):
    return kernel_args(
        q, k, v, mask, bias, causal, scale, keep_t, inv_keep, native._seed(seed), plan_parts,
        blocks,
    )  # fmt: skip


class _EagerMod(torch.autograd.Function):
    """The compiled kernel with a built-in score function: out, lse; gradients to q, k, v and
    the relative values vals (H, L)."""

    @staticmethod
    def forward(ctx, q, k, v, vals, how, mask, bias, causal, scale, keep_t, inv_keep, seed, plan):
        nm, ctx.recompute = how
        b, h, n, _ = q.shape
        st = (None, None, None) if plan is None else (plan.rows, plan.table, plan.tiles)
        out, lse = q.new_empty(b, h, n, v.shape[3]), q.new_empty(b, h, n)
        call = (mask, bias, causal, scale, keep_t, inv_keep, seed, st)
        a = _call(q, k, v, *call, (FORWARD_BLOCK_Q, FORWARD_BLOCK_K))
        _fill(a, nm, vals, None)
        a.out, a.lse = out.data_ptr(), lse.data_ptr()
        load().attnkit_attention_forward(ctypes.byref(a))
        ctx.save_for_backward(q, k, v, vals, out, lse, mask, bias, seed)
        ctx.nm, ctx.plan, ctx.scalars = nm, plan, (causal, scale, keep_t, inv_keep)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        if torch.is_grad_enabled():
            return _differentiable_grads(ctx, dout, dlse)
        q, k, v, vals, out, lse, mask, bias, seed = ctx.saved_tensors
        if dout is None:  # only lse was used: a zero cotangent, broadcast (B, H, N, Dv)
            dout = out.new_zeros(out.shape[-1]).expand_as(out)
        dlse = None if dlse is None else dlse.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)  # written
        dvals = torch.zeros_like(vals) if vals is not None and ctx.needs_input_grad[3] else None
        plan = ctx.plan
        st = (None, None, None) if plan is None else (plan.rows, plan.table, plan.tiles)
        a = _call(q, k, v, mask, bias, *ctx.scalars, seed, st, (BACKWARD_BLOCK_Q, BACKWARD_BLOCK_K))
        _fill(a, ctx.nm, vals, dvals)
        a.out, a.lse = out.data_ptr(), lse.data_ptr()
        point_at_cotangent(a, dout)
        a.dlse = None if dlse is None else dlse.data_ptr()
        a.dq, a.dk, a.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        load().attnkit_attention_backward_write(ctypes.byref(a))
        return (dq, dk, dv, dvals) + (None,) * 9


def _differentiable_grads(ctx, dout, dlse):
    """create_graph=True: the same gradients, recomputed on the PyTorch kernel in
    differentiable operations (the same function, the same dropout bits), so that they can be
    differentiated again."""
    q, k, v, vals, *_ = ctx.saved_tensors
    o2, l2 = ctx.recompute(q, k, v, _as_function(ctx.nm, vals))
    inputs = [t for t in (q, k, v, vals) if t is not None]
    outs = [(o, g) for o, g in ((o2, dout), (l2, dlse)) if g is not None]
    grads = torch.autograd.grad(
        [o for o, _ in outs], inputs, [g for _, g in outs], create_graph=True, allow_unused=True
    )
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, grads, strict=True)]
    return (*grads[:3], grads[3] if vals is not None else None) + (None,) * 9


def native_mod_attention(q, k, v, nm, *, mask, bias, causal, scale, keep_t, inv_keep, seed,
                         plan, recompute):  # fmt: skip
    """`native.native_attention` with a built-in score function planned as `nm`; `plan`: a
    structured mask's `MaskPlan` (its dense part arrives as `mask`) or None; `recompute(q, k, v,
    fn)`: (out, lse) in differentiable PyTorch operations, for second-order gradients."""
    q32, k32, v32 = (t.to(torch.float32).contiguous() for t in (q, k, v))
    bias32 = None if bias is None else bias.detach().to(torch.float32)
    vals = None
    if nm.table is not None:  # (R, H)[L] -> (H, L): differentiable, so the table gets d vals
        vals = nm.table[nm.lut].t().to(torch.float32).contiguous()
    how = (nm, recompute)
    out, lse = _EagerMod.apply(
        q32, k32, v32, vals, how, mask, bias32, causal, scale, keep_t, inv_keep, seed, plan
    )
    return out.to(q.dtype), lse
