"""Exact multiply-accumulate (MAC), FLOP and parameter counts of attention layers.

Dimensions (the attnkit vocabulary): B batch, N query tokens, S key/value tokens,
C input width, C' context width (cross-attention; C_k, C_v when keys and
values have their own widths), H query heads, G key/value heads (G < H:
grouped-query / multi-query attention), d head width (d_k, d_v when they
differ), C_out output width.

Counting rule. A product [a, c]·[c, b] costs a·b·c multiply-accumulates (MACs);
one MAC is two floating-point operations, so **FLOPs = 2 × MACs** for every
matmul term. This is the rule of `torch.utils.flop_counter.FlopCounterMode`,
which the tests run against every formula here.

One head of self-attention on X [N, C] (Vaswani et al. 2017, §3.2):

    Q, K, V = X·W_q, X·W_k, X·W_v        3·N·C²   (three [N, C]·[C, C])
    Q·Kᵀ                                  N²·C     ([N, C]·[C, N])
    softmax(·)·V                          N²·C     ([N, N]·[N, C])
                                   total  3NC² + 2N²C

Multi-head attention splits C into H heads of width d = C/H: the score and
weights·V products become H products of N·N·d, which sum to the same N²·C, so
the count does not depend on H; the output projection W_o adds N·C²:

    4NC² + 2N²C                           (multi-head self-attention)

Without W_o (`out_proj=False`) it is the single head's 3NC² + 2N²C again. With
keys and values apart (widths C_k, C_v; head widths d_k, d_v, §3.2.2) each
product keeps its own widths:

    N·C·Hd_k + S·C_k·Gd_k + S·C_v·Gd_v + H·N·S·d_k + H·N·S·d_v [+ N·Hd_v·C_out]

Swin windows (Liu et al. 2021, eq. 1-2) of M×M patches on an h×w grid:
4hwC² + 2M²hwC (`swin_window_cost`, in `attnkit.analysis.window_cost`).

A sliding window of w keys is the 1-D Swin: 4NC² + 2·(allowed pairs)·C ≈ 4NC² + 2wNC once
masked products are skipped; `mha_cost(mask=...)` counts the pairs a structured mask allows
and the blocks attnkit's compiled kernel computes (`kernel_work`), between those and N·S.

Elementwise work is not a matmul and is kept apart in `Cost.elementwise`, as
FLOPs (not MACs), by the conventions below; `FlopCounterMode` does not see any of
it (it counts only mm/bmm/addmm/baddbmm, convolutions and SDPA kernels):

* scale: one multiply per score (attnkit scales the scores, not q);
* softmax: 5 per score (running max, subtract, exp, sum, divide);
* mask: one select per score when a causal/window/shift/structured mask is applied;
* bias: one add per projection output element (Linear biases);
* position bias: the work of a relative position scheme per score (ALiBi, T5's
  and Swin's tables, in `attnkit.analysis.positions_cost`), with the tensors it
  holds in `Cost.memory`.

`Cost` itself (the record and its algebra) is defined in `attnkit.analysis._cost_record`.
"""

from __future__ import annotations

from dataclasses import replace

from attnkit.analysis._cost_record import Cost, _batched, _check_positive
from attnkit.analysis.kernel_work import kernel_work
from attnkit.functional.structured import StructuredMask

__all__ = ["Cost", "allowed_pairs", "mha_cost", "single_head_cost"]

# FLOPs per attention score for the elementwise conventions in the module docstring.
SOFTMAX_FLOPS_PER_SCORE = 5

# Term names, shared by every formula so that summed costs line up.
Q_PROJ, K_PROJ, V_PROJ = "q_proj", "k_proj", "v_proj"
SCORES, WEIGHTS_V, OUT_PROJ = "scores (QKᵀ)", "weights·V", "out_proj"


def allowed_pairs(n: int, s: int, *, causal: bool = False, window: int | None = None) -> int:
    """Number of (query, key) pairs a mask keeps, out of N·S.

    Same alignment as `attnkit.functional.masks`: query i sits at key position
    p = i + S - N (bottom-right). `causal` keeps keys j <= p; `window` keeps
    |j - p| < window, or p - window < j <= p together with `causal`.
    """
    if not causal and window is None:
        return n * s
    total = 0
    for i in range(n):
        p = i + s - n
        lo = 0 if window is None else p - window + 1
        hi = p if causal else p + window - 1
        total += max(0, min(hi, s - 1) - max(lo, 0) + 1)
    return total


