"""The FlexAttention route of `attention` (CUDA): structured masks and built-in score functions
run in torch's compiled FlexAttention kernels instead of SDPA with an (N, S) mask.

Legend: B batch, H query heads, Hkv key/value heads, N queries, S keys, D query/key head width,
Dv value head width.

`fits` says, from static facts only (dtypes, head widths, flags), whether FlexAttention can run
a call; `run` runs it with the mask as a `BlockMask` (`flex_masks.to_block_mask`, built once per
mask and device and kept on the mask, as attnkit's own plans are). Both work on any device:
the tests run them on the CPU against FlexAttention's compiled CPU forward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.functional._index_fns import ScoreFn
from attnkit.functional._trace import tracing
from attnkit.functional.flex_masks import to_block_mask
from attnkit.functional.structured import StructuredMask, causal_intervals

__all__ = ["BLOCK", "fits", "run"]

BLOCK = 128  # FlexAttention's default sparse block (its CUDA kernels' tiles divide it)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_compiled = None  # torch.compile(flex_attention), made on first use
_NO_LSE = ("cpu",)  # devices whose compiled Flex kernel cannot return the lse (torch 2.13)


def fits(q: Tensor, v: Tensor, *, mask, bias, score_mod, dropout: bool, need_weights: bool):
    """Whether FlexAttention runs this call: no dropout, no weights, no dense bias and no mask
    tensor (a structured mask or none: Flex takes neither tensor), float16/bfloat16/float32,
    head widths D and Dv powers of two in [16, 256] (what its Triton kernels are built for),
    and a score function that is a built-in (`attnkit.score_mods`, traceable), one given to
    the FlexAttention drop-in (`attnkit.nn.attention.flex_attention`, written for Flex), or
    none."""
    if dropout or need_weights or bias is not None or q.dtype not in _DTYPES:
        return False
    if mask is not None and not isinstance(mask, StructuredMask):
        return False
    if score_mod is not None:
        from attnkit.functional.score_mods import ScoreMod

        # a built-in, or a function the FlexAttention drop-in was given (written for Flex)
        if not isinstance(score_mod, ScoreMod | ScoreFn):
            return False
    return all(16 <= d <= 256 and d & (d - 1) == 0 for d in (q.shape[-1], v.shape[-1]))


def block_mask_for(mask: StructuredMask, device):
    """The mask's BlockMask on `device`, built once and kept on the mask."""
    cache = mask.__dict__.setdefault("_block_masks", {})
    key = str(device)
    if key not in cache:
        cache[key] = to_block_mask(mask, BLOCK, device)
    return cache[key]


def run(q, k, v, mask: StructuredMask | None, causal: bool, scale: float, score_mod):
    """(out (B, H, N, Dv), lse (B, H, N) float32) of FlexAttention: the mask (and a causal
    limit, bottom-right) as a BlockMask, the score function as its score_mod. A row that may
    attend to nothing gets out 0 and lse -inf (FlexAttention's rule, attnkit's too). On the
    CPU (where only tests send it) lse is None: Flex's compiled CPU kernel cannot return it."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    n, s = q.shape[2], k.shape[2]
    if causal:
        limit = _causal_limit(n, s, q.device)
        mask = limit if mask is None else mask & limit
    block_mask = None if mask is None else block_mask_for(mask, q.device)
    fn = flex_attention if tracing() else _compiled_flex()
    if isinstance(score_mod, ScoreFn):  # Flex calls it per element itself
        score_mod = score_mod.fn
    want_lse = q.device.type not in _NO_LSE
    got = fn(
        q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
        enable_gqa=bool(k.shape[1] != q.shape[1]),
        return_aux=AuxRequest(lse=True) if want_lse else None,
    )  # fmt: skip
    if not want_lse:
        return got, None
    out, aux = got  # (out, AuxOutput(lse, max_scores=None))
    return out, aux.lse


_CAUSAL: dict = {}  # (N, S, device) -> causal_intervals, the few shapes a model runs


def _causal_limit(n: int, s: int, device) -> StructuredMask:
    """The bottom-right causal limit as one mask object per shape, so that its BlockMask (and
    the mask_mod FlexAttention compiled for it) is built once, not at every call."""
    key = (n, s, str(device))
    if key not in _CAUSAL:
        if len(_CAUSAL) >= 64:
            _CAUSAL.clear()
        _CAUSAL[key] = causal_intervals(n, s, device=device)
    return _CAUSAL[key]


def _compiled_flex():
    """FlexAttention compiled once (its fused kernels exist only compiled); dynamic=False as
    its documentation does, so each new shape compiles its own kernel."""
    global _compiled
    if _compiled is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled
