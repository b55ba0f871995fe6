"""Built-in score functions on the compiled CPU kernel (`attnkit.functional.native`).

Legend: B batch, H query heads, N queries, S keys, R rows of a relative-position table.

The kernel runs a score function of the form ``post(cap(pre(s)))`` (see ``struct Args`` in
``_native/attention_cpu.cpp``): at most one `softcap`, at most one `alibi` and at most one
`relative_bias`, each additive one before or after the cap. Anything else (a user's function,
two tables, slopes that want a gradient, a relative index of the user's own) runs on the PyTorch
chunked kernel (`_chunked_mod`). A relative table's index reaches the kernel as O(N + S) data,
never N×S: positions qpos (N,), kpos (S,) and a look-up table, row = lut[kpos[j] - qpos[i] + z].
For T5 the position is the token's index (the look-up table holds the bucket of every distance
the call has, computed by `relative_position_bucket` itself, so the buckets are its own); for
Swin it is y·(2M - 1) + x of the token's place (y, x) in its window, whose difference is the
table's 2-D offset.

The kernel's backward accumulates the table's gradient (dtable[row, h] += dS, per thread, then
summed); a second-order gradient recomputes the call on the PyTorch kernel in differentiable
operations (`_chunked_mod`, same dropout bits).
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


@dataclass
class NativeMod:
    """A score function as the kernel's fields; `table` is the user's (gradients go to it)."""

    softcap: float = 0.0
    slopes: Tensor | None = None  # (H,) float32
    alibi_offset: int = 0
    alibi_symmetric: bool = False
    alibi_post: bool = False
    table: Tensor | None = None  # (R, H), the user's tensor
    index: tuple[Tensor, Tensor, Tensor, int] | None = None  # qpos (N,), kpos (S,), lut, zero
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
            if part.slopes.requires_grad and torch.is_grad_enabled():
                return None  # the kernel computes no slope gradient
            nm.slopes = part.slopes.detach().to(torch.float32).contiguous()
            nm.alibi_offset, nm.alibi_symmetric, nm.alibi_post = (
                part.offset, part.symmetric, capped,
            )  # fmt: skip
        elif isinstance(part, score_mods._RelativeBias):
            nm.index = _index(part.index, n, s)
            if nm.index is None:
                return None
            nm.table, nm.rel_post = part.table, capped
        else:
            return None
    return nm


def _index(index, n: int, s: int):
    """(qpos (N,), kpos (S,), lut int32, zero) with row = lut[kpos[j] - qpos[i] + zero]."""
    if isinstance(index, score_mods._T5Buckets):
        qpos = torch.arange(n, dtype=torch.int64) + index.offset
        kpos = torch.arange(s, dtype=torch.int64)
        lo, hi = -(n - 1 + index.offset), s - 1 - index.offset  # the distances kv - q present
        lut = index(torch.zeros((), dtype=torch.int64), torch.arange(lo, hi + 1) + index.offset)
        return qpos, kpos, lut.to(torch.int32), -lo
    if isinstance(index, score_mods._WindowOffsets):
        m = index.window_size
        c = (m - 1) * (2 * m - 1) + (m - 1)  # the largest position, and the centre row

        def pos(count: int) -> Tensor:  # y·(2M - 1) + x of tokens numbered row by row
            t = torch.arange(count, dtype=torch.int64)
            return (t // m) * (2 * m - 1) + t % m

        # row = (yq - yk + M - 1)(2M - 1) + (xq - xk + M - 1) = c - (kpos - qpos)
        lut = c - torch.arange(-c, c + 1, dtype=torch.int64)
        return pos(n), pos(s), lut.to(torch.int32), c
    return None


def _fill(a, nm: NativeMod, table32: Tensor | None, grad: Tensor | None) -> None:
    a.softcap = nm.softcap
    if nm.slopes is not None:
        a.alibi, a.alibi_offset = nm.slopes.data_ptr(), nm.alibi_offset
        a.alibi_symmetric, a.alibi_post = int(nm.alibi_symmetric), int(nm.alibi_post)
    if table32 is not None:
        qpos, kpos, lut, zero = nm.index
        a.rel, a.rel_qpos, a.rel_kpos, a.rel_lut = (
            table32.data_ptr(), qpos.data_ptr(), kpos.data_ptr(), lut.data_ptr(),
        )  # fmt: skip
        a.rel_zero, a.rel_post, a.rel_rows = zero, int(nm.rel_post), table32.shape[0]
        if grad is not None:
            a.rel_grad = grad.data_ptr()


def _call(q, k, v, mask, bias, causal, scale, keep_t, inv_keep, seed, plan_parts, blocks):
    return native._args(
        q, k, v, mask, bias, causal, scale, keep_t, inv_keep, native._seed(seed), plan_parts,
        blocks,
    )  # fmt: skip


class _EagerMod(torch.autograd.Function):
    """The compiled kernel with a built-in score function: out, lse; gradients to q, k, v and
    the relative table."""

    @staticmethod
    def forward(ctx, q, k, v, table, how, mask, bias, causal, scale, keep_t, inv_keep, seed, st):
        nm, ctx.fn, ctx.plan = how
        b, h, n, _ = q.shape
        table32 = None if table is None else table.detach().to(torch.float32).contiguous()
        out, lse = q.new_empty(b, h, n, v.shape[3]), q.new_empty(b, h, n)
        call = (mask, bias, causal, scale, keep_t, inv_keep, seed, st)
        a = _call(q, k, v, *call, (FORWARD_BLOCK_Q, FORWARD_BLOCK_K))
        _fill(a, nm, table32, None)
        a.out, a.lse = out.data_ptr(), lse.data_ptr()
        load().attnkit_attention_forward(ctypes.byref(a))
        ctx.save_for_backward(q, k, v, table, out, lse, mask, bias, seed)
        ctx.nm, ctx.table32, ctx.scalars, ctx.st = (
            nm,
            table32,
            (causal, scale, keep_t, inv_keep),
            st,
        )
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, table, out, lse, mask, bias, seed = ctx.saved_tensors
        if torch.is_grad_enabled():
            return _differentiable_grads(ctx, dout, dlse)
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        dlse = None if dlse is None else dlse.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        want_table = table is not None and ctx.needs_input_grad[3]
        dtable = torch.zeros_like(ctx.table32) if want_table else None
        call = (mask, bias, *ctx.scalars, seed, ctx.st)
        a = _call(q, k, v, *call, (BACKWARD_BLOCK_Q, BACKWARD_BLOCK_K))
        _fill(a, ctx.nm, ctx.table32, dtable)
        a.out, a.lse, a.dout = out.data_ptr(), lse.data_ptr(), dout.data_ptr()
        a.dlse = None if dlse is None else dlse.data_ptr()
        a.dq, a.dk, a.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        load().attnkit_attention_backward(ctypes.byref(a))
        dtable = None if dtable is None else dtable.to(table.dtype)
        return (dq, dk, dv, dtable) + (None,) * 9


def _differentiable_grads(ctx, dout, dlse):
    """create_graph=True: the same gradients, recomputed on the PyTorch kernel in
    differentiable operations (the same function, the same dropout bits), so that they can be
    differentiated again."""
    from attnkit.functional.chunked import _with_score_mod  # it imports this module

    q, k, v, table, _, _, mask, bias, seed = ctx.saved_tensors
    causal, scale, keep_t, _ = ctx.scalars
    o2, l2 = _with_score_mod(
        q, k, v, mask, bias, causal, scale, keep_t, seed, None, None, ctx.plan, ctx.fn
    )
    inputs = [t for t in (q, k, v, table) if t is not None]
    outs = [(o, g) for o, g in ((o2, dout), (l2, dlse)) if g is not None]
    grads = torch.autograd.grad(
        [o for o, _ in outs], inputs, [g for _, g in outs], create_graph=True, allow_unused=True
    )
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, grads, strict=True)]
    return (*grads[:3], grads[3] if table is not None else None) + (None,) * 9


def native_mod_attention(q, k, v, fn, nm, *, mask, bias, causal, scale, keep_t, inv_keep, seed,
                         plan):  # fmt: skip
    """`native.native_attention` with a built-in score function `fn` (as `nm`, `plan`'s
    fields); `plan`: a structured mask's `MaskPlan` (its dense part arrives as `mask`) or None."""
    q32, k32, v32 = (t.to(torch.float32).contiguous() for t in (q, k, v))
    bias32 = None if bias is None else bias.detach().to(torch.float32)
    st = (None, None, None) if plan is None else (plan.rows, plan.table, plan.tiles)
    out, lse = _EagerMod.apply(
        q32, k32, v32, nm.table, (nm, fn, plan), mask, bias32, causal, scale, keep_t, inv_keep,
        seed, st,
    )  # fmt: skip
    return out.to(q.dtype), lse