def _widths(dim, context_dim, key_dim, value_dim) -> tuple[int, int]:
    """(C_k, C_v): `context_dim` is shorthand for both, as in `MultiHeadAttention`."""
    if context_dim is not None:
        for name, width in (("key_dim", key_dim), ("value_dim", value_dim)):
            if width is not None and width != context_dim:
                raise ValueError(
                    f"context_dim={context_dim} sets key_dim and value_dim; got {name}={width}"
                )
        return context_dim, context_dim
    ck = dim if key_dim is None else key_dim
    return ck, ck if value_dim is None else value_dim


def _attention_cost(
    n: int,
    dim: int,
    heads: int,
    *,
    context_len: int | None,
    context_dim: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    out_dim: int | None,
    qkv_bias: bool,
    out_bias: bool,
    causal: bool,
    window: int | None,
    batch: int,
    out_proj: bool,
    key_dim: int | None = None,
    value_dim: int | None = None,
    v_head_dim: int | None = None,
    mask: StructuredMask | None = None,
) -> Cost:
    """The one formula behind `mha_cost` and `single_head_cost`."""
    _check_positive(
        n=n, dim=dim, heads=heads, context_len=context_len, context_dim=context_dim,
        key_dim=key_dim, value_dim=value_dim, kv_heads=kv_heads, head_dim=head_dim,
        v_head_dim=v_head_dim, out_dim=out_dim, window=window, batch=batch,
    )  # fmt: skip
    if head_dim is None:
        if dim % heads:
            raise ValueError(f"heads={heads} must divide dim={dim} (or give head_dim)")
        head_dim = dim // heads
    dv = head_dim if v_head_dim is None else v_head_dim
    g = heads if kv_heads is None else kv_heads
    if heads % g:
        raise ValueError(f"kv_heads={g} must divide heads={heads}")
    s = n if context_len is None else context_len
    ck, cv = _widths(dim, context_dim, key_dim, value_dim)
    inner, k_inner, v_inner = heads * head_dim, g * head_dim, g * dv  # H·d_k, G·d_k, G·d_v
    if not out_proj and out_dim is not None and out_dim != heads * dv:
        raise ValueError(
            f"out_dim={out_dim} must equal heads·v_head_dim={heads * dv} without an output "
            "projection (out_proj=False)"
        )
    c_out = dim if out_dim is None else out_dim

    terms = {
        Q_PROJ: n * dim * inner,  # [N, C]·[C, H·d_k]
        K_PROJ: s * ck * k_inner,  # [S, C_k]·[C_k, G·d_k]: G < H means fewer K/V MACs
        V_PROJ: s * cv * v_inner,  # [S, C_v]·[C_v, G·d_v]
        # every query head reads a K/V head (shared under GQA): H products [N, d_k]·[d_k, S]
        SCORES: heads * n * s * head_dim,
        WEIGHTS_V: heads * n * s * dv,  # H products [N, S]·[S, d_v]
    }
    params = dim * inner + ck * k_inner + cv * v_inner
    params += inner + k_inner + v_inner if qkv_bias else 0
    bias_adds = inner * n + (k_inner + v_inner) * s if qkv_bias else 0
    if out_proj:
        terms[OUT_PROJ] = n * heads * dv * c_out  # [N, H·d_v]·[H·d_v, C_out]
        params += heads * dv * c_out + (c_out if out_bias else 0)
        bias_adds += n * c_out if out_bias else 0

    scores = heads * n * s
    elementwise = {"scale": scores, "softmax": SOFTMAX_FLOPS_PER_SCORE * scores}
    if causal or window is not None or mask is not None:
        elementwise["mask"] = scores
    if bias_adds:
        elementwise["bias"] = bias_adds
    if mask is not None:
        cost = _batched(Cost(terms, params, elementwise), batch)
        return _structured(cost, mask, n, s, heads, head_dim + dv, causal, window, batch)
    masked = (n * s - allowed_pairs(n, s, causal=causal, window=window)) * heads * (head_dim + dv)
    return _batched(Cost(terms, params, elementwise, masked), batch)


