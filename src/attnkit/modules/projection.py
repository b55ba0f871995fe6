"""Input projections of multi-head attention: x (and context) -> q, k, v.

Dimensions: B batch, N query length, S key length, C input width, Cc context
width, Q = H·Dh query width, K = Hkv·Dh key/value width.

Two layouts, chosen by `MultiHeadAttention` at construction:

* `FusedQKV` — one weight `(Q + 2K, C)` for self-attention in one matmul; cross
  attention with Cc == C slices the same weight (views, no copies).
* `SplitQKV` — `q: (Q, C)` and `kv: (2K, Cc)` when the context has its own width.

Both take optional positions added to the query and key inputs only (DETR,
Carion et al. 2020, §3.2): positions decide who attends to whom; values carry
the content alone.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def _add(x: Tensor, pos: Tensor | None) -> Tensor:
    return x if pos is None else x + pos


class FusedQKV(nn.Module):
    """q, k, v from one `(Q + 2K, C)` weight. `dim=None` infers C on first call."""

    def __init__(
        self, dim: int | None, q_width: int, kv_width: int, bias: bool, *, device=None, dtype=None
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        total = q_width + 2 * kv_width
        self.qkv = (
            nn.LazyLinear(total, bias=bias, **fk)
            if dim is None
            else nn.Linear(dim, total, bias, **fk)
        )
        self.q_width, self.kv_width = q_width, kv_width

    @property
    def context_dim(self) -> int:
        return self.qkv.in_features

    def _linear(self, x: Tensor, start: int, stop: int) -> Tensor:
        bias = None if self.qkv.bias is None else self.qkv.bias[start:stop]
        return F.linear(x, self.qkv.weight[start:stop], bias)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        pos: Tensor | None = None,
        context_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, N, C), context (B, S, C) or None -> q (B, N, Q), k (B, S, K), v (B, S, K)."""
        q_end, k_end = self.q_width, self.q_width + self.kv_width
        if context is None and pos is None:
            qkv = self.qkv(x)  # (B, N, Q + 2K)
            return qkv[..., :q_end], qkv[..., q_end:k_end], qkv[..., k_end:]
        if context is None:
            context, context_pos = x, pos
        q = self._linear(_add(x, pos), 0, q_end)
        if context_pos is None:
            kv = self._linear(context, q_end, self.qkv.out_features)  # (B, S, 2K)
            return q, kv[..., : self.kv_width], kv[..., self.kv_width :]
        k = self._linear(_add(context, context_pos), q_end, k_end)
        return q, k, self._linear(context, k_end, self.qkv.out_features)


class SplitQKV(nn.Module):
    """q from `(Q, C)`, k and v from `(2K, Cc)`: cross-attention over a context of width Cc."""

    def __init__(
        self,
        dim: int | None,
        context_dim: int,
        q_width: int,
        kv_width: int,
        bias: bool,
        *,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.q = (
            nn.LazyLinear(q_width, bias=bias, **fk)
            if dim is None
            else nn.Linear(dim, q_width, bias, **fk)
        )
        self.kv = nn.Linear(context_dim, 2 * kv_width, bias, **fk)
        self.kv_width = kv_width

    @property
    def context_dim(self) -> int:
        return self.kv.in_features

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        pos: Tensor | None = None,
        context_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, N, C), context (B, S, Cc) -> q (B, N, Q), k (B, S, K), v (B, S, K)."""
        if context is None:
            raise ValueError(
                f"this attention projects a context of width {self.context_dim} "
                "(context_dim != dim): pass context=(B, S, context_dim)"
            )
        q = self.q(_add(x, pos))
        if context_pos is None:
            kv = self.kv(context)  # (B, S, 2K)
            return q, kv[..., : self.kv_width], kv[..., self.kv_width :]
        w, b = self.kv.weight, self.kv.bias
        k = F.linear(
            _add(context, context_pos),
            w[: self.kv_width],
            None if b is None else b[: self.kv_width],
        )
        v = F.linear(context, w[self.kv_width :], None if b is None else b[self.kv_width :])
        return q, k, v
