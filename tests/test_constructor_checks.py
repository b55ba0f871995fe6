"""Constructors and configs refuse bad sizes and dropout rates with a ValueError naming the
argument (issue 16). One row per (class, argument); each row is tried with every bad value."""

from __future__ import annotations

import re

import pytest

from attnkit.models import (
    BertConfig,
    CachedMultiHeadAttention,
    CNNConfig,
    PatchEmbed,
    T2TEmbed,
    TransformerConfig,
    ViTConfig,
)
from attnkit.modules import (
    AdditiveAttention,
    Attend,
    AttentionPooling,
    EncoderBlock,
    FeedForward,
    LearnedPositionalEmbedding,
    LuongAttention,
    MultiHeadAttention,
    PostNormResidual,
    PreNormResidual,
    SinusoidalPositionalEncoding,
    T2TAttention,
    bert_self_attention,
    paper_attention,
)
from attnkit.modules._checks import nonnegative_int, positive_int, positive_number, probability
from attnkit.vision import (
    CBAM,
    PatchMerging,
    SelfAttention2d,
    SpatialAttention,
    SqueezeExcitation,
    SwinBlock,
    SwinConfig,
    SwinStage,
    WindowAttention,
)

BAD_SIZES = (0, -8, 2.5, True, "8")
BAD_COUNTS = (-1, 2.5, True, "1")  # counts where 0 is allowed
BAD_RATIOS = (0, -1.0, True, "4")
BAD_PROBABILITIES = (-0.1, 1.0, 1.5, True, "0.1")

BERT = dict(
    vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
)
SEQ = dict(src_vocab=10, tgt_vocab=10, d_model=8, num_heads=2, d_ff=16)


def _residual(cls):
    from torch import nn

    return lambda **kw: cls(nn.Identity(), nn.Identity(), **kw)


