"""Vision attention: channel (SE), spatial and CBAM gates for CNNs; Swin window attention."""

from attnkit.vision.channel import SqueezeExcitation
from attnkit.vision.spatial import CBAM, SpatialAttention
from attnkit.vision.window import (
    SwinBlock,
    WindowAttention,
    relative_position_index,
    window_mask,
    window_partition,
    window_reverse,
)

__all__ = [
    "CBAM",
    "SpatialAttention",
    "SqueezeExcitation",
    "SwinBlock",
    "WindowAttention",
    "relative_position_index",
    "window_mask",
    "window_partition",
    "window_reverse",
]
