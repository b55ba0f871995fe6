"""Scaled dot-product attention: one function, one meaning, several backends.

Dimensions (the same names everywhere in attnkit):
    B batch, H query heads, Hkv key/value heads (H % Hkv == 0), N query length,
    S key length, D query/key head width, Dv value head width.

    softmax(scale · q kᵀ + bias, masked) · v        (Vaswani et al. 2017, eq. 1)

Backends compute the same thing and are pinned together by the tests:

* ``reference`` — plain matmul + softmax, computed in float32 (float64 for
  float64 input); the only backend that can return the probabilities.
* ``fused`` — ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's
  fused CPU flash kernel when it applies).
* ``chunked`` — online softmax over key and query blocks (FlashAttention-2): on the CPU the
  compiled kernel (`attnkit.functional.native`, registered as the operators
  ``attnkit::attention_fwd``/``attention_bwd``), elsewhere PyTorch ops on the inputs' device.
  O(block·S) memory in forward and backward for any mask, bias, causal, GQA and dropout;
  returns the log-sum-exp.
* ``flex`` (chosen by ``auto`` only, on CUDA) — torch's compiled FlexAttention, for structured
  masks (as a `BlockMask`, `flex_masks.to_block_mask`) and built-in score functions.
* ``auto`` — the fastest backend that supports the call (see `_choose_backend`), per device,
  chosen from static facts only (shapes, dtypes, flags, the device type, facts about this
  machine read at import), so that torch.compile and torch.export trace one fixed choice.
  Overridable with `use_backend`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit._cpu import has_native_bf16
from attnkit.functional import _flex_backend
from attnkit.functional._causal_bias import causal_bias_call, is_causal_bias
from attnkit.functional._double_backward import exact_sdpa_second_order
from attnkit.functional._fast_path import default_scale, plain_call, row_poison, surely_finite
from attnkit.functional._reference import _allowed, _eager_cpu, _repeat_kv, reference
from attnkit.functional._trace import tracing
from attnkit.functional._validate import validate as _validate
from attnkit.functional.structured import StructuredMask, causal_intervals

if TYPE_CHECKING:
    from attnkit.functional.score_mods import ScoreFn

__all__ = ["BACKENDS", "AttentionOutput", "attention", "use_backend"]

BACKENDS = ("auto", "reference", "fused", "chunked")

# What `use_backend` set (None: auto decides). A plain module global, not a ContextVar: Dynamo
# reads a global as a constant and guards on it (a changed choice recompiles), while a ContextVar
# read breaks the graph at every attention call.
_override: str | None = None

_tuple_new = tuple.__new__

# bfloat16 dot products in hardware, read once (see `_choose_backend`).
_NATIVE_BF16 = has_native_bf16()


class AttentionOutput(NamedTuple):
    """What `attention` returns, whatever the backend.

    out:     (B, H, N, Dv), dtype of q.
    weights: (B, H, N, S) probabilities *before* dropout, or None (only with
             ``need_weights=True``, which selects the reference backend).
    lse:     (B, H, N) log-sum-exp of the scaled, masked scores, no gradient (float32, or
             float64 for float64 input; -inf for rows that see no key), or None
             where the backend cannot give it (fused) and with ``need_weights=True``
             (the weights hold it: lse_i = s_ij - log p_ij for any j with p_ij > 0).
    """

    out: Tensor
    weights: Tensor | None = None
    lse: Tensor | None = None


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Make calls that ask for ``backend="auto"`` use `name` inside the block.

    Explicit backends in a call are left alone. Nested blocks restore the outer
    choice on exit. The choice is process-wide (not per thread), so that compiled
    graphs see it as a constant: a compiled model called inside the block is
    recompiled for the new choice.
    """
    global _override
    if name not in BACKENDS:
        raise ValueError(f"use_backend: name must be one of {BACKENDS}, got {name!r}")
    before, _override = _override, None if name == "auto" else name
    try:
        yield
    finally:
        _override = before


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | StructuredMask | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    need_weights: bool = False,
    backend: str = "auto",
    score_mod: ScoreFn | None = None,
) -> AttentionOutput:
    """Scaled dot-product attention.

    Args:
        q: queries (B, H, N, D).
        k: keys (B, Hkv, S, D). With Hkv < H (grouped-query / multi-query
            attention) query head h uses key/value head h // (H // Hkv), exactly
            as if k and v were repeated with ``repeat_interleave`` on dim 1.
        v: values (B, Hkv, S, Dv).
        mask: boolean, **True = may attend**, broadcastable to (B, H, N, S).
            Converters for other conventions live in `attnkit.masks` and return
            4-D masks. A 2-D mask (B, S) with B == N > 1, or a 3-D one (B, N, S)
            with B == H > 1, is refused as ambiguous (a key-padding or Keras mask
            would broadcast as (N, S) or (H, N, S) without error): pass those 4-D.
            Or a structured mask (`attnkit.masks.window`, `document`, `prefix`,
            `from_function` and their ``&``/``|``), which means its ``.dense()``: on the
            CPU auto runs it on the chunked kernels, which skip the blocks it hides, on
            CUDA on FlexAttention's. Or torch's `CausalBias` (``causal_upper_left(N, S)``:
            query i sees keys j <= i; ``causal_lower_right(N, S)``: the bottom-right
            `causal`), here or as `bias` (as torch's SDPA takes it), never materialised.
        bias: additive float scores, broadcastable to (B, H, N, S); may hold -inf.
        causal: query i attends to keys j <= i + (S - N), i.e. the mask is
            aligned bottom-right when N != S (what decoding with a cache needs).
            Combines with `mask` and `bias`.
        scale: multiplies q·kᵀ; defaults to 1/sqrt(D).
        dropout_p: dropout on the probabilities, applied only when `training`:
            each probability is kept with probability 1 - p and scaled by 1/(1 - p).
        need_weights: also return the probabilities (forces the reference path).
        backend: "auto", "reference", "fused" or "chunked".
        score_mod: FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx)`` (`attnkit.score_mods`:
            `softcap`, `alibi`, `relative_bias`, `compose`, or a vectorised function of your own),
            applied to the scaled scores ``scale · q·kᵀ`` block by block, **before** `bias` and
            the masks (which then set -inf). b, h, q_idx, kv_idx are int64 tensors broadcasting
            against the score block; q_idx, kv_idx are raw indices 0..N-1, 0..S-1 (add S - N to
            q_idx for the bottom-right frame of `causal`). Gradients flow through it into the
            tensors it closes over. The reference backend applies it to the whole score
            matrix, chunked per block; fused (SDPA) takes only additive built-ins
            (`alibi`, `relative_bias`), as a dense bias. The non-finite rules below apply to
            the scores it returns (a soft cap turns a +inf score into the cap; a -inf it
            returns hides that key, as a mask does).

    A query row that may attend to no key at all (every key masked, or S = 0) gets
    output exactly 0, lse -inf and gradient exactly 0 on every backend (never NaN).

    Higher-order gradients (``torch.autograd.grad(..., create_graph=True)``: gradient
    penalties, Hessian-vector products) are exact on every backend. The kernels whose backward
    autograd cannot differentiate (chunked, compiled or not; SDPA's fused kernels) then compute
    the gradient again in differentiable PyTorch ops, with the same mask, bias, causal limit,
    GQA and dropout entries, in O(B·H·N·S) memory. Dropout that SDPA draws inside a fused
    kernel (CUDA) cannot be replayed: a second-order gradient there raises NotImplementedError
    naming the way out, ``backend="chunked"`` or ``"reference"``. FlexAttention (auto's route
    for structure on CUDA) has no double backward of its own: for second-order gradients there,
    pass ``backend="chunked"`` (not yet checked on a GPU).

    Non-finite input has one meaning on every backend (tested):

    1. A query row whose q holds a NaN or ±inf gives NaN (out and lse).
    2. Otherwise the row's scores s_j = scale·q·k_j + bias_j over the keys it may attend
       follow IEEE arithmetic: a NaN or +inf score makes the row NaN; a -inf score gives
       that key weight 0; a row whose every score is -inf sees nothing (out 0, lse -inf).
    3. out = Σ_j p_j v_j: a NaN or ±inf value with weight p_j > 0 makes the row non-finite.
    4. k and v at positions a row may not attend (mask, causal limit) must be finite: a NaN
       there may spread through the blocked product (0 · NaN) on some backends and not on
       others, depending on their blocking. Zero padding and unused cache slots.
    """
    if mask is None and bias is None and score_mod is None and not need_weights:
        out = plain_call(q, k, v, causal, scale, dropout_p, training, backend, _override)
        if out is not None:  # the short path (`_fast_path`): SDPA unmasked, in eager mode
            return _tuple_new(AttentionOutput, (out, None, None))  # ~0.1 µs less than the call
    if is_causal_bias(mask) or is_causal_bias(bias):
        _validate(q, k, v, None, None, dropout_p, scale)  # q and k give N and S
        mask, bias, causal = causal_bias_call(mask, bias, causal, q.shape[2], k.shape[2], q.device)
    _validate(q, k, v, mask, bias, dropout_p, scale)
    if score_mod is not None and not callable(score_mod):
        raise ValueError(
            "score_mod must be a function (score, b, h, q_idx, kv_idx) -> score, got "
            f"{type(score_mod).__name__}"
        )
    if score_mod is not None:
        from attnkit.functional.score_mods import check

        check(score_mod, q.shape[1], q.shape[2], k.shape[2], q.device)
    if isinstance(mask, StructuredMask):
        mask, causal = _structured_call(mask, causal, q, k)
    structured = isinstance(mask, StructuredMask)  # traced code gets the dense form
    # masks and biases of rank < 4 as (…, N|1, S|1) views of rank 4: every backend sees one rank
    if not structured and mask is not None and mask.dim() < 4:
        mask = mask[(None,) * (4 - mask.dim())]
    if bias is not None and bias.dim() < 4:
        bias = bias[(None,) * (4 - bias.dim())]
    if q.numel() == 0 or k.shape[2] == 0:  # no query, or no key to attend to
        return _no_work(q, k, v, need_weights)
    scale = default_scale(q.shape[-1]) if scale is None else float(scale)
    p = float(dropout_p) if training else 0.0
    elems = _mask_elems(q, k, mask, bias, causal)
    low_grad = q.dtype == torch.bfloat16 and torch.is_grad_enabled()
    low_grad = low_grad and (q.requires_grad or k.requires_grad or v.requires_grad)
    flex_fits = q.device.type == "cuda" and _flex_backend.fits(
        q, v, mask=mask, bias=bias, score_mod=score_mod, dropout=p > 0, need_weights=need_weights
    )
    choose = functools.partial(
        _choose_backend, backend, need_weights=need_weights, dropout=p > 0, mask_elems=elems,
        low_precision_grad=low_grad, device_type=q.device.type, structured=structured,
        score_mod=score_mod,
    )  # fmt: skip
    name, res = choose(flex_fits=flex_fits), None
    if name == "flex":
        got = _flex_backend.run(q, k, v, mask, causal, scale, score_mod)
        if got is not None:
            res = AttentionOutput(got[0], None, got[1])
        else:  # FlexAttention compiles no further kernel: the route it would take otherwise
            name = choose(flex_fits=False)
    if structured and name not in ("chunked", "flex"):  # the kernels that read the structure
        mask = mask.dense(q.device)
    if name == "fused" and score_mod is not None:
        from attnkit.functional.score_mods import dense_bias

        bias = dense_bias(score_mod, q, k, bias)  # the stand-in: O(H·N·S)
    if res is not None:
        pass
    elif name == "reference":
        res = AttentionOutput(
            *reference(q, k, v, mask, bias, causal, scale, p, need_weights, score_mod)
        )
    elif name == "fused":
        res = _fused(q, k, v, mask, bias, causal, scale, p)
    else:
        from attnkit.functional.chunked import chunked_attention

        out, lse = chunked_attention(
            q, k, v, mask=mask, bias=bias, causal=causal, scale=scale, dropout_p=p,
            training=p > 0, score_mod=score_mod,
        )  # fmt: skip
        res = AttentionOutput(out, None, lse)
    return _nan_where_q_is_not_finite(res, q)