# (builder, fixed keyword arguments, argument under test, bad values)
ROWS = [
    *[(MultiHeadAttention, dict(dim=8, num_heads=2), a, BAD_SIZES) for a in ("dim", "num_heads", "out_dim", "context_dim", "num_kv_heads", "head_dim")],  # noqa: E501
    (MultiHeadAttention, dict(dim=8, num_heads=2), "dropout", BAD_PROBABILITIES),
    (CachedMultiHeadAttention, dict(dim=8, num_heads=2), "num_heads", BAD_SIZES),
    (Attend, {}, "dropout", BAD_PROBABILITIES),
    *[(paper_attention, dict(d_model=8, num_heads=2), a, BAD_SIZES) for a in ("d_model", "num_heads")],  # noqa: E501
    (paper_attention, dict(d_model=8, num_heads=2), "dropout", BAD_PROBABILITIES),
    *[(bert_self_attention, dict(dim=8, num_heads=2), a, BAD_SIZES) for a in ("dim", "num_heads")],
    *[(bert_self_attention, dict(dim=8, num_heads=2), a, BAD_PROBABILITIES) for a in ("attn_dropout", "hidden_dropout")],  # noqa: E501
    *[(FeedForward, dict(dim=8, hidden=16), a, BAD_SIZES) for a in ("dim", "hidden", "out_dim")],
    (FeedForward, dict(dim=8, hidden=16), "dropout", BAD_PROBABILITIES),
    (_residual(PreNormResidual), {}, "dropout", BAD_PROBABILITIES),
    (_residual(PostNormResidual), {}, "dropout", BAD_PROBABILITIES),
    *[(EncoderBlock, dict(dim=8, num_heads=2, hidden=16), a, BAD_SIZES) for a in ("dim", "num_heads", "hidden")],  # noqa: E501
    *[(EncoderBlock, dict(dim=8, num_heads=2, hidden=16), a, BAD_PROBABILITIES) for a in ("dropout", "attn_dropout")],  # noqa: E501
    *[(LearnedPositionalEmbedding, dict(max_len=10, dim=8), a, BAD_SIZES) for a in ("max_len", "dim")],  # noqa: E501
    *[(SinusoidalPositionalEncoding, dict(dim=8, max_len=10), a, BAD_SIZES) for a in ("dim", "max_len")],  # noqa: E501
    *[(T2TAttention, dict(dim=9, chan=8), a, BAD_SIZES) for a in ("dim", "chan", "num_heads")],
    *[(T2TAttention, dict(dim=9, chan=8), a, BAD_PROBABILITIES) for a in ("attn_dropout", "proj_dropout")],  # noqa: E501
    *[(AdditiveAttention, dict(dim=8, hidden=4), a, BAD_SIZES) for a in ("dim", "key_dim", "hidden")],  # noqa: E501
    (AdditiveAttention, dict(dim=8), "dropout", BAD_PROBABILITIES),
    *[(LuongAttention, dict(dim=8), a, BAD_SIZES) for a in ("dim", "key_dim")],
    (LuongAttention, {}, "dropout", BAD_PROBABILITIES),
    *[(AttentionPooling, dict(dim=8), a, BAD_SIZES) for a in ("dim", "hidden")],
    (AttentionPooling, dict(dim=8), "dropout", BAD_PROBABILITIES),
    *[(BertConfig, BERT, a, BAD_SIZES) for a in (*BERT, "max_position_embeddings", "type_vocab_size")],  # noqa: E501
    *[(BertConfig, BERT, a, BAD_PROBABILITIES) for a in ("hidden_dropout_prob", "attention_probs_dropout_prob")],  # noqa: E501
    *[(TransformerConfig, SEQ, a, BAD_SIZES) for a in (*SEQ, "max_len")],
    *[(TransformerConfig, SEQ, a, BAD_COUNTS) for a in ("encoder_layers", "decoder_layers")],
    *[(TransformerConfig, SEQ, a, BAD_PROBABILITIES) for a in ("dropout", "attn_dropout", "label_smoothing")],  # noqa: E501
    *[(ViTConfig, {}, a, BAD_SIZES) for a in ("image_size", "in_chans", "patch_size", "t2t_chan", "dim", "depth", "num_heads")],  # noqa: E501
    (ViTConfig, {}, "num_classes", BAD_COUNTS),
    (ViTConfig, {}, "mlp_ratio", BAD_RATIOS),
    (ViTConfig, {}, "t2t_splits", [((0, 1),), ((3, -1),), ((3, 1.5),), ((3,),), ()]),
    *[(ViTConfig, {}, a, BAD_PROBABILITIES) for a in ("dropout", "attn_dropout")],
    *[(CNNConfig, {}, a, BAD_SIZES) for a in ("image_size", "in_chans", "num_classes", "reduction", "kernel_size")],  # noqa: E501
    (CNNConfig, {}, "widths", [(), (8, 0), (True,), (2.5, 8)]),
    *[(PatchEmbed, dict(image_size=8, patch_size=2, in_chans=1, dim=8), a, BAD_SIZES) for a in ("image_size", "patch_size", "in_chans", "dim")],  # noqa: E501
    *[(T2TEmbed, dict(image_size=8, in_chans=1, dim=8, splits=((3, 2),), chan=4), a, BAD_SIZES) for a in ("image_size", "in_chans", "dim", "chan")],  # noqa: E501
    (T2TEmbed, dict(image_size=8, in_chans=1, dim=8, splits=((3, 2),), chan=4), "mlp_ratio", BAD_RATIOS),  # noqa: E501
    (T2TEmbed, dict(image_size=8, in_chans=1, dim=8, splits=((3, 2),), chan=4), "splits", [(), ((0, 2),), ((3, 0),)]),  # noqa: E501
    *[(SqueezeExcitation, dict(channels=8), a, BAD_SIZES) for a in ("channels", "reduction")],
    (SpatialAttention, {}, "kernel_size", (*BAD_SIZES, 4)),
    *[(CBAM, dict(channels=8), a, BAD_SIZES) for a in ("channels", "reduction", "kernel_size")],
    *[(SelfAttention2d, dict(channels=8), a, BAD_SIZES) for a in ("channels", "reduction", "value_channels", "num_heads")],  # noqa: E501
    (SelfAttention2d, dict(channels=8), "dropout", BAD_PROBABILITIES),
    *[(WindowAttention, dict(dim=8, num_heads=2, window_size=4), a, BAD_SIZES) for a in ("dim", "num_heads", "window_size")],  # noqa: E501
    (WindowAttention, dict(dim=8, num_heads=2, window_size=4), "shift", (-1, 4, 2.5, True)),
    (WindowAttention, dict(dim=8, num_heads=2, window_size=4), "attn_dropout", BAD_PROBABILITIES),
    *[(SwinBlock, dict(dim=8, num_heads=2, window_size=4), a, BAD_SIZES) for a in ("dim", "num_heads", "window_size")],  # noqa: E501
    (SwinBlock, dict(dim=8, num_heads=2, window_size=4), "mlp_ratio", BAD_RATIOS),
    *[(SwinBlock, dict(dim=8, num_heads=2, window_size=4), a, BAD_PROBABILITIES) for a in ("dropout", "attn_dropout")],  # noqa: E501
    (PatchMerging, dict(dim=8), "dim", BAD_SIZES),
    *[(SwinStage, dict(dim=8, depth=2, num_heads=2, window_size=4, grid=(6, 6)), a, BAD_SIZES) for a in ("dim", "depth", "num_heads", "window_size")],  # noqa: E501
    *[(SwinConfig, {}, a, BAD_SIZES) for a in ("image_size", "patch_size", "in_chans", "embed_dim", "window_size")],  # noqa: E501
    (SwinConfig, {}, "depths", [(2, 2, 0, 2), (2, 2, 6, -2), (2, 2, 6, True)]),
    (SwinConfig, {}, "num_heads", [(3, 6, 12, 0), (3, 6, 12, 2.5)]),
    (SwinConfig, {}, "mlp_ratio", BAD_RATIOS),
    *[(SwinConfig, {}, a, BAD_PROBABILITIES) for a in ("dropout", "attn_dropout")],
]  # fmt: skip

