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

from attnkit.distributed._block import BiasFn, check_bias
from attnkit.distributed.layout import check_layout, positions
from attnkit.distributed.ring import check_dropout, check_inputs, group_info
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
    bias: Tensor | None = None,
    bias_fn: BiasFn | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    group=None,
    layout: str = "contiguous",
) -> AttentionOutput:
    """`ring_attention`'s interface and result, computed with two all-to-alls over heads.

    q (B, H, N/P, D), k (B, Hkv, N/P, D), v (B, Hkv, N/P, Dv) this rank's shards in
    ``layout``; mask a key-padding mask of this rank's keys (B|1, 1, 1, N/P), True = may
    attend. H must be divisible by P (ValueError otherwise). ``bias`` (B|1, H|1, N/P, N) and
    ``bias_fn`` as in `ring_attention`; since each rank attends whole heads over the full
    sequence, the bias it needs is (B|1, H/P, N, N) (the tensor ``bias`` goes through the same
    all-to-all as q, its gradient back; ``bias_fn`` is called once on all N positions).
    ``dropout_p`` must be 0. Returns AttentionOutput(out (B, H, N/P, Dv), None, lse
    (B, H, N/P)); fully masked rows give out 0, lse -inf.
    """
    check_layout(layout)
    check_inputs(q, k, v, mask, "ulysses_attention")
    check_dropout(dropout_p, "ulysses_attention")
    rank, world = group_info(group)
    check_bias(bias, bias_fn, q, q.shape[2] * world, "ulysses_attention")
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
    full_bias = _head_bias(bias, bias_fn, q, rank, world, group, perm)  # (B|1, H/P|1, N, N)
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
        qh, kh, vh, mask=full_mask, bias=full_bias, causal=causal, scale=scale, dropout_p=0.0,
        training=False,
    )  # fmt: skip
    if perm is not None:  # back to rank order
        out, lse = out.index_select(2, order.to(q.device)), lse.index_select(2, order.to(q.device))
    out = _HeadsToSeq.apply(out, world, group)  # (B, H, n, Dv)
    lse = _HeadsToSeq.apply(lse.unsqueeze(-1), world, group).squeeze(-1)  # (B, H, n)
    return AttentionOutput(out, None, lse)


def _head_bias(bias, bias_fn, q: Tensor, rank: int, world: int, group, perm) -> Tensor | None:
    """The bias of this rank's H/P heads over the full sequence, rows and columns in position
    order: (B|1, H/P, N, N), or (B|1, 1, N, N) from a ``bias_fn`` that broadcasts over heads."""
    _, h, n, _ = q.shape
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    if bias is not None:
        # rows travel like q's positions; a bias shared by all heads is repeated first, since
        # every rank gets different heads (autograd sums the repeat back)
        full = bias.to(cdt).expand(bias.shape[0], h, n, n * world).contiguous()  # (B|1, H, n, N)
        full = _SeqToHeads.apply(full, world, group)  # (B|1, H/P, N, N), rows in rank order
        return full if perm is None else full.index_select(2, perm)
    if bias_fn is None:
        return None
    pos = torch.arange(n * world, device=q.device)
    with torch.no_grad():
        full = bias_fn(pos, pos).to(cdt)  # (B|1, H|1, N, N)
    if tuple(full.shape[2:]) != (n * world,) * 2:
        raise ValueError(
            f"bias_fn must return (B|1, H|1, nq, nk) with (nq, nk) = {(n * world,) * 2}, "
            f"got {tuple(full.shape)}"
        )
    hp = h // world
    return full if full.shape[1] == 1 else full[:, rank * hp : (rank + 1) * hp]