def _nan_where_q_is_not_finite(res: AttentionOutput, q: Tensor) -> AttentionOutput:
    """Rule 1 of `attention`'s non-finite input: NaN in every row whose q is not finite.

    SDPA's CPU flash kernel gives such a row 0 (it takes a NaN row max for an empty row) and
    the other backends NaN or 0 depending on the signs of the scores. 0 · (row sum of q) is 0
    where q is finite and NaN elsewhere, with no data-dependent branch; summed in at least
    float32, so float16/bfloat16 rows cannot overflow (a float32 row overflows only past
    ~1e36 per entry, where q·k has overflowed already). One read of q, one of out: 2 % of the
    call at N = 256, 0.5 % at N = 1024 (B=1, H=8, D=64, 1 thread). No gradient.

    In eager mode on the CPU one look at q decides first (`surely_finite`: the compiled
    kernel's scan of its bits where loaded, else one sum of q): finite (the usual case) means
    there is nothing to poison, and the four extra operations (~30 µs, more than SDPA itself at
    N = 16) are skipped. A sum is non-finite when any entry is, or when finite entries
    overflow it; then the exact row-wise path runs, so the check can cost time, never truth.
    """
    if surely_finite(q):
        return res
    return _poison_rows(res, q)


def _poison_rows(res: AttentionOutput, q: Tensor) -> AttentionOutput:
    """NaN in the rows of res whose q is not finite, with no data-dependent branch."""
    poison = row_poison(q)  # (B, H, N, 1): 0, or NaN
    out = res.out.add(poison.to(res.out.dtype))
    lse = None if res.lse is None else res.lse.add(poison[..., 0].to(res.lse.dtype))
    return AttentionOutput(out, res.weights, lse)


