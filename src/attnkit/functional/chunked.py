"""Chunked attention: online softmax over query and key blocks, O(block) extra memory.

`chunked_attention` runs one call on the compiled CPU kernel (`attnkit.functional.native`)
where it is available, else on the PyTorch kernel (`attnkit.functional._chunked_torch`, any
device; with a score function `_chunked_mod`): same function, same dropped entries, the
compiled one about 2x faster with dropout. Masks that skip well only in another order of the
tokens run in that order (`reordered`); interleaved sequences (`groups`) in place or as rows
of the batch.
Legend: B batch, H query heads, Hkv key/value heads, N queries, S keys, D head width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.functional import _chunked_mod, native
from attnkit.functional._chunked_torch import _as4d, _ChunkedAttention, _Plan
from attnkit.functional._dropout import NO_DROPOUT, draw_seed, keep_threshold
from attnkit.functional._grid import offset_runs
from attnkit.functional._mask_plan import call_plan
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
    PyTorch one (`_chunked_torch`: any device, float64, gradients for ``bias``, chosen block
    sizes); "auto" takes the compiled one wherever `native.supports` the call and no block
    size is given. Both compute the same function and drop the same entries.

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
    # Dv = 0: the compiled kernel's BLAS (oneMKL) prints an error line per product; the
    # PyTorch kernel gives the same empty out, lse and dropout draws, silently.
    native_fits = v.shape[-1] > 0 and native.supports(q, bias)
    on_native = kernel == "native" or (
        kernel == "auto" and block_q is None and block_k is None and native_fits
    )
    plain = score_mod is None  # a score function reads the positions: no reordering
    reordered = plain and reordered_call(mask, q, k, bias, t_keep < NO_DROPOUT, causal)
    if reordered and on_native and _natural_forward(mask, q, k, v):
        mask = mask.natural  # the compiled kernel's offset path, in token order
    elif reordered:
        kw = dict(bias=None, scale=scale, dropout_p=0.0, training=False, block_q=block_q,
                  block_k=block_k, kernel=kernel)  # fmt: skip

        def attend(*qkv, m, causal=False, groups=1, qrows=None):
            if qrows is not None:  # the compiled kernel, queries in token order
                return _native_rows(*qkv, m, qrows, scale, block_q, block_k)
            return chunked_attention(*qkv, mask=m, causal=causal, groups=groups, **kw)

        return run_reordered(mask, q, k, v, attend, rows_in_place=on_native)
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


def _native_rows(q, k, v, m: StructuredMask, qrows: Tensor, scale, block_q, block_k):
    """(out, lse) of mask `m` on the compiled kernel, its query position i being token
    qrows[i] of q, out and lse (`native.native_attention`'s ``qrows``): no bias, dropout or
    causal limit (`reordered.reordered_call`)."""
    fit = block_q is None and block_k is None  # blocks fit the mask
    plan = call_plan(m, q.device, block_q, block_k, fit)
    t_keep, inv_keep = keep_threshold(0.0)
    return native.native_attention(
        q, k, v, mask=plan.dense, bias=None, causal=False, scale=scale, keep_t=t_keep,
        inv_keep=inv_keep, seed=None, plan=plan, qrows=qrows,
    )  # fmt: skip


def _natural_forward(mask, q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether a reordered mask's call runs its runs in token order (`Reordered.natural`, a
    2-D neighbourhood's) on the compiled kernel's offset paths instead of reordered: where it
    has them and either no gradient is wanted or the backward takes them on its offset path
    too (_native/offset_runs.h, `_grid.offset_runs`: AVX-512 and AVX2 builds; elsewhere the runs on
    its blocks compute ~2.6 entries an allowed one against the reordered tiles' 2.15-2.35)."""
    if getattr(mask, "natural", None) is None:
        return False
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return not wants_grad or offset_runs()
