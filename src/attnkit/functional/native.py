"""The compiled CPU kernel behind the chunked backend: build once, load, call.

Legend: B batch, H query heads, Hkv key/value heads, N queries, S keys, D query/key head width,
Dv value head width.

``_native/attention_cpu.cpp`` is FlashAttention-2 (forward and backward) with the mask, bias,
causal limit and dropout fused into one pass over each score block; the pure-PyTorch kernel in
`attnkit.functional.chunked` spends most of its time in the separate elementwise passes between
the matrix products. The source needs no torch headers, so the first use compiles it in about a
second with the system C++ compiler (``$CXX``, else g++/c++/clang++) and caches the library
under ``$ATTNKIT_CACHE`` (default ``~/.cache/attnkit``; a private temp folder if that cannot be
written), keyed by the source, the flags, torch's version, the compiler and this CPU's flags (it
is built with ``-march=native``); a damaged cache entry is rebuilt. It links the BLAS that
torch ships (``sgemm_`` from libtorch_cpu) and torch's OpenMP runtime, and is called through
ctypes, which releases the GIL.

If there is no compiler or the build fails, `load` warns once and returns None, and the chunked
backend stays on its PyTorch kernel (same results, same dropout bits; slower).
``ATTNKIT_NATIVE=0`` turns the kernel off.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from attnkit.functional._blocks import BACKWARD_BLOCK_K, BACKWARD_BLOCK_Q, forward_blocks
from attnkit.functional._double_backward import kernel_grads
from attnkit.functional._dropout import NO_DROPOUT
from attnkit.functional._kernel_cache import load, origin
from attnkit.functional._mask_plan import dense_with_plan
from attnkit.functional._native_args import Args, count_work, kernel_args, point_at_cotangent
from attnkit.functional._trace import tracing
from attnkit.functional.reordered import merge_groups, split_groups

__all__ = ["available", "count_work", "load", "native_attention", "origin", "supports"]

_NATIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# A fact about this machine: Dynamo runs it once when tracing (building the kernel if need be)
# and treats the answer as a constant, so a first call inside torch.compile stays one graph.
@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the compiled kernel can run here (builds it on the first call)."""
    return load() is not None


def supports(q: Tensor, bias: Tensor | None) -> bool:
    """Whether a chunked call with these inputs can run on the compiled kernel.

    CPU tensors in float32, bfloat16 or float16 (computed in float32); float64 stays on the
    PyTorch kernel, the float64 truth. A bias that needs a gradient also does: the kernel does
    not reduce dS into a broadcast bias.
    """
    if q.device.type != "cpu" or q.dtype not in _NATIVE_DTYPES:
        return False
    if bias is not None and bias.requires_grad and torch.is_grad_enabled():
        return False
    return available()


# --------------------------------------------------------------------------- the operators
#
# The kernel is two PyTorch operators, `attnkit::attention_fwd` and `attnkit::attention_bwd`,
# so that torch.compile, torch.export and opcheck see them: each has a fake (meta)
# implementation giving its output shapes, and the forward's autograd formula is the backward
# operator. They take float32 contiguous q, k, v (the Python wrapper converts, and autograd
# carries the cast); the dropout seed is a 0-d int64 tensor, read inside the operator, so that
# drawing it is an ordinary traced random op (None without dropout).
#
# In eager mode the same two functions run under a plain autograd.Function instead: a Python
# custom operator costs ~100 us of dispatch per call (measured at N=16 on the 2-core EPYC), the
# autograd.Function ~10 us. Tests pin the two routes to each other.


