"""Self-attention over a feature map: the SAGAN / non-local block.

Dimensions: B batch, C channels, h × w spatial grid, P = h·w positions,
Ck key/query channels (C / reduction), Cv value channels.

SAGAN (Zhang et al. 2019, §3) and the non-local block (Wang et al. 2018, eq. 2
"embedded Gaussian") compute, for every position j,

    o_j = W_o Σ_i softmax_i(f(x_i)ᵀ g(x_j)) h(x_i),      y = x + γ · o

with 1×1 convolutions f, g (C -> Ck), h (C -> Cv), W_o (Cv -> C) and a learned
γ that starts at 0, so the block starts as the identity and learns how much
non-local evidence to add. The attention over all P positions goes through
`attnkit.modules.Attend`: it gets the O(P)-memory chunked backend for large
maps and its maps are visible to `record_attention` as (B, heads, P, P), query
index = j (row-major: j = row·w + col).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.modules._checks import positive_int
from attnkit.modules.attention import Attend

__all__ = ["SelfAttention2d"]


class SelfAttention2d(nn.Module):
    """y = x + γ · W_o(attention over positions), for any CNN feature map.

    Args:
        channels: C.
        reduction: Ck = C // reduction for queries and keys (SAGAN uses 8).
        value_channels: Cv (default C, as SAGAN; BigGAN and non-local use C // 2).
        num_heads: split Ck and Cv into heads (1 in both papers).
        scale: score multiplier; SAGAN and non-local use plain dot products (1.0);
            pass None for 1/sqrt(Ck / heads).
        gamma_init: initial γ (0: the block starts as the identity).
        device, dtype: of the parameters.
    """

    def __init__(
        self,
        channels: int,
        *,
        reduction: int = 8,
        value_channels: int | None = None,
        num_heads: int = 1,
        scale: float | None = 1.0,
        gamma_init: float = 0.0,
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        channels, reduction = (
            positive_int("channels", channels),
            positive_int("reduction", reduction),
        )
        num_heads = positive_int("num_heads", num_heads)
        key_channels = channels // reduction
        value_channels = positive_int("value_channels", value_channels, optional=True) or channels
        if key_channels < 1 or key_channels % num_heads or value_channels % num_heads:
            raise ValueError(
                f"channels={channels} // reduction={reduction} = {key_channels} key channels and "
                f"value_channels={value_channels} must be positive multiples of "
                f"num_heads={num_heads}"
            )
        self.num_heads = num_heads
        self.query = nn.Conv2d(channels, key_channels, 1, **fk)  # g in SAGAN's notation
        self.key = nn.Conv2d(channels, key_channels, 1, **fk)  # f
        self.value = nn.Conv2d(channels, value_channels, 1, **fk)  # h
        self.out = nn.Conv2d(value_channels, channels, 1, **fk)  # v / W_z
        self.gamma_init = float(gamma_init)
        self.gamma = nn.Parameter(torch.empty((), **fk))
        self.attend = Attend(scale=scale, dropout=dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """γ = gamma_init (the convolutions reset themselves)."""
        nn.init.constant_(self.gamma, self.gamma_init)

    def _heads(self, t: Tensor) -> Tensor:
        """(B, c, h, w) -> (B, heads, P, c / heads)."""
        b, c, _, _ = t.shape
        return t.reshape(b, self.num_heads, c // self.num_heads, -1).transpose(-1, -2)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, h, w) -> (B, C, h, w)."""
        if x.dim() != 4 or x.shape[1] != self.query.in_channels:
            raise ValueError(
                f"x must have shape (B, {self.query.in_channels}, h, w), got {tuple(x.shape)}"
            )
        b, _, h, w = x.shape
        q = self._heads(self.query(x))  # (B, heads, P, Ck/heads)
        k = self._heads(self.key(x))  # (B, heads, P, Ck/heads)
        v = self._heads(self.value(x))  # (B, heads, P, Cv/heads)
        o = self.attend(q, k, v).out  # (B, heads, P, Cv/heads)
        o = o.transpose(-1, -2).reshape(b, -1, h, w)  # (B, Cv, h, w)
        return x + self.gamma * self.out(o)
