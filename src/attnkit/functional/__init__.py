"""Parameter-free core: attention, masks, positional encodings, relative positions."""

from attnkit.functional import masks, positional, score_mods
from attnkit.functional.attention import BACKENDS, AttentionOutput, attention, use_backend
from attnkit.functional.relative import (
    alibi_bias,
    alibi_slopes,
    padding_positions,
    relative_position_bucket,
)
from attnkit.functional.rotary import apply_rotary, rotary_tables

__all__ = [
    "BACKENDS",
    "AttentionOutput",
    "alibi_bias",
    "alibi_slopes",
    "apply_rotary",
    "attention",
    "masks",
    "padding_positions",
    "positional",
    "relative_position_bucket",
    "rotary_tables",
    "score_mods",
    "use_backend",
]
