"""Context parallelism: one sequence split across the ranks of a torch.distributed group.

Legend: B batch, H heads, Hkv key/value heads, N full length, P ranks, n = N/P, C width.

* `ring_attention`: K/V blocks travel around a ring, overlapped with computation; exact
  (log-sum-exp merge), any head count, key-padding masks, causal, GQA.
* `ulysses_attention`: the same interface with two all-to-alls over heads (H % P == 0).
* `shard` / `unshard` / `gather` / `positions`: the "contiguous" and "zigzag" layouts.
* `RingMultiHeadAttention`: `attnkit.MultiHeadAttention` whose attention runs across ranks.

Not imported by ``import attnkit`` (it pulls in torch.distributed): ``import attnkit.distributed``.
"""

from __future__ import annotations

from torch import Tensor

from attnkit.distributed.layout import LAYOUTS, gather, positions, shard, unshard
from attnkit.distributed.ring import ring_attention
from attnkit.distributed.ulysses import ulysses_attention
from attnkit.modules.attention import MultiHeadAttention

__all__ = [
    "LAYOUTS",
    "STRATEGIES",
    "RingMultiHeadAttention",
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
    ("ring" or "ulysses"). forward takes this rank's slice x (B, N/P, C) in that layout and
    a key-padding mask of this rank's keys (B|1, 1, 1, N/P), and returns (B, N/P, Co).
    Attention dropout is not supported (ValueError at construction).
    """

    def __init__(self, *args, group=None, layout: str = "contiguous", strategy: str = "ring", **kw):
        super().__init__(*args, **kw)
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {tuple(STRATEGIES)}, got {strategy!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if self.attend.dropout:
            raise ValueError(
                f"RingMultiHeadAttention: dropout must be 0, got {self.attend.dropout}"
            )
        self.group, self.layout, self.strategy = group, layout, strategy

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        pos: Tensor | None = None,
    ) -> Tensor:
        """x (B, N/P, C) -> (B, N/P, Co); ``pos`` (this rank's slice) is added to q and k inputs."""
        if context is not None:
            raise ValueError("RingMultiHeadAttention is self-attention only: context must be None")
        q, k, v = self.heads_qkv(x, pos=pos)  # (B, H, n, Dh), (B, Hkv, n, Dh) ×2
        attend = STRATEGIES[self.strategy]
        o = attend(
            q, k, v, causal=causal, mask=mask, scale=self.attend.scale, group=self.group,
            layout=self.layout,
        ).out  # (B, H, n, Dh)  # fmt: skip
        return self.proj(self.merge_heads(o))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, layout={self.layout!r}, strategy={self.strategy!r}"