def _structured(cost: Cost, mask, n, s, heads, per_entry, causal, window, batch) -> Cost:
    """`cost` with a structured mask's masked MACs (the pairs it allows, from `.density`) and
    skipped MACs (the blocks the compiled kernel never visits); d_k + d_v MACs per entry."""
    if window is not None:
        raise ValueError(
            f"give window={window} and mask= together as one mask: mask & masks.window(n, {window})"
        )
    work = kernel_work(mask, n=n, s=s, causal=causal, batch=batch, heads=heads)
    masked, skipped = work.dense - work.allowed, work.dense - work.computed
    return replace(cost, masked_macs=masked * per_entry, skipped_macs=skipped * per_entry)


def mha_cost(
    n: int,
    dim: int,
    heads: int,
    *,
    context_len: int | None = None,
    context_dim: int | None = None,
    key_dim: int | None = None,
    value_dim: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    v_head_dim: int | None = None,
    out_dim: int | None = None,
    out_proj: bool = True,
    qkv_bias: bool = True,
    out_bias: bool = True,
    causal: bool = False,
    window: int | None = None,
    mask: StructuredMask | None = None,
    batch: int = 1,
) -> Cost:
    """Cost of one multi-head attention layer (self or cross), forward.

    Args:
        n: query tokens N.
        dim: input width C.
        heads: query heads H.
        context_len: key/value tokens S (cross-attention); default N.
        context_dim: width C' of one context giving keys and values; default C.
        key_dim, value_dim: widths C_k and C_v of the key and value inputs
            when they differ (default C', and C_v defaults to C_k), as
            `MultiHeadAttention(key_dim=, value_dim=)`.
        kv_heads: key/value heads G (GQA, MQA with G = 1): K and V projections
            shrink to C'·G·d, the score products do not (each query head still
            meets S keys).
        head_dim: d_k, the query/key head width; default C / H.
        v_head_dim: d_v, the value head width; default d_k.
        out_dim: C_out of the output projection (T2T-ViT's token-to-token
            attention changes the width); default C.
        out_proj: False counts no output projection W_O (the output is the
            merged heads, H·d_v wide): 3NC² + 2N²C for self-attention with
            H·d = C, the textbook single head.
        causal: query i sees keys j <= i + S - N (bottom-right, as attnkit).
            `macs` still counts all N·S products (dense kernels compute them);
            `masked_macs` holds the upper triangle, `unmasked_macs` what a
            causal-skipping kernel needs. attnkit's ``chunked`` backend skips
            fully masked blocks and so does torch SDPA's CPU flash kernel with
            ``is_causal`` (attnkit's ``fused`` backend passes ``is_causal`` only
            when N == S; otherwise it passes a mask and nothing is skipped);
            the ``reference`` backend computes everything.
        window: sliding window of `window` keys (`masks.window`);
            counted like `causal`.
        mask: a structured mask (`attnkit.masks.window`, `document`, `prefix`,
            `from_function`, their `&`/`|`) of N queries and S keys, ANDed with `causal`:
            `masked_macs` from the pairs it allows (its `.density`), `skipped_macs` from the
            key blocks attnkit's compiled chunked kernel never visits (`kernel_work`, equal to
            the kernel's own counter), so `unmasked_macs` <= `computed_macs` <= `macs`.
        batch: B; every count is linear in it (parameters are not).

    With defaults: 4NC² + 2N²C MACs and 4C² + 4C parameters. In general
    N·C·Hd_k + S·C_k·Gd_k + S·C_v·Gd_v + H·N·S·(d_k + d_v) [+ N·Hd_v·C_out].
    """
    return _attention_cost(
        n, dim, heads, context_len=context_len, context_dim=context_dim, kv_heads=kv_heads,
        head_dim=head_dim, out_dim=out_dim, qkv_bias=qkv_bias, out_bias=out_bias,
        causal=causal, window=window, batch=batch, out_proj=out_proj, key_dim=key_dim,
        value_dim=value_dim, v_head_dim=v_head_dim, mask=mask,
    )  # fmt: skip


def single_head_cost(
    n: int,
    dim: int,
    *,
    context_len: int | None = None,
    bias: bool = True,
    causal: bool = False,
    batch: int = 1,
) -> Cost:
    """One head of width C, no output projection: 3NC² + 2N²C MACs (S = N)."""
    return _attention_cost(
        n, dim, 1, context_len=context_len, context_dim=None, kv_heads=None, head_dim=dim,
        out_dim=None, qkv_bias=bias, out_bias=False, causal=causal, window=None,
        batch=batch, out_proj=False,
    )  # fmt: skip