CASES = [
    pytest.param(build, fixed, arg, bad, id=f"{getattr(build, '__name__', 'residual')}-{arg}={bad!r}")  # noqa: E501
    for build, fixed, arg, bads in ROWS
    for bad in bads
]  # fmt: skip


@pytest.mark.parametrize(("build", "fixed", "arg", "bad"), CASES)
def test_bad_argument_raises_value_error_naming_it(build, fixed, arg, bad):
    with pytest.raises(ValueError, match=re.escape(arg)) as info:
        build(**{**fixed, arg: bad})
    # and the value it got (sequences: the bad element)
    assert repr(bad) in str(info.value) or isinstance(bad, tuple)


@pytest.mark.parametrize(
    ("build", "fixed"), list(dict.fromkeys((r[0], tuple(r[1].items())) for r in ROWS))
)
def test_the_fixed_arguments_are_valid(build, fixed):
    build(**dict(fixed))  # so each row's error comes from the argument under test


def test_multi_head_attention_issue_16():
    """MultiHeadAttention(-8, 2) raised a RuntimeError from torch; (0, 2) was accepted."""
    for dim in (-8, 0):
        with pytest.raises(ValueError, match=f"dim must be a positive integer, got {dim}"):
            MultiHeadAttention(dim, 2)


def test_checks_return_the_value():
    import numpy as np

    assert positive_int("n", np.int64(3)) == 3 and type(positive_int("n", np.int64(3))) is int
    assert positive_int("n", None, optional=True) is None
    assert nonnegative_int("n", 0) == 0
    assert positive_number("r", 2) == 2.0
    assert probability("p", 0) == 0.0 and probability("p", 0.5) == 0.5
    with pytest.raises(ValueError, match="n must be a positive integer, got None"):
        positive_int("n", None)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\), got nan"):
        probability("p", float("nan"))
    with pytest.raises(ValueError, match="r must be a positive number, got inf"):
        positive_number("r", float("inf"))
