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

import warnings

import torch
from torch import Tensor

from attnkit.functional._index_fns import ScoreFn
from attnkit.functional._trace import tracing
from attnkit.functional.flex_masks import to_block_mask
from attnkit.functional.structured import StructuredMask, causal_intervals

__all__ = ["BLOCK", "fits", "run"]

BLOCK = 128  # FlexAttention's default sparse block (its CUDA kernels' tiles divide it)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_compiled = None  # torch.compile(_flex_call), made on first use
_warned = False  # the recompile-limit warning was given
RECOMPILES = 64  # kernels attnkit's Flex frame may compile (torch's default limit: 8)
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
    from torch.nn.attention.flex_attention import AuxRequest

    n, s = q.shape[2], k.shape[2]
    if causal:
        limit = _causal_limit(n, s, q.device)
        mask = limit if mask is None else mask & limit
    block_mask = None if mask is None else block_mask_for(mask, q.device)
    if isinstance(score_mod, ScoreFn):  # Flex calls it per element itself
        score_mod = score_mod.fn
    want_lse = q.device.type not in _NO_LSE
    args = (q, k, v, score_mod, block_mask, scale, bool(k.shape[1] != q.shape[1]))
    aux = AuxRequest(lse=True) if want_lse else None
    if tracing():  # inside the caller's own torch.compile / export: its graph takes Flex
        got = _flex_call(*args, aux)
    else:
        got = _run_compiled(args, aux)
        if got is None:
            return None
    if not want_lse:
        return got, None
    out, aux_out = got  # (out, AuxOutput(lse, max_scores=None))
    return out, aux_out.lse


def _flex_call(q, k, v, score_mod, block_mask, scale, enable_gqa, return_aux):
    """attnkit's own frame around `flex_attention`. torch.compile keeps its kernels, and counts
    them against `recompile_limit`, per frame: in a frame of its own, attnkit's kernels (one
    per shape, dtype and grad mode, since dynamic=False) neither count against a user's own
    compiled flex_attention nor run out with it."""
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(
        q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
        enable_gqa=enable_gqa, return_aux=return_aux,
    )  # fmt: skip


def _run_compiled(args, aux):
    """`_flex_call` compiled, or None once torch.compile will make no further kernel for it.

    Past its recompile limit torch.compile would run FlexAttention uncompiled, which forms the
    whole (B, H, N, S) score matrix: seen on an H200 at 30-60x SDPA's time, and out of memory
    at N = 16384. So the frame is compiled with fullgraph=True, which raises there instead, and
    the call goes back to SDPA with the mask as a tensor (a warning says so, once). The limit
    is raised to `RECOMPILES` for this frame only, while it runs."""
    import torch._dynamo

    global _warned
    limit = max(RECOMPILES, torch._dynamo.config.recompile_limit)
    try:
        with torch._dynamo.config.patch(recompile_limit=limit):
            return _compiled_flex()(*args, aux)
    except _limit_hit() as err:
        if not _warned:
            _warned = True
            warnings.warn(
                f"attnkit: FlexAttention has compiled {limit} kernels (one per call shape, "
                f"dtype and grad mode); further new shapes take auto's other route (SDPA with "
                f"a dense mask, or attnkit's chunked kernel for a score function SDPA cannot "
                f"add) ({type(err).__name__}). Pad inputs to a few lengths to stay on Flex.",
                RuntimeWarning,
                stacklevel=4,
            )
        return None


def _limit_hit() -> tuple[type[BaseException], ...]:
    from torch._dynamo import exc

    found = getattr(exc, "FailOnRecompileLimitHit", None) or getattr(
        exc, "FailOnCacheLimitHit", None
    )
    return (found,) if found is not None else ()


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
    """`_flex_call` compiled once (FlexAttention's fused kernels exist only compiled);
    dynamic=False as its documentation does, so each new shape compiles its own kernel;
    fullgraph=True so that the recompile limit raises (see `_run_compiled`)."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(_flex_call, dynamic=False, fullgraph=True)
    return _compiled
