"""Channel attention: squeeze-and-excitation (Hu et al. 2018).

Dimensions: B batch, C channels, H height, W width (feature maps are NCHW).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.modules._checks import positive_int

__all__ = ["SqueezeExcitation"]


def _check_map(x: Tensor, channels: int, who: str) -> None:
    if x.dim() != 4 or x.shape[1] != channels:
        raise ValueError(f"{who}: x must have shape (B, {channels}, H, W), got {tuple(x.shape)}")


class SqueezeExcitation(nn.Module):
    """Global average pool -> FC(C, C/r) -> ReLU -> FC(C/r, C) -> sigmoid -> scale.

    Args:
        channels: C.
        reduction: r; the hidden width is max(1, C // r) (paper default 16).
        pool: "avg" (SE, Hu et al. 2018, eq. 2) or "avg+max" (the shared MLP of
            CBAM's channel module, Woo et al. 2018, eq. 2: σ(MLP(avg) + MLP(max))).

    `gates(x)` returns the per-channel gates (B, C, 1, 1) in [0, 1];
    `forward(x)` = x · gates(x), shape (B, C, H, W). `device`, `dtype`: of the parameters.
    """

    def __init__(
        self,
        channels: int,
        reduction: int = 16,
        *,
        pool: str = "avg",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        channels, reduction = (
            positive_int("channels", channels),
            positive_int("reduction", reduction),
        )
        if pool not in ("avg", "avg+max"):
            raise ValueError(f"pool must be 'avg' or 'avg+max', got {pool!r}")
        hidden = max(1, channels // reduction)
        self.channels, self.pool = channels, pool
        # 1×1 convolutions are the FC layers applied to the pooled (B, C, 1, 1) map.
        self.mlp = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, **fk),
            nn.ReLU(inplace=True),
            nn.Conv2d(hidden, channels, 1, **fk),
        )

    def gates(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> gates (B, C, 1, 1) in [0, 1]."""
        _check_map(x, self.channels, type(self).__name__)
        logits = self.mlp(x.mean(dim=(2, 3), keepdim=True))  # (B, C, 1, 1)
        if self.pool == "avg+max":
            logits = logits + self.mlp(x.amax(dim=(2, 3), keepdim=True))
        return logits.sigmoid()

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, C, H, W), each channel scaled by its gate."""
        return x * self.gates(x)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, pool={self.pool!r}"