def _no_work(q: Tensor, k: Tensor, v: Tensor, need_weights: bool) -> AttentionOutput:
    """The result when B, H or N is 0 (an empty output) or S is 0 (every row sees no key: out 0,
    lse -inf, as for a fully masked row), the same whatever the backend. Computed as q kᵀ v on
    the empty axis, so the output still carries gradients (zeros) to q, k and v."""
    heads = q.shape[1]
    scores = torch.matmul(q, _repeat_kv(k, heads).transpose(-2, -1))  # (B, H, N, S), empty
    out = torch.matmul(scores, _repeat_kv(v, heads))  # (B, H, N, Dv): zeros
    work = torch.promote_types(q.dtype, torch.float32)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=work, device=q.device)  # (B, H, N)
    return AttentionOutput(out, scores if need_weights else None, None if need_weights else lse)


# SDPA turns a boolean mask into a float mask of the mask's own broadcast shape (and `_fused`
# first combines mask, causal and bias into one), so a full (N, S) mask costs 4·N·S bytes on top
# of the kernel's O(N) memory. Measured (B=1, H=8, D=64, float32, fwd+bwd, arbitrary (N, S)
# mask): N=8192 SDPA +339 MiB, N=16384 SDPA +1.3 GiB (PERF-NOTES), chunked ~0.2 GiB at 16384;
# chunked is ~1.5-1.8x slower than SDPA with a mask at N=1024-2048 (benchmarks/README.md).
# From 2**26 mask elements (256 MiB as float32; N=S=8192) memory wins and auto picks chunked;
# below, the float mask stays under 256 MiB and fused is kept for speed.
_MASK_ELEMS_CHUNKED = 1 << 26


