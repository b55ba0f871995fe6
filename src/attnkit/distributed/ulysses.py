"""Ulysses sequence parallelism: all-to-all from sequence shards to head shards and back.

Legend: B batch, H query heads, Hkv key/value heads, n = N/P local length, D head width,
P ranks.

Each rank holds (B, H, n, D); one all-to-all gives every rank H/P whole heads over the full
sequence (B, H/P, N, D), where ordinary single-process attention runs (any mask, causal, the
compiled kernel); a second all-to-all returns (B, H, n, Dv) (Jacobs et al. 2023,
"DeepSpeed Ulysses"). Needs H divisible by P; key/value heads are repeated to H when Hkv is
not. Communication per rank is ~4/P of the local q, k, v, out volume, against ring attention's
(P-1) full K/V blocks: Ulysses moves less data, ring attention has no head-count limit and
overlaps its transfers with computation.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from attnkit.distributed.layout import check_layout, positions
from attnkit.distributed.ring import check_inputs, group_info
from attnkit.functional.attention import AttentionOutput
from attnkit.functional.chunked import chunked_attention

__all__ = ["ulysses_attention"]


def _a2a(x: Tensor, group) -> Tensor:
    """all_to_all over dim 0 of a (P, …) tensor: block p goes to rank p."""
    if x.shape[0] == 1:  # one rank: nothing to exchange
        return x.contiguous()
    x = x.contiguous()
    out = torch.empty_like(x)  # after contiguous(): empty_like keeps a view's strides
    dist.all_to_all_single(out, x, group=group)
    return out


def _seq_to_heads(x: Tensor, world: int, group) -> Tensor:
    """(B, H, n, D) sequence shard -> (B, H/P, P·n, D) head shard (shards in rank order)."""
    b, h, n, d = x.shape
    blocks = x.view(b, world, h // world, n, d).transpose(0, 1)  # (P, B, H/P, n, D)
    got = _a2a(blocks, group)  # (P, B, H/P, n, D): block p is rank p's positions
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // world, world * n, d)  # (B, H/P, P·n, D)


def _heads_to_seq(x: Tensor, world: int, group) -> Tensor:
    """(B, H/P, P·n, D) head shard -> (B, H, n, D) sequence shard: the inverse of the above."""
    b, hp, length, d = x.shape
    n = length // world
    blocks = x.view(b, hp, world, n, d).permute(2, 0, 1, 3, 4)  # (P, B, H/P, n, D)
    got = _a2a(blocks, group)  # (P, B, H/P, n, D): block p holds heads p·H/P …
    return got.transpose(0, 1).reshape(b, world * hp, n, d)  # (B, H, n, D)


class _SeqToHeads(torch.autograd.Function):
    # the adjoint of an all-to-all is the reverse all-to-all
    @staticmethod
    def forward(ctx, x, world, group):
        ctx.world, ctx.group = world, group
        return _seq_to_heads(x, world, group)

    @staticmethod
    def backward(ctx, g):
        return _heads_to_seq(g, ctx.world, ctx.group), None, None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, world, group):
        ctx.world, ctx.group = world, group
        return _heads_to_seq(x, world, group)

    @staticmethod
    def backward(ctx, g):
        return _seq_to_heads(g, ctx.world, ctx.group), None, None


def ulysses_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    mask: Tensor | None = None,
    scale: float | None = None,
    group=None,
    layout: str = "contiguous",
) -> AttentionOutput:
    """`ring_attention`'s interface and result, computed with two all-to-alls over heads.

    q (B, H, N/P, D), k (B, Hkv, N/P, D), v (B, Hkv, N/P, Dv) this rank's shards in
    ``layout``; mask a key-padding mask of this rank's keys (B|1, 1, 1, N/P), True = may
    attend. H must be divisible by P (ValueError otherwise). Returns AttentionOutput(out
    (B, H, N/P, Dv), None, lse (B, H, N/P)); fully masked rows give out 0, lse -inf.
    """
    check_layout(layout)
    check_inputs(q, k, v, mask, "ulysses_attention")
    _, world = group_info(group)
    h, n = q.shape[1], q.shape[2]
    if h % world:
        raise ValueError(
            f"ulysses_attention: H={h} query heads must be divisible by P={world} ranks"
        )
    if mask is not None and mask.shape[1] != 1:
        raise ValueError(
            f"ulysses_attention: mask must have shape (B|1, 1, 1, N/P), got {tuple(mask.shape)}"
        )
    if k.shape[1] % world:  # GQA with too few kv heads to split: repeat them (autograd sums back)
        k = k.repeat_interleave(h // k.shape[1], dim=1)
        v = v.repeat_interleave(h // v.shape[1], dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    length = n * world
    # shards arrive in rank order; `order` maps them to global positions
    order = torch.cat([positions(length, r, world, layout) for r in range(world)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(length)
    perm = None if layout == "contiguous" else inverse.to(q.device)
    qh, kh, vh = (_SeqToHeads.apply(t, world, group) for t in (q, k, v))  # (B, H/P, N, ·)
    if perm is not None:  # into global order, so that causal means position order
        qh, kh, vh = (t.index_select(2, perm) for t in (qh, kh, vh))
    full_mask = None
    if mask is not None:
        parts = [mask]
        if world > 1:
            parts = [torch.empty_like(mask) for _ in range(world)]
            dist.all_gather(parts, mask.contiguous(), group=group)
        full_mask = torch.cat(parts, 3)  # (B|1, 1, 1, N) in rank order
        if perm is not None:
            full_mask = full_mask.index_select(3, perm)
    out, lse = chunked_attention(
        qh, kh, vh, mask=full_mask, bias=None, causal=causal, scale=scale, dropout_p=0.0,
        training=False,
    )  # fmt: skip
    if perm is not None:  # back to rank order
        out, lse = out.index_select(2, order.to(q.device)), lse.index_select(2, order.to(q.device))
    out = _HeadsToSeq.apply(out, world, group)  # (B, H, n, Dv)
    lse = _HeadsToSeq.apply(lse.unsqueeze(-1), world, group).squeeze(-1)  # (B, H, n)
    return AttentionOutput(out, None, lse)
