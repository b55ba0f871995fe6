"""Context parallelism: one sequence split across the ranks of a torch.distributed group.

Legend: B batch, H heads, Hkv key/value heads, N full length, P ranks, n = N/P, C width.

* `ring_attention`: K/V blocks travel around a ring, overlapped with computation; exact
  (log-sum-exp merge), any head count, key-padding masks, per-rank bias blocks (a tensor or
  a ``bias_fn`` of positions), causal, GQA. Attention dropout is refused (ValueError).
  A structured mask over the whole sequence (`attnkit.masks.window`, ...) makes each rank
  receive only the key spans its queries see; `exchange_pattern` tells which, per rank.
* `ulysses_attention`: the same interface with two all-to-alls over heads (H % P == 0).
* `shard` / `unshard` / `gather` / `positions`: the "contiguous" and "zigzag" layouts.
* `RingMultiHeadAttention`: `attnkit.MultiHeadAttention` whose attention runs across ranks.
* ``python -m attnkit.distributed.train_demo``: a context-parallel GPT training demo.

Not imported by ``import attnkit`` (it pulls in torch.distributed): ``import attnkit.distributed``.
"""

from __future__ import annotations

from torch import Tensor

from attnkit.distributed._structured import exchange_pattern
from attnkit.distributed.layout import LAYOUTS, gather, positions, shard, unshard
from attnkit.distributed.ring import group_info, ring_attention
from attnkit.distributed.ulysses import ulysses_attention
from attnkit.functional.rotary import apply_rotary
from attnkit.modules.attention import MultiHeadAttention
from attnkit.modules.positions import RotaryEmbedding

__all__ = [
    "LAYOUTS",
    "STRATEGIES",
    "RingMultiHeadAttention",
    "exchange_pattern",
    "gather",
    "positions",
    "ring_attention",
    "shard",
    "ulysses_attention",
    "unshard",
]

STRATEGIES = {"ring": ring_attention, "ulysses": ulysses_attention}


class RingMultiHeadAttention(MultiHeadAttention):
    """`MultiHeadAttention` (self-attention) over a sequence sharded across ranks.

    Same parameters as `MultiHeadAttention` (so its state dict loads unchanged) plus
    ``group`` (default the world), ``layout`` ("contiguous" or "zigzag") and ``strategy``
    ("ring" or "ulysses"). forward takes this rank's slice x (B, N/P, C) in that layout, a
    key-padding mask of this rank's keys (B|1, 1, 1, N/P) (with "ring", also a structured
    mask over the whole sequence: see `ring_attention`) and optionally ``bias``
    (B|1, H|1, N/P, N) or ``bias_fn`` (see `ring_attention`), and returns (B, N/P, Co).
    A `attnkit.modules.RotaryEmbedding` rotates q and k at their global positions.

    Attention dropout: forward in training mode with dropout > 0 is a ValueError (the
    strategies refuse it rather than drop a pattern no single process could check); in eval
    mode dropout does not act, so a model trained with it runs unchanged.
    """

    def __init__(self, *args, group=None, layout: str = "contiguous", strategy: str = "ring", **kw):
        super().__init__(*args, **kw)
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {tuple(STRATEGIES)}, got {strategy!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if self.rotary is not None and not isinstance(self.rotary, RotaryEmbedding):
            raise ValueError(
                "RingMultiHeadAttention: rotary must be an attnkit.modules.RotaryEmbedding "
                f"(rotated at each rank's global positions), got {type(self.rotary).__name__}"
            )
        self.group, self.layout, self.strategy = group, layout, strategy

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        bias_fn=None,
        causal: bool = False,
        pos: Tensor | None = None,
    ) -> Tensor:
        """x (B, N/P, C) -> (B, N/P, Co); ``pos`` (this rank's slice) is added to q and k inputs."""
        if context is not None:
            raise ValueError("RingMultiHeadAttention is self-attention only: context must be None")
        if self.training and self.attend.dropout:
            raise ValueError(
                f"RingMultiHeadAttention: dropout must be 0 in training, got "
                f"{self.attend.dropout} (attention dropout is not supported across ranks; "
                "set it to 0 or call .eval())"
            )
        q, k, v = self.heads_qkv(x, pos=pos)  # (B, H, n, Dh), (B, Hkv, n, Dh) ×2
        if self.rotary is not None:  # at this rank's global positions, not 0 .. n-1
            rank, world = group_info(self.group)
            idx = positions(q.shape[2] * world, rank, world, self.layout).to(q.device)
            cos, sin = self.rotary.tables(int(idx.max()) + 1, like=q)  # (N, R/2)
            cos, sin = cos[idx], sin[idx]  # (n, R/2)
            q, k = (apply_rotary(t, cos, sin, interleaved=self.rotary.interleaved) for t in (q, k))
        attend = STRATEGIES[self.strategy]
        o = attend(
            q, k, v, causal=causal, mask=mask, bias=bias, bias_fn=bias_fn, scale=self.attend.scale,
            group=self.group, layout=self.layout,
        ).out  # (B, H, n, Dh)  # fmt: skip
        return self.proj(self.merge_heads(o))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, layout={self.layout!r}, strategy={self.strategy!r}"
