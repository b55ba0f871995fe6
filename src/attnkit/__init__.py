"""attnkit: self-attention and multi-head self-attention for PyTorch.

Shapes: attention() takes q (B, H, N, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv);
modules take and return (B, N, C). Boolean masks mean True = may attend.
"""

from attnkit._version import __version__

# The public names load on first use (PEP 562), so that `import attnkit.cli.main` and
# `attnkit --help` do not pay for importing torch (about 2 s on a small CPU).
_LAZY = {
    "masks": "attnkit.functional.masks",
    "nn": "attnkit.nn",
    "positional": "attnkit.functional.positional",
    "score_mods": "attnkit.functional.score_mods",
    "BACKENDS": "attnkit.functional.attention",
    "AttentionOutput": "attnkit.functional.attention",
    "attention": "attnkit.functional.attention",
    "use_backend": "attnkit.functional.attention",
    "alibi_bias": "attnkit.functional.relative",
    "apply_rotary": "attnkit.functional.rotary",
    "rotary_tables": "attnkit.functional.rotary",
    "Attend": "attnkit.modules",
    "AlibiBias": "attnkit.modules",
    "RelativePositionBias": "attnkit.modules",
    "RotaryEmbedding": "attnkit.modules",
    "EncoderBlock": "attnkit.modules",
    "FeedForward": "attnkit.modules",
    "LearnedPositionalEmbedding": "attnkit.modules",
    "MultiHeadAttention": "attnkit.modules",
    "PostNormResidual": "attnkit.modules",
    "PreNormResidual": "attnkit.modules",
    "SinusoidalPositionalEncoding": "attnkit.modules",
    "T2TAttention": "attnkit.modules",
    "bert_self_attention": "attnkit.modules",
    "paper_attention": "attnkit.modules",
    "AttentionRecord": "attnkit.viz.record",
    "record_attention": "attnkit.viz.record",
}


def __getattr__(name: str):
    import importlib

    if name not in _LAZY:
        raise AttributeError(f"module 'attnkit' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    value = module if name in ("masks", "nn", "positional", "score_mods") else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "BACKENDS",
    "AlibiBias",
    "Attend",
    "AttentionOutput",
    "AttentionRecord",
    "EncoderBlock",
    "FeedForward",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "PostNormResidual",
    "PreNormResidual",
    "RelativePositionBias",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "T2TAttention",
    "__version__",
    "alibi_bias",
    "apply_rotary",
    "attention",
    "bert_self_attention",
    "masks",
    "nn",
    "paper_attention",
    "positional",
    "record_attention",
    "rotary_tables",
    "score_mods",
    "use_backend",
]
