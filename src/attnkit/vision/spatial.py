"""Spatial attention and CBAM (Woo et al. 2018).

Dimensions: B batch, C channels, H height, W width (feature maps are NCHW).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.modules._checks import positive_int
from attnkit.vision.channel import SqueezeExcitation, _check_map

__all__ = ["CBAM", "SpatialAttention"]


class SpatialAttention(nn.Module):
    """CBAM's spatial module (Woo et al. 2018, eq. 3): σ(conv_k×k([avg_c(x); max_c(x)])).

    Args:
        kernel_size: k, odd (paper: 7); "same" padding keeps H × W.

    `gates(x)` returns one gate per position (B, 1, H, W) in [0, 1];
    `forward(x)` = x · gates(x), shape (B, C, H, W), any C. `device`, `dtype`: of the
    parameters.
    """

    def __init__(
        self,
        kernel_size: int = 7,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if positive_int("kernel_size", kernel_size) % 2 == 0:
            raise ValueError(f"kernel_size must be an odd positive integer, got {kernel_size!r}")
        conv = nn.Conv2d(2, 1, kernel_size, padding=kernel_size // 2, device=device, dtype=dtype)
        self.conv = conv

    def gates(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> gates (B, 1, H, W) in [0, 1]."""
        if x.dim() != 4:
            raise ValueError(
                f"SpatialAttention: x must have shape (B, C, H, W), got {tuple(x.shape)}"
            )
        pooled = torch.cat([x.mean(1, keepdim=True), x.amax(1, keepdim=True)], 1)  # (B, 2, H, W)
        return self.conv(pooled).sigmoid()

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, C, H, W), each position scaled by its gate."""
        return x * self.gates(x)


class CBAM(nn.Module):
    """Convolutional block attention: channel gates, then spatial gates (Woo et al. 2018, eq. 1).

    out = s ⊙ c with c = x · Mc(x) (Mc: (B, C, 1, 1), avg+max pooled shared MLP)
    and s = Ms(c) (B, 1, H, W). Shape (B, C, H, W) -> (B, C, H, W).
    """

    def __init__(
        self,
        channels: int,
        reduction: int = 16,
        kernel_size: int = 7,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.channel = SqueezeExcitation(channels, reduction, pool="avg+max", **fk)
        self.spatial = SpatialAttention(kernel_size, **fk)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, C, H, W)."""
        _check_map(x, self.channel.channels, "CBAM")
        return self.spatial(self.channel(x))