def _seed(seed: Tensor | None) -> int:
    return 0 if seed is None else int(seed)


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    causal: bool,
    scale: float,
    keep_t: int,
    inv_keep: float,
    seed: Tensor | None,
    rows: Tensor | None = None,
    table: Tensor | None = None,
    tiles: Tensor | None = None,
    groups: int = 1,
    qrows: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """out (B, H, N, Dv) and lse (B, H, N), float32. rows/table/tiles: a structured mask's
    `attnkit.functional._mask_plan.MaskPlan` parts (None: none). `groups`: the tokens
    interleave that many independent sequences (see `_args`), the masks being theirs.
    `qrows`: the masks' query position i is row qrows[i] of q, out and lse (`Args::qrows`)."""
    b, h, n, _ = q.shape
    out = q.new_empty(b, h, n, v.shape[3])
    lse = q.new_empty(b, h, n)
    args = (mask, bias, causal, scale, keep_t, inv_keep, _seed(seed), (rows, table, tiles))
    blocks = forward_blocks(n // groups, causal, rows is not None or table is not None)
    a = kernel_args(q, k, v, *args, blocks, groups, qrows)
    a.out, a.lse = out.data_ptr(), lse.data_ptr()
    load().attnkit_attention_forward(ctypes.byref(a))
    return out, lse


def _backward(
    dout: Tensor,
    dlse: Tensor | None,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    causal: bool,
    scale: float,
    keep_t: int,
    inv_keep: float,
    seed: Tensor | None,
    rows: Tensor | None = None,
    table: Tensor | None = None,
    tiles: Tensor | None = None,
    groups: int = 1,
    qrows: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv (float32) of the forward's out and lse."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    args = (mask, bias, causal, scale, keep_t, inv_keep, seed, rows, table, tiles, groups, qrows)
    _backward_into(dq, dk, dv, dout, dlse, q, k, v, out, lse, *args, accumulate=False)
    return dq, dk, dv


def _backward_into(
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    dout: Tensor,
    dlse: Tensor | None,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    causal: bool,
    scale: float,
    keep_t: int,
    inv_keep: float,
    seed: Tensor | None,
    rows: Tensor | None = None,
    table: Tensor | None = None,
    tiles: Tensor | None = None,
    groups: int = 1,
    qrows: Tensor | None = None,
    *,
    accumulate: bool = True,
) -> None:
    """`_backward` into the caller's tensors: dq (like q) is overwritten, dk (like k) and
    dv (like v) are ADDED to (`accumulate`, the default), or overwritten as `_backward` has
    the kernel do (it zeroes each kv head's rows in the thread that then fills them).

    For ring attention, which accumulates a key block's gradient over several query blocks
    without a temporary per call. All three must be contiguous float32 (views of larger
    tensors are fine). With dk, dv zero the numbers are `_backward`'s, bit for bit.
    """
    for name, t, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if t.shape != like.shape or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(
                f"_backward_into: {name} must be contiguous float32 of shape "
                f"{tuple(like.shape)}, got {tuple(t.shape)} {t.dtype}"
            )
    dlse = None if dlse is None else dlse.contiguous()
    args = (mask, bias, causal, scale, keep_t, inv_keep, _seed(seed), (rows, table, tiles))
    a = kernel_args(q, k, v, *args, (BACKWARD_BLOCK_Q, BACKWARD_BLOCK_K), groups, qrows, True)
    a.out, a.lse = out.data_ptr(), lse.data_ptr()
    point_at_cotangent(a, dout)
    a.dlse = None if dlse is None else dlse.data_ptr()
    a.dq, a.dk, a.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
    lib = load()
    run = lib.attnkit_attention_backward if accumulate else lib.attnkit_attention_backward_write
    run(ctypes.byref(a))


attention_fwd = torch.library.custom_op(
    "attnkit::attention_fwd", _forward, mutates_args=(), device_types="cpu"
)
attention_bwd = torch.library.custom_op(
    "attnkit::attention_bwd", _backward, mutates_args=(), device_types="cpu"
)


@attention_fwd.register_fake
def _(q, k, v, mask, bias, causal, scale, keep_t, inv_keep, seed, *plan):
    b, h, n, _ = q.shape
    return q.new_empty(b, h, n, v.shape[3]), q.new_empty(b, h, n)


@attention_bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, mask, bias, causal, scale, keep_t, inv_keep, seed, *plan):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


_OPTIONAL = (None, None, None, 1, None)  # rows, table, tiles, groups, qrows: `_forward`'s
_INPUTS = 15  # `_forward`'s arguments: 3 gradients, then None for the other 12


def _save(ctx, inputs, output) -> None:
    q, k, v, mask, bias, causal, scale, keep_t, inv_keep, seed, *rest = inputs
    rows, table, tiles, g, qrows = (*rest, *_OPTIONAL[len(rest) :])
    ctx.save_for_backward(q, k, v, *output, mask, bias, seed, rows, table, tiles, qrows)
    ctx.scalars, ctx.groups = (causal, scale, keep_t, inv_keep), g


def _grads(ctx, dout, dlse, backward) -> tuple:
    q, k, v, out, lse, mask, bias, seed, *plan, qrows = ctx.saved_tensors
    g, none = ctx.groups, (None,) * (_INPUTS - 3)
    if torch.is_grad_enabled():
        # create_graph=True: this gradient will be differentiated, and the kernel's is opaque to
        # autograd; the same gradient in differentiable torch ops (see `_double_backward`), on
        # the interleaved sequences side by side, the queries in the masks' order (`qrows`)
        q, k, v, dout, dlse = (
            None if t is None else split_groups(t, g) for t in (q, k, v, dout, dlse)
        )
        if qrows is not None:
            q, dout, dlse = (
                None if t is None else t.index_select(2, qrows) for t in (q, dout, dlse)
            )
        whole = dense_with_plan(mask, *plan, q.shape[2], k.shape[2])
        dq, dk, dv = kernel_grads(q, k, v, dout, dlse, whole, bias, *ctx.scalars, seed)[:3]
        if qrows is not None:  # back to token order: row qrows[i] is position i's
            dq = dq.index_select(2, torch.argsort(qrows))
        return (*(merge_groups(t, g) for t in (dq, dk, dv)), *none)
    if dout is None:  # only lse was used: a zero cotangent, broadcast (B, H, N, Dv)
        dout = out.new_zeros(out.shape[-1]).expand_as(out)
    scalars = (*ctx.scalars, seed, *plan, g, qrows)
    dq, dk, dv = backward(dout, dlse, q, k, v, out, lse, mask, bias, *scalars)
    return (dq, dk, dv, *none)


attention_fwd.register_autograd(
    lambda ctx, dout, dlse: _grads(ctx, dout, dlse, attention_bwd), setup_context=_save
)


class _Eager(torch.autograd.Function):
    """The operators' eager route: the same functions, without the operator dispatch."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _forward(*inputs)
        _save(ctx, inputs, output)
        ctx.set_materialize_grads(False)
        return output

    @staticmethod
    def backward(ctx, dout, dlse):
        return _grads(ctx, dout, dlse, _backward)


def native_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None,
    bias: Tensor | None,
    causal: bool,
    scale: float,
    keep_t: int,
    inv_keep: float,
    seed: Tensor | None,
    plan=None,
    groups: int = 1,
    qrows: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The chunked backend's contract (see `chunked_attention`) on the compiled kernel.

    ``keep_t``/``inv_keep``/``seed`` are the dropout threshold, rescale and per-call seed (a
    0-d int64 tensor, None without dropout) of `attnkit.functional._dropout` (keep_t = 2^32:
    no dropout). Returns out in q's dtype and lse in float32. Check `supports` first.
    ``plan``: a structured mask's `MaskPlan` (its dense part arrives as ``mask``), or None.
    ``groups``: the token axis interleaves that many independent sequences (token t·g + r is
    position t of sequence r), which ``plan`` and ``causal`` describe (no dense mask or bias).
    ``qrows``: int64 (N,), a permutation of 0..N-1 (the caller's to vouch for): query position
    i of ``mask``, ``plan`` and ``causal`` is row qrows[i] of q, out and lse (and of their
    gradients), so a mask that skips well in another order of the queries needs no gather of
    them (`reordered.run_reordered`); with ``groups`` = 1 and no dropout.
    Traced code (torch.compile, export) sees the operator `attnkit::attention_fwd`.
    """
    if qrows is not None:
        _check_qrows(qrows, q.shape[2], groups, keep_t)
    q32, k32, v32 = (t.to(torch.float32).contiguous() for t in (q, k, v))
    bias32 = None if bias is None else bias.detach().to(torch.float32)
    structure = (None, None, None) if plan is None else (plan.rows, plan.table, plan.tiles)
    inputs = (
        q32,
        k32,
        v32,
        mask,
        bias32,
        causal,
        scale,
        keep_t,
        inv_keep,
        seed,
        *structure,
        groups,
        qrows,
    )
    out, lse = attention_fwd(*inputs) if tracing() else _Eager.apply(*inputs)
    return out.to(q.dtype), lse


def _check_qrows(qrows: Tensor, n: int, groups: int, keep_t: int) -> None:
    """qrows fit the call: int64 (N,) on the CPU, contiguous, in 0..N-1 (the kernel reads and
    writes the rows it names), with one sequence and no dropout, whose bits follow the
    positions and would not be those of token order."""
    if qrows.dtype != torch.int64 or qrows.shape != (n,) or not qrows.is_contiguous():
        raise ValueError(
            f"native_attention: qrows must be contiguous int64 of shape ({n},), got "
            f"{qrows.dtype} {tuple(qrows.shape)}"
        )
    if groups != 1 or keep_t != NO_DROPOUT:
        raise ValueError(
            f"native_attention: qrows takes groups = 1 and no dropout, got groups = {groups}, "
            f"keep_t = {keep_t}"
        )
    if n and not tracing() and not (int(qrows.min()) >= 0 and int(qrows.max()) < n):
        raise ValueError(f"native_attention: qrows must lie in 0..{n - 1}")


def keep_words(seed: int | Tensor, b: int, h: int, n: int, s: int) -> Tensor:
    """The kernel's dropout words for a (B, H, N, S) call as int32 bits (tests only)."""
    lib = load()
    a = Args(B=b, H=h, N=n, S=s, seed=int(seed))
    out = torch.empty(b * h * n, s, dtype=torch.int32)
    lib.attnkit_keep_words(ctypes.byref(a), 0, b * h * n, 0, s, out.data_ptr())
    return out.view(b, h, n, s)
