"""Input projections of multi-head attention: query, key, value inputs -> q, k, v.

Dimensions: B batch, N query length, S key/value length, C query width, Ck key
width, Cv value width (Ck = Cv = Cc, the context width, when one tensor gives
keys and values), Q = H·Dk query width, K = Hkv·Dk key width, V = Hkv·Dv value
width.

Three layouts, chosen by `MultiHeadAttention` at construction:

* `FusedQKV` — one weight `(Q + K + V, C)` for self-attention in one matmul;
  cross-attention with Ck = Cv = C slices the same weight (views, no copies).
* `SplitQKV` — `q: (Q, C)` and `kv: (K + V, Cc)` when the context has its own width.
* `SeparateQKV` — `q: (Q, C)`, `k: (K, Ck)`, `v: (V, Cv)` when keys and values
  have different widths (`torch.nn.MultiheadAttention` with kdim != vdim).

All take optional positions added to the query and key inputs only (DETR,
Carion et al. 2020, §3.2): positions decide who attends to whom; values carry
the content alone. `key` None means self-attention (keys and values from the
query input, `pos` added to queries and keys); `value` None means values from
the key input.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def _add(x: Tensor, pos: Tensor | None) -> Tensor:
    return x if pos is None else x + pos


def _linear(dim: int | None, width: int, bias: bool, fk: dict) -> nn.Linear:
    return (
        nn.LazyLinear(width, bias=bias, **fk) if dim is None else nn.Linear(dim, width, bias, **fk)
    )


def _rows(lin: nn.Linear, x: Tensor, start: int, stop: int) -> Tensor:
    """x @ W[start:stop].T + b[start:stop]: part of a packed projection, without copies."""
    bias = None if lin.bias is None else lin.bias[start:stop]
    return F.linear(x, lin.weight[start:stop], bias)


def _resolve(x, key, value, pos, key_pos):
    """Self-attention (key None) reads keys and values from x, with x's positions on the keys."""
    if key is None:
        return x, x, pos
    return key, (key if value is None else value), key_pos


class FusedQKV(nn.Module):
    """q, k, v from one `(Q + K + V, C)` weight. `dim=None` infers C on first call."""

    def __init__(
        self,
        dim: int | None,
        q_width: int,
        kv_width: int,
        bias: bool,
        *,
        v_width: int | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.q_width, self.k_width = q_width, kv_width
        self.v_width = kv_width if v_width is None else v_width
        total = q_width + kv_width + self.v_width
        self.qkv = _linear(dim, total, bias, {"device": device, "dtype": dtype})

    @property
    def context_dim(self) -> int:
        return self.qkv.in_features

    key_dim = value_dim = context_dim

    def forward(
        self,
        x: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        pos: Tensor | None = None,
        key_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, N, C), key and value (B, S, C) or None -> q (B, N, Q), k (B, S, K), v (B, S, V)."""
        q_end, k_end = self.q_width, self.q_width + self.k_width
        if key is None and pos is None:
            qkv = self.qkv(x)  # (B, N, Q + K + V)
            return qkv[..., :q_end], qkv[..., q_end:k_end], qkv[..., k_end:]
        key, value, key_pos = _resolve(x, key, value, pos, key_pos)
        q = _rows(self.qkv, _add(x, pos), 0, q_end)
        if value is key and key_pos is None:
            kv = _rows(self.qkv, key, q_end, self.qkv.out_features)  # (B, S, K + V)
            return q, kv[..., : self.k_width], kv[..., self.k_width :]
        k = _rows(self.qkv, _add(key, key_pos), q_end, k_end)
        return q, k, _rows(self.qkv, value, k_end, self.qkv.out_features)


class SplitQKV(nn.Module):
    """q from `(Q, C)`, k and v from `(K + V, Cc)`: cross-attention over a context of width Cc."""

    def __init__(
        self,
        dim: int | None,
        context_dim: int,
        q_width: int,
        kv_width: int,
        bias: bool,
        *,
        v_width: int | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.k_width = kv_width
        v_width = kv_width if v_width is None else v_width
        self.q = _linear(dim, q_width, bias, fk)
        self.kv = nn.Linear(context_dim, kv_width + v_width, bias, **fk)

    @property
    def context_dim(self) -> int:
        return self.kv.in_features

    key_dim = value_dim = context_dim

    def forward(
        self,
        x: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        pos: Tensor | None = None,
        key_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, N, C), key and value (B, S, Cc) -> q (B, N, Q), k (B, S, K), v (B, S, V)."""
        if key is None:
            raise ValueError(
                f"this attention projects a context of width {self.context_dim} "
                "(context_dim != dim): pass key (or context)=(B, S, context_dim)"
            )
        value = key if value is None else value
        q = self.q(_add(x, pos))
        if value is key and key_pos is None:
            kv = self.kv(key)  # (B, S, K + V)
            return q, kv[..., : self.k_width], kv[..., self.k_width :]
        k = _rows(self.kv, _add(key, key_pos), 0, self.k_width)
        return q, k, _rows(self.kv, value, self.k_width, self.kv.out_features)


class SeparateQKV(nn.Module):
    """q from `(Q, C)`, k from `(K, Ck)`, v from `(V, Cv)`: keys and values of different widths."""

    def __init__(
        self,
        dim: int | None,
        key_dim: int,
        value_dim: int,
        q_width: int,
        k_width: int,
        v_width: int,
        bias: bool,
        *,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.q = _linear(dim, q_width, bias, fk)
        self.k = nn.Linear(key_dim, k_width, bias, **fk)
        self.v = nn.Linear(value_dim, v_width, bias, **fk)

    @property
    def key_dim(self) -> int:
        return self.k.in_features

    @property
    def value_dim(self) -> int:
        return self.v.in_features

    def forward(
        self,
        x: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        pos: Tensor | None = None,
        key_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, N, C), key (B, S, Ck), value (B, S, Cv) -> q (B, N, Q), k (B, S, K), v (B, S, V)"""
        if key is None or value is None:
            raise ValueError(
                f"this attention projects keys of width {self.key_dim} and values of width "
                f"{self.value_dim}: pass key=(B, S, {self.key_dim}) and "
                f"value=(B, S, {self.value_dim})"
            )
        return self.q(_add(x, pos)), self.k(_add(key, key_pos)), self.v(value)
