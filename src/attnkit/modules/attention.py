"""Multi-head attention as a module: project, split heads, attend, merge, project.

Dimensions: B batch, N query length, S key/context length, C model width,
Cc context width, H heads, Hkv key/value heads, Dh head width, Co output width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.functional.attention import AttentionOutput, attention
from attnkit.modules._checks import positive_int, probability
from attnkit.modules.projection import FusedQKV, SplitQKV

__all__ = ["Attend", "MultiHeadAttention"]


class Attend(nn.Module):
    """The named point where attention probabilities pass.

    Wraps `attnkit.attention`; `record_attention` hooks every `Attend` in a
    model and, while recording, switches it to a path that returns the
    probabilities. Nothing is stored on the module.
    """

    def __init__(self, *, scale: float | None = None, dropout: float = 0.0, backend: str = "auto"):
        super().__init__()
        self.scale, self.dropout, self.backend = scale, probability("dropout", dropout), backend
        self.need_weights = False  # set only by record_attention

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        causal: bool = False,
    ) -> AttentionOutput:
        """q (B, H, N, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) -> AttentionOutput."""
        return attention(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            causal=causal,
            scale=self.scale,
            dropout_p=self.dropout,
            training=self.training,
            need_weights=self.need_weights,
            backend="reference" if self.need_weights else self.backend,
        )

    def extra_repr(self) -> str:
        return f"scale={self.scale}, dropout={self.dropout}, backend={self.backend!r}"


class MultiHeadAttention(nn.Module):
    """Multi-head self- or cross-attention, batch first.

    Args:
        dim: input width C (None: inferred on first call, like LazyLinear).
        num_heads: H.
        out_dim: output width Co (default C). T2T-ViT maps width 49 to 64.
        context_dim: width Cc of the context in cross-attention (default C).
            When it differs from C the module is cross-attention only.
        num_kv_heads: Hkv < H gives grouped-query (Hkv > 1) or multi-query
            (Hkv = 1) attention: fewer key/value projections.
        head_dim: Dh (default C // H, or Co // H when dim is None).
        qkv_bias, out_bias: biases of the input and output projections.
        scale: scores multiplier (default 1/sqrt(Dh)).
        dropout: dropout on the attention probabilities while training.
        backend: the `attnkit.attention` backend ("auto" by default).
        device, dtype: of the parameters, as for `torch.nn.Linear`.

    Sizes must be positive integers; a bad one raises ValueError naming it.
    Parameters: `in_proj` (`FusedQKV` or `SplitQKV`), `proj` (H·Dh -> Co).
    """

    def __init__(
        self,
        dim: int | None,
        num_heads: int,
        *,
        out_dim: int | None = None,
        context_dim: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        out_bias: bool = True,
        scale: float | None = None,
        dropout: float = 0.0,
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        dim = positive_int("dim", dim, optional=True)
        out_dim = positive_int("out_dim", out_dim, optional=True)
        context_dim = positive_int("context_dim", context_dim, optional=True)
        num_heads = positive_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = _head_dim(dim, num_heads, num_kv_heads, head_dim, out_dim)
        self.dim = dim
        self.out_dim = dim if out_dim is None else out_dim
        q_width, kv_width = num_heads * self.head_dim, num_kv_heads * self.head_dim
        if context_dim is None or context_dim == dim:
            self.in_proj: FusedQKV | SplitQKV = FusedQKV(dim, q_width, kv_width, qkv_bias, **fk)
        else:
            self.in_proj = SplitQKV(dim, context_dim, q_width, kv_width, qkv_bias, **fk)
        self.attend = Attend(scale=scale, dropout=dropout, backend=backend)
        self.proj = nn.Linear(q_width, self.out_dim, bias=out_bias, **fk)

    def heads_qkv(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        pos: Tensor | None = None,
        context_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Project and split heads: q (B, H, N, Dh), k and v (B, Hkv, S, Dh)."""
        self._check(x, context, pos, context_pos)
        q, k, v = self.in_proj(x, context, pos, context_pos)
        q = q.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)  # (B, H, N, Dh)
        k = k.unflatten(-1, (self.num_kv_heads, -1)).transpose(1, 2)  # (B, Hkv, S, Dh)
        v = v.unflatten(-1, (self.num_kv_heads, -1)).transpose(1, 2)  # (B, Hkv, S, Dh)
        return q, k, v

    @staticmethod
    def merge_heads(o: Tensor) -> Tensor:
        """(B, H, N, Dh) -> (B, N, H·Dh)."""
        return o.transpose(1, 2).flatten(2)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        causal: bool = False,
        pos: Tensor | None = None,
        context_pos: Tensor | None = None,
    ) -> Tensor:
        """x (B, N, C), context (B, S, Cc) or None (self-attention) -> (B, N, Co).

        mask: boolean, True = may attend, broadcastable to (B, H, N, S) — a
            key-padding mask is (B, 1, 1, S) (see `attnkit.masks.padding`).
        bias: additive scores broadcastable to (B, H, N, S).
        causal: query i sees keys j <= i + S - N (bottom-right aligned).
        pos, context_pos: positions (B, N, C) / (B, S, Cc) added to the query
            and key inputs only, not to the values (DETR style). In
            self-attention `pos` is added to both q and k inputs.

        Queries whose mask row is all False get output `proj(0)` = the output
        bias (attention output 0), never NaN.
        """
        q, k, v = self.heads_qkv(x, context, pos=pos, context_pos=context_pos)
        o = self.attend(q, k, v, mask=mask, bias=bias, causal=causal).out  # (B, H, N, Dh)
        return self.proj(self.merge_heads(o))

    def _check(self, x, context, pos, context_pos) -> None:
        if not isinstance(x, Tensor) or x.dim() != 3:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (B, N, C), got {got}")
        if self.dim is not None and x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, N, {self.dim}), got {tuple(x.shape)}")
        if context is not None:
            want = self.in_proj.context_dim if self.dim is not None else x.shape[-1]
            if context.dim() != 3 or context.shape[0] != x.shape[0] or context.shape[-1] != want:
                raise ValueError(
                    f"context must have shape (B={x.shape[0]}, S, {want}), "
                    f"got {tuple(context.shape)}"
                )
        for name, p, ref in (("pos", pos, x), ("context_pos", context_pos, context)):
            if p is None:
                continue
            if ref is None:
                raise ValueError("context_pos needs a context")
            if torch.broadcast_shapes(p.shape, ref.shape) != ref.shape:
                raise ValueError(
                    f"{name} of shape {tuple(p.shape)} does not broadcast to {tuple(ref.shape)}"
                )

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, out_dim={self.out_dim}"
        )


def _head_dim(dim, num_heads, num_kv_heads, head_dim, out_dim) -> int:
    if positive_int("num_kv_heads", num_kv_heads) and num_heads % num_kv_heads:
        raise ValueError(
            f"num_kv_heads must be a positive divisor of num_heads={num_heads}, "
            f"got {num_kv_heads!r}"
        )
    if head_dim is not None:
        return positive_int("head_dim", head_dim)
    width = dim if dim is not None else out_dim
    if width is None:
        raise ValueError("dim=None (lazy) needs head_dim or out_dim to size the heads")
    if width % num_heads:
        raise ValueError(
            f"{'dim' if dim is not None else 'out_dim'}={width} is not divisible by "
            f"num_heads={num_heads}; pass head_dim to choose the head width"
        )
    return width // num_heads
