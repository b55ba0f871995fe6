"""attnkit: self-attention and multi-head self-attention for PyTorch.

Shapes: attention() takes q (B, H, N, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv);
modules take and return (B, N, C). Boolean masks mean True = may attend.
"""

from attnkit._version import __version__
from attnkit.functional import masks, positional
from attnkit.functional.attention import BACKENDS, AttentionOutput, attention, use_backend
from attnkit.modules import (
    Attend,
    EncoderBlock,
    FeedForward,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    T2TAttention,
    bert_self_attention,
    paper_attention,
)
from attnkit.viz.record import AttentionRecord, record_attention

__all__ = [
    "BACKENDS",
    "Attend",
    "AttentionOutput",
    "AttentionRecord",
    "EncoderBlock",
    "FeedForward",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "SinusoidalPositionalEncoding",
    "T2TAttention",
    "__version__",
    "attention",
    "bert_self_attention",
    "masks",
    "paper_attention",
    "positional",
    "record_attention",
    "use_backend",
]
