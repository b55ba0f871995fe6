"""`torch.nn.attention.flex_attention`'s API, computed by `attnkit.attention`: FlexAttention
code runs on the CPU, with a backward, by changing one import::

    from attnkit.nn.attention.flex_attention import create_block_mask, flex_attention

Legend: B batch, Hq query heads, Hkv key/value heads, L queries, S keys, E query/key head
width, Ev value head width.

`create_block_mask`, `create_mask`, `and_masks`, `or_masks`, `noop_mask`, `BlockMask`,
`AuxRequest` and `AuxOutput` are torch's own (they need no compiler on the CPU). `flex_attention`
takes torch's arguments and gives torch's results; the block mask becomes an attnkit structured
mask (`attnkit.masks.from_block_mask`: its block lists are skipped, its mask_mod evaluated on
partial blocks only) and the score_mod an attnkit score function, so `auto` picks the kernel:
on the CPU the compiled chunked kernel (forward and backward), on CUDA FlexAttention itself.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import (
    AuxOutput,
    AuxRequest,
    BlockMask,
    and_masks,
    create_block_mask,
    create_mask,
    noop_mask,
    or_masks,
)

from attnkit.functional._index_fns import ScoreFn
from attnkit.functional.attention import attention
from attnkit.functional.flex_masks import from_block_mask, is_noop_block_mask
from attnkit.functional.score_mods import ScoreMod

__all__ = [
    "AuxOutput",
    "AuxRequest",
    "BlockMask",
    "and_masks",
    "create_block_mask",
    "create_mask",
    "flex_attention",
    "noop_mask",
    "or_masks",
]


def flex_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    score_mod=None,
    block_mask: BlockMask | None = None,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    kernel_options: dict | None = None,
    *,
    return_aux: AuxRequest | None = None,
) -> Tensor | tuple[Tensor, Tensor] | tuple[Tensor, AuxOutput]:
    """softmax(score_mod(scale · query keyᵀ) masked by block_mask) · value, as FlexAttention.

    Args:
        query: (B, Hq, L, E).
        key: (B, Hkv, S, E); Hkv must equal Hq unless `enable_gqa` (then it divides Hq).
        value: (B, Hkv, S, Ev).
        score_mod: ``score_mod(score, b, h, q_idx, kv_idx) -> score`` (FlexAttention's), or
            None. Called on blocks of scores with broadcastable index tensors (attention-gym's
            are written for that); one written for FlexAttention's per-element calls is
            detected on its first block and called per element under vmap. Gradients reach
            the tensors it closes over. A function of your own runs on the PyTorch kernel;
            attnkit's built-ins (`attnkit.score_mods.softcap`, `alibi`, `relative_bias`, the
            same signature) run in the compiled one.
        block_mask: a `BlockMask` from `create_block_mask` (or ``BlockMask.from_kv_blocks``)
            for L queries and S keys, or None (every key). Keys in unlisted blocks are masked,
            in full blocks allowed, in partial blocks where ``mask_mod`` holds. A mask_mod written
            for FlexAttention's per-element calls (under vmap) is detected and called so.
        scale: multiplies query·keyᵀ before score_mod; default 1/sqrt(E).
        enable_gqa: allow Hkv < Hq (query head h reads key/value head h // (Hq // Hkv)).
        return_lse: also return the log-sum-exp (B, Hq, L) (FlexAttention deprecates it for
            ``return_aux=AuxRequest(lse=True)``, which works too).
        kernel_options: FlexAttention's Triton tuning (block sizes, warps, stages, backend):
            accepted and ignored, attnkit chooses its kernels' blocking itself.
        return_aux: `AuxRequest(lse=True)` returns ``(out, AuxOutput(lse, None))``;
            ``max_scores=True`` raises NotImplementedError (attnkit's kernels do not keep it).

    Returns: out (B, Hq, L, Ev) in query's dtype; with ``return_lse`` ``(out, lse)``, with
    `return_aux` ``(out, AuxOutput)``. lse is float32 (float64 for float64 input) and -inf
    for a row that may attend to nothing, whose output is 0 (FlexAttention's rule too).

    On CUDA the call goes to torch's compiled FlexAttention with this block mask and score_mod
    (where Flex runs it: see `attnkit.attention`'s auto). Differences from FlexAttention on the
    CPU: it needs no torch.compile and has a backward; under torch.compile it runs eagerly (a
    graph break: ``fullgraph=True`` refuses it), the rest of the model compiled; the uncompiled
    FlexAttention fallback applies mask_mod everywhere and ignores the block lists, attnkit
    follows the lists as FlexAttention's compiled kernels do.
    """
    return _flex_attention(
        query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse, kernel_options,
        return_aux,
    )  # fmt: skip


# torch.compile runs this eagerly (a graph break around each call), also when the public
# function itself is compiled (torch.compile unwraps a disabled function it is handed, not one
# called inside): the mask's plan and the compiled CPU kernel are what make it fast, while a
# traced graph would hold the mask as an (L, S) tensor; FlexAttention's CUDA route compiles
# its own kernel anyway.
@torch.compiler.disable
def _flex_attention(
    query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse, kernel_options,
    return_aux,
):  # fmt: skip
    if return_lse and return_aux is not None:
        raise ValueError(
            "Cannot specify both return_lse and return_aux. "
            "return_lse is deprecated, please use return_aux=AuxRequest(lse=True) instead."
        )
    if return_aux is not None and return_aux.max_scores:
        raise NotImplementedError(
            "flex_attention: return_aux=AuxRequest(max_scores=True) is not computed by attnkit's "
            "kernels; ask for lse only"
        )
    if kernel_options is not None and not isinstance(kernel_options, dict):
        raise ValueError(
            f"kernel_options must be a dict or None, got {type(kernel_options).__name__}"
        )
    _check(query, key, value, enable_gqa, block_mask)
    mask = None
    if block_mask is not None and not is_noop_block_mask(block_mask):
        mask = from_block_mask(block_mask)
    if score_mod is not None and not isinstance(score_mod, ScoreMod):
        score_mod = ScoreFn(score_mod)  # per element under vmap if written that way
    want_lse = return_lse or (return_aux is not None and return_aux.lse)
    res = attention(query, key, value, mask=mask, scale=scale, score_mod=score_mod)
    if want_lse and res.lse is None:  # the backend chosen (SDPA) gives none: chunked does
        res = attention(
            query, key, value, mask=mask, scale=scale, score_mod=score_mod, backend="chunked"
        )
    if return_aux is not None:
        return res.out, AuxOutput(lse=res.lse if return_aux.lse else None, max_scores=None)
    return (res.out, res.lse) if return_lse else res.out


class NotFourDError(ValueError, NotImplementedError):
    """Inputs that are not 4-D: a ValueError (attnkit's rule for bad input) that is also the
    NotImplementedError FlexAttention raises for them."""


def _check(query, key, value, enable_gqa: bool, block_mask) -> None:
    """FlexAttention's refusals, as ValueError with the shapes (attention checks the rest)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise NotFourDError(f"flex_attention: {name} must be 4-D (B, H, L|S, E), got {got}")
    hq, hkv = query.shape[1], key.shape[1]
    if not enable_gqa and hq != hkv:
        raise ValueError(
            f"Expect query and key/value to have the same number of heads but got Hq={hq} and "
            f"Hkv={hkv}. Try setting enable_gqa=True for GQA."
        )
    if block_mask is None or is_noop_block_mask(block_mask):
        return
    n, s = (int(x) for x in block_mask.seq_lengths)
    if (query.shape[2], key.shape[2]) != (n, s):
        raise ValueError(
            f"block_mask was created for (L, S) = ({n}, {s}) but got q_len={query.shape[2]} and "
            f"kv_len={key.shape[2]}: create the block mask for these lengths"
        )
    mb = block_mask.kv_num_blocks.shape[0]
    if mb not in (1, query.shape[0]):
        raise ValueError(
            f"block_mask has batch size {mb}, query {query.shape[0]}: they must be equal or the "
            "block mask's 1"
        )
