"""Modules with parameters: attention, blocks, embeddings, classic variants."""

from attnkit.modules.additive import AdditiveAttention, AttentionPooling, LuongAttention
from attnkit.modules.attention import Attend, MultiHeadAttention
from attnkit.modules.blocks import (
    EncoderBlock,
    FeedForward,
    PostNormResidual,
    PreNormResidual,
    residual,
)
from attnkit.modules.classic import T2TAttention, bert_self_attention, paper_attention
from attnkit.modules.embed import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from attnkit.modules.positions import AlibiBias, RelativePositionBias, RotaryEmbedding
from attnkit.modules.reset import reset_parameters

__all__ = [
    "AdditiveAttention",
    "AlibiBias",
    "Attend",
    "AttentionPooling",
    "EncoderBlock",
    "FeedForward",
    "LearnedPositionalEmbedding",
    "LuongAttention",
    "MultiHeadAttention",
    "PostNormResidual",
    "PreNormResidual",
    "RelativePositionBias",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "T2TAttention",
    "bert_self_attention",
    "paper_attention",
    "reset_parameters",
    "residual",
]