def _structured_call(mask: StructuredMask, causal: bool, q: Tensor, k: Tensor):
    """A structured mask for this call: `causal` folded in (as row intervals), or, in traced
    code (whose graphs hold tensors, not descriptions), its dense form with `causal` kept."""
    if tracing():
        return mask.dense(q.device), causal
    if causal:
        mask = mask & causal_intervals(q.shape[2], k.shape[2], device=q.device)
    return mask, False


def _mask_elems(q: Tensor, k: Tensor, mask, bias: Tensor | None, causal: bool):
    """Elements of the float mask `_fused` would hand to SDPA (0: none, SDPA masks itself).

    Under torch.export with dynamic sizes this may be a symbolic size; `_choose_backend`
    compares it without adding a guard (so the batch and length stay dynamic)."""
    shapes = [t.shape for t in (mask, bias) if t is not None]  # a description: a tuple
    if not shapes:
        return 0
    if causal:
        shapes.append(torch.Size((q.shape[2], k.shape[2])))  # (N, S)
    # The broadcast size dimension by dimension with sym_max: torch.broadcast_shapes guards
    # on (specialises) symbolic sizes under non-strict torch.export. The shapes were
    # meant to broadcast, so the larger size of each dimension is the broadcast one.
    total = 1
    for i in range(1, max(len(s) for s in shapes) + 1):
        size = 1
        for shape in shapes:
            if len(shape) >= i:
                d = shape[-i]  # an int, a SymInt (export), or a 0-d Tensor (jit.trace)
                size = torch.sym_max(size, d) if isinstance(d, torch.SymInt) else max(size, int(d))
        total = total * size
    return total


