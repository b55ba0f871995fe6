"""Models built from attnkit's modules."""

from attnkit.models.decoding import CachedMultiHeadAttention, KVCache, beam_search, greedy
from attnkit.models.transformer import (
    PRESETS,
    CausalLM,
    DecoderBlock,
    Transformer,
    TransformerConfig,
    pad_mask,
    preset,
)

__all__ = [
    "PRESETS",
    "CachedMultiHeadAttention",
    "CausalLM",
    "DecoderBlock",
    "KVCache",
    "Transformer",
    "TransformerConfig",
    "beam_search",
    "greedy",
    "pad_mask",
    "preset",
]
