"""Vision attention: channel (SE), spatial and CBAM gates for CNNs; Swin window attention,
stages and model; self-attention over feature maps (SAGAN / non-local block)."""

from attnkit.vision.channel import SqueezeExcitation
from attnkit.vision.self_attention_2d import SelfAttention2d
from attnkit.vision.spatial import CBAM, SpatialAttention
from attnkit.vision.swin import PatchMerging, SwinConfig, SwinModel, SwinStage, stage_window
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
    "PatchMerging",
    "SelfAttention2d",
    "SpatialAttention",
    "SqueezeExcitation",
    "SwinBlock",
    "SwinConfig",
    "SwinModel",
    "SwinStage",
    "WindowAttention",
    "relative_position_index",
    "stage_window",
    "window_mask",
    "window_partition",
    "window_reverse",
]
