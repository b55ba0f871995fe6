"""`attention`'s short path for calls that run SDPA unmasked (the decode step, a small model),
and rule 1 of its non-finite contract, which both routes keep.

Legend: B batch, H query heads, Hkv key/value heads, N queries, S keys, D head width, Dv value
head width.

At N ≤ 64 the fixed cost of a call is the time: SDPA itself takes ~19 µs at N = S = 16
(B=1, H=8, D=64, float32, 1 thread, AMD EPYC Zen 4), and the full route's checks, backend
choice and result building cost ~60 % more. `plain_call` decides with plain attribute reads
and int comparisons that the call is valid and of this kind, formats no message and builds no
object, then calls SDPA as the full route would (`_sdpa_backend.fused`): the same kernel, the same
result bit for bit. Anything else (and every call it cannot prove valid) goes to the full
route, whose checks raise the errors with their messages. What the call costs beyond SDPA
(benchmarks/results/small-calls.md), measured by taking each piece out in turn: the check of
q that rule 1 needs (~1 µs at N=16 where the compiled kernel is loaded: its scan of q's
exponent bits through ctypes, `_finite_scan.finite_check`; else one sum of q, ~2.6 µs, since no
torch, numpy or BLAS reduction read from Python costs less than ~2 µs), these checks
(~1.2 µs), `attention`'s own call (~0.4 µs) and, with a graph recorded, the second-order hook
(~2 µs, `_double_backward`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.functional._choose import NATIVE_BF16
from attnkit.functional._double_backward import hook_fused_node
from attnkit.functional._finite_scan import FINITE_CODES, FINITE_MAX_NUMEL, finite_check
from attnkit.functional._reference import _eager_cpu
from attnkit.functional._trace import tracing

__all__ = ["default_scale", "plain_call", "row_poison", "surely_finite"]

# the dtypes SDPA computes in; q, k, v of another dtype take the full route (and its checks)
_SDPA_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))
_isfinite = math.isfinite


def plain_call(q, k, v, causal, scale, p, training, backend: str, override) -> Tensor | None:
    """SDPA's output for an `attention` call with no mask, bias, score_mod, weights or dropout
    in force (`p` applies only when `training`) that the full route would run on SDPA unmasked,
    in eager mode; None for any other call. `override` is what `use_backend` set.

    Causal with N == 1 is the unmasked call (bottom-right: the one query sees every key);
    causal with 1 < N != S takes the full route (SDPA's is_causal is top-left). Never under
    tracing: compiled and exported graphs keep the full route's one fixed choice.
    """
    if p and (training or type(p) is not float or not 0.0 < p < 1.0):
        return None  # dropout in force, or a dropout_p for `_validate` to judge
    if backend != "fused" and (backend != "auto" or override not in (None, "fused")):
        return None
    if not (type(q) is type(k) is type(v) is Tensor) or tracing():
        return None  # subclasses (Parameter, FakeTensor...) and traces: the full route
    try:
        (b, h, n, d), (kb, hkv, s, kd), (vb, vh, vs, dv) = q.shape, k.shape, v.shape
    except ValueError:  # not 4-D
        return None
    if not (b and h and n and d and hkv and s and dv):
        return None  # an empty axis: `attention._no_work`
    if kb != b or vb != b or kd != d or vh != hkv or vs != s or h % hkv:
        return None
    if causal and n != s and n != 1:
        return None
    dtype = q.dtype
    if dtype not in _SDPA_DTYPES:
        return None
    if scale is not None and (
        type(scale) not in (float, int) or not _isfinite(scale) or (causal and scale <= 0)
    ):
        return None  # SDPA's is_causal gives NaN rows for a scale <= 0 (see `_sdpa_backend.fused`)
    if dtype is torch.bfloat16 and not NATIVE_BF16 and backend == "auto" and _grad(q, k, v):
        return None  # auto takes chunked here (see `_choose.choose_backend`)
    try:
        out = _sdpa(q, k, v, (n != 1) if causal else False, scale, hkv != h)
    except RuntimeError:  # k or v of another dtype or device than q (SDPA checks them)
        return None  # the full route says so, in its words
    if out.requires_grad:  # a graph is recorded
        hook_fused_node(out)
    if q.is_cpu and _all_finite(q, dtype, b * h * n * d):  # eager, as checked above
        return out  # the usual case (see `surely_finite`)
    return out.add(row_poison(q).to(dtype))


def _grad(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the call records a graph (as SDPA's output will say, `out.requires_grad`)."""
    return (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled()


def _sdpa(q: Tensor, k: Tensor, v: Tensor, top_left: bool, scale, gqa: bool) -> Tensor:
    """SDPA unmasked, passing no argument it would take as its default: each keyword costs
    ~0.2 µs of its ~19 µs at N=16. Its default scale, 1/sqrt(D), is `attention`'s too, to the
    bit (`default_scale`)."""
    if gqa or scale is not None:
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=top_left, scale=scale, enable_gqa=gqa
        )
    if top_left:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v)


def default_scale(head_dim: int) -> float:
    """1/sqrt(D), computed as SDPA computes its default (``1.0 / sqrt(D)`` in double), so that
    passing it and leaving SDPA's default give the same bits (``D ** -0.5`` differs in the last
    bit of the double for D = 2, 3, 6, 7, 32, ...)."""
    return 1.0 / math.sqrt(head_dim)


def surely_finite(q: Tensor) -> bool:
    """Whether q holds no NaN or ±inf (eager mode on the CPU only): then rule 1 has nothing to
    do. Read from q's bits by the compiled kernel where it is loaded and q is contiguous, else
    from one sum of q, whose overflow (float16, or entries past ~1e36) only sends the call to
    `row_poison`: it can cost time, never truth.

    Rule 1 of `attention`'s non-finite input (a query row whose q holds a NaN or ±inf gives
    NaN) needs this check on SDPA: its CPU kernel gives such a row 0 when every score of the
    row is -inf (float32: q·k = -inf for every key), and in float16/bfloat16 more often.
    """
    return _eager_cpu(q) and _all_finite(q, q.dtype, q.numel())


_scan = None  # `_finite_scan.finite_check()` once the kernel is loaded (read with no call: ~0.1 µs)


def _all_finite(q: Tensor, dtype: torch.dtype, numel: int) -> bool:
    """`surely_finite` for a CPU tensor q of that dtype and number of elements: the kernel's
    scan of the exponent bits where the kernel is loaded and q is contiguous, else the sum.
    Interleaved with SDPA at N=1, the scan adds ~1.0 µs to a call, the sum ~2.8 µs."""
    global _scan
    check = _scan or (_scan := finite_check())
    if check is not None and numel <= FINITE_MAX_NUMEL and q.is_contiguous():
        code = FINITE_CODES.get(dtype)
        if code is not None:
            addr = q.data_ptr()
            return check(addr & 0xFFFFFFFF, addr >> 32, numel, code) == 1
    return _isfinite((q.detach() if q.requires_grad else q).sum().item())


def row_poison(q: Tensor) -> Tensor:
    """(B, H, N, 1), no gradient: 0 where q's row is finite, NaN elsewhere; added to a result
    it poisons exactly the rows of rule 1, with no data-dependent branch. Summed in at least
    float32, so a float16/bfloat16 row cannot overflow (a float32 row only past ~1e36 per
    entry, where q·k has overflowed already)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    return q.detach().sum(-1, keepdim=True, dtype=acc).mul_(0)