def _choose_backend(
    requested: str,
    *,
    need_weights: bool,
    dropout: bool,
    mask_elems=0,
    low_precision_grad: bool = False,
    device_type: str = "cpu",
    structured: bool = False,
    score_mod=None,
    flex_fits: bool = False,
) -> str:
    """The backend a call runs on, from static facts only.

    `mask_elems` is what `_mask_elems` returns for the call; `low_precision_grad` says that
    the inputs are bfloat16 and a gradient will be taken; `structured` that the mask is a
    `StructuredMask`; `flex_fits` that FlexAttention can run the call (`_flex_backend.fits`).
    On CUDA a structured mask or a built-in score function goes to FlexAttention ("flex", an
    auto-only choice) where it fits. Otherwise, off the CPU (CUDA, MPS, ...) auto runs SDPA,
    whose kernels there do dropout and masks themselves (a structured mask goes as its dense
    form). A `score_mod` runs on chunked, except an additive built-in off the CPU, which SDPA
    takes as a dense bias.
    """
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    additive = bool(getattr(score_mod, "additive", False))
    if requested != "auto":
        if need_weights and requested != "reference":
            raise ValueError(
                f"need_weights=True needs backend 'reference' (or 'auto'); got {requested!r}, "
                "which does not materialise the probabilities"
            )
        if requested == "fused" and score_mod is not None and not additive:
            raise ValueError(
                f"backend 'fused' (SDPA) takes only additive score functions (attnkit."
                f"score_mods.alibi, relative_bias), as a dense bias; got score_mod={score_mod!r}: "
                "use backend 'chunked' or 'reference'"
            )
        return requested
    if need_weights:
        return "reference"
    if _override is not None:
        if _override == "fused" and score_mod is not None and not additive:
            return "chunked"
        return _override
    # CUDA: structure and built-in score functions go to FlexAttention's kernels, which skip
    # what the BlockMask hides and compute the score function in the kernel (SDPA would take
    # the mask or the additive score function as a dense (N, S) tensor). `flex_fits` (see
    # `_flex_backend.fits`) says Flex runs the call: no dropout, bias or tensor mask, a
    # built-in score function, a dtype and head widths its kernels are built for.
    if device_type == "cuda" and flex_fits and (structured or score_mod is not None):
        return "flex"
    if score_mod is not None:
        # CUDA: dense-bias fallback for additive built-ins (O(B·H·N·S)), marked as a stand-in
        return "fused" if device_type != "cpu" and additive else "chunked"
    if device_type != "cpu":
        return "fused"
    # The chunked kernels skip the blocks a structured mask hides: time follows the density
    # (window 256 at N=4096: ~10x less work than SDPA with the same mask as a tensor).
    if structured:
        return "chunked"
    # SDPA leaves its fused CPU kernel for a slow math path as soon as dropout is
    # on (PERF-NOTES: ~12x slower at N=2048); the chunked kernel draws its
    # dropout bits cheaply and keeps O(N) memory. A mask size only known symbolically
    # (export with dynamic shapes) keeps fused rather than guard on the size.
    if dropout or _surely_at_least(mask_elems, _MASK_ELEMS_CHUNKED):
        return "chunked"
    # SDPA's bfloat16 backward on a CPU without bf16 units (AVX2 EPYC) is ~4x slower than
    # chunked, which computes in float32: fwd+bwd N=1024 (B=1, H=8, D=64, 1 thread) 618 ms vs
    # 149 ms. With AVX512-BF16/AMX (Sapphire Rapids) it is the faster one: 38 ms vs 62 ms.
    if low_precision_grad and not _NATIVE_BF16:
        return "chunked"
    return "fused"


# --------------------------------------------------------------------------- backends


