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
* ``auto`` — the fastest backend that supports the call (see `_choose.choose_backend`), per device,
  chosen from static facts only (`_choose.choose_backend`), so that torch.compile and
  torch.export trace one fixed choice.
  Overridable with `use_backend`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from attnkit.functional import _choose, _flex_backend
from attnkit.functional._causal_bias import causal_bias_call, is_causal_bias
from attnkit.functional._choose import BACKENDS, mask_elems, use_backend
from attnkit.functional._choose import choose_backend as _choose_backend
from attnkit.functional._fast_path import default_scale, plain_call, row_poison, surely_finite
from attnkit.functional._reference import _repeat_kv, reference
from attnkit.functional._sdpa_backend import fused
from attnkit.functional._trace import tracing
from attnkit.functional._validate import validate as _validate
from attnkit.functional.structured import StructuredMask, causal_intervals

if TYPE_CHECKING:
    from attnkit.functional.score_mods import ScoreFn

__all__ = ["BACKENDS", "AttentionOutput", "attention", "use_backend"]

_tuple_new = tuple.__new__


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
        out = plain_call(q, k, v, causal, scale, dropout_p, training, backend, _choose.override)
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
    elems = mask_elems(q, k, mask, bias, causal)
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
        res = AttentionOutput(fused(q, k, v, mask, bias, causal, scale, p))
    else:
        from attnkit.functional.chunked import chunked_attention

        out, lse = chunked_attention(
            q, k, v, mask=mask, bias=bias, causal=causal, scale=scale, dropout_p=p,
            training=p > 0, score_mod=score_mod,
        )  # fmt: skip
        res = AttentionOutput(out, None, lse)
        if _lse_vouches_for_q(lse, score_mod, p):
            return res
    return _nan_where_q_is_not_finite(res, q)


def _lse_vouches_for_q(lse: Tensor, score_mod, p: float) -> bool:
    """Whether a chunked call's lse proves every row of q finite, so that rule 1 (NaN in
    every row whose q is not finite) has nothing to do and q need not be read.

    A query row whose q holds a NaN or ±inf gets a score of ±inf or NaN for every key (q·k =
    ±inf, or NaN from inf · 0 or inf - inf; a bias, a mask's -inf and the causal limit leave
    it so), and the online softmax then ends with lse NaN (a NaN or +inf score: exp(NaN),
    exp(inf - inf), out NaN too) or -inf (every score -inf, or no key seen). So when every lse
    is finite every q row is; otherwise `_nan_where_q_is_not_finite` reads q as before. The
    lse is B·H·N numbers where q is B·H·N·D: the scan of q cost 4-8 % of a narrow window's
    forward at N = 4096 (AMD EPYC Zen 4, 1 thread). A score function (tanh soft-capping maps
    ±inf to ±cap) or dropout (dropped NaN terms can leave out finite) breaks the argument:
    those calls read q.
    """
    return score_mod is None and p == 0.0 and surely_finite(lse)


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


def _structured_call(mask: StructuredMask, causal: bool, q: Tensor, k: Tensor):
    """A structured mask for this call: `causal` folded in (as row intervals), or, in traced
    code (whose graphs hold tensors, not descriptions), its dense form with `causal` kept."""
    if tracing():
        return mask.dense(q.device), causal
    if causal:
        mask = mask & causal_intervals(q.shape[2], k.shape[2], device=q.device)
    return mask, False


def attention_without_checks(
    q: Tensor, k: Tensor, v: Tensor, *, causal=False, scale=None, backend="auto"
) -> Tensor | None:
    """`attention(q, k, v, causal=causal, scale=scale, backend=backend).out` for a call with no
    mask, bias, dropout or weights where it runs SDPA unmasked (`plain_call`), else None: the
    caller then calls `attention`. For the KV-cached decode step (`CachedMultiHeadAttention`)
    and the drop-in `attnkit.nn.functional.scaled_dot_product_attention`.
    """
    return plain_call(q, k, v, causal, scale, 0.0, False, backend, _choose.override)