def _probe_sdpa_empty_rows() -> bool:
    """Whether this torch's CPU SDPA gives a query row that may attend to nothing output 0 and
    finite gradients (torch >= 2.5; earlier ones give NaN, and `_fused` zeroes such rows itself,
    at the cost of a pass over the mask: 0.4 ms at N=S=1024). Probed on float32 and bfloat16,
    boolean and -inf float masks, the flash and the math (dropout) paths; the probe's dropout
    draws come from a forked RNG, so the caller's random stream is untouched."""
    try:
        with torch.random.fork_rng(devices=[]):
            for dtype in (torch.float32, torch.bfloat16):
                q = torch.randn(1, 1, 3, 4, dtype=dtype, device="cpu", requires_grad=True)
                blocked = torch.zeros(3, 3, dtype=torch.bool, device="cpu")
                blocked[1] = True  # query 1 sees no key
                float_mask = torch.zeros(3, 3, dtype=dtype, device="cpu")
                float_mask = float_mask.masked_fill(blocked, float("-inf"))
                for attn_mask in (~blocked, float_mask):
                    for p in (0.0, 0.5):
                        out = F.scaled_dot_product_attention(
                            q, q, q, attn_mask=attn_mask, dropout_p=p
                        )
                        (grad,) = torch.autograd.grad(out.float().sum(), q)
                        if not ((out[..., 1, :] == 0).all() and torch.isfinite(grad).all()):
                            return False
    except RuntimeError:
        return False
    return True


# Probed once at import, not at first use: a first use may sit inside a dispatch mode, a FLOP
# counter, a compiled or exported trace, which must neither see the probe's calls nor branch on
# its result. A constant, so traced code reads it as one.
_SDPA_ZEROES_EMPTY_ROWS = _probe_sdpa_empty_rows()


def _fused(q, k, v, mask, bias, causal, scale, dropout_p) -> AttentionOutput:
    n, s = q.shape[2], k.shape[2]
    # a bool, never a traced size comparison (jit.trace turns sizes into tensors)
    gqa = bool(k.shape[1] != q.shape[1])
    # PyTorch's is_causal is top-left aligned; it equals ours only when N == S. Its CPU
    # kernel also gives NaN rows for a scale <= 0 (the masked -inf times the scale), so such
    # calls pass the causal limit as a boolean mask instead (found by the hypothesis test).
    if mask is None and bias is None and (not causal or (n == s and scale > 0)):
        return AttentionOutput(_sdpa_unmasked(q, k, v, scale, dropout_p, causal, gqa))
    allowed = _allowed(mask, causal, n, s, q.device)
    if q.device.type == "cpu" and _SDPA_ZEROES_EMPTY_ROWS:
        dead = None  # SDPA itself gives such rows output 0 and gradient 0
    else:
        blocked = None if allowed is None else ~allowed
        if bias is not None:
            inf = torch.isneginf(bias)
            blocked = inf if blocked is None else blocked | inf
        dead = None if blocked is None else blocked.all(dim=-1, keepdim=True)  # (..., N, 1)
        if dead is not None and _eager_cpu(q) and not bool(dead.any()):
            dead = None
    if bias is None:
        attn_mask = allowed if dead is None else allowed | dead
    else:
        attn_mask = bias.to(q.dtype)
        if allowed is not None:
            attn_mask = torch.where(allowed, attn_mask, float("-inf"))
        if dead is not None:
            # dead rows get finite scores so SDPA stays finite; zeroed below.
            attn_mask = torch.where(dead, 0.0, attn_mask)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=gqa
    )
    out = exact_sdpa_second_order(out)
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    return AttentionOutput(out)


def _sdpa_unmasked(q, k, v, scale: float, dropout_p: float, causal: bool, gqa: bool) -> Tensor:
    out = F.scaled_dot_product_attention(
        q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale, enable_gqa=gqa
    )
    return exact_sdpa_second_order(out)


def attention_without_checks(
    q: Tensor, k: Tensor, v: Tensor, *, causal=False, scale=None, backend="auto"
) -> Tensor | None:
    """`attention(q, k, v, causal=causal, scale=scale, backend=backend).out` for a call with no
    mask, bias, dropout or weights where it runs SDPA unmasked (`plain_call`), else None: the
    caller then calls `attention`. For the KV-cached decode step (`CachedMultiHeadAttention`)
    and the drop-in `attnkit.nn.functional.scaled_dot_product_attention`.
    """
    return plain_call(q, k, v, causal, scale, 0.0, False, backend, _override)


def _surely_at_least(value, bound: int) -> bool:
    """``value >= bound`` for an int; for a symbolic size (export with dynamic shapes), True
    only if known statically. The symbolic check is imported here, not at module level:
    torch.fx.experimental.symbolic_shapes pulls in sympy, ~0.7 s of every CLI start."""
    if isinstance(value, int):
        return value >= bound
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(value >= bound)
