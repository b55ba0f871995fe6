"""torch.nn.TransformerEncoderLayer <-> attnkit.EncoderBlock: same weights, same numbers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit import EncoderBlock, MultiHeadAttention, masks
from attnkit.convert import from_torch, to_torch
from attnkit.convert.torch_transformer import (
    encoder_from_torch,
    encoder_mask_from_torch,
    encoder_to_torch,
    load_torch_encoder_state,
)
from tests.convert.helpers import assert_close, padding, rand, randomize


def torch_layer(c=24, h=3, f=40, seed=0, **kwargs):
    torch.manual_seed(seed)
    return randomize(
        nn.TransformerEncoderLayer(c, h, f, dropout=0.1, **kwargs), seed=seed, scale=0.2
    )


CASES = [
    dict(norm_first=False, activation="relu"),
    dict(norm_first=True, activation="gelu"),
    dict(norm_first=True, activation="relu", bias=False, layer_norm_eps=1e-6),
    dict(norm_first=False, activation=nn.GELU(approximate="tanh"), layer_norm_eps=1e-3),
]


@pytest.mark.parametrize("kwargs", CASES, ids=["post-relu", "pre-gelu", "nobias", "gelu-tanh"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_layer_matches_torch_with_padding_and_causal(kwargs, batch_first):
    theirs = torch_layer(batch_first=batch_first, **kwargs)
    ours = encoder_from_torch(theirs, batch_first=True).eval()  # acknowledges (B, N, C)
    x = rand(3, 7, 24)
    kpm = padding(3, 7)
    causal = nn.Transformer.generate_square_subsequent_mask(7)  # float, -inf above diagonal

    def torch_call(**kw):
        xi = x if batch_first else x.transpose(0, 1)
        with torch.no_grad():
            y = theirs(xi, **kw)
        return y if batch_first else y.transpose(0, 1)

    with torch.no_grad():
        assert_close(ours(x), torch_call())
        want = torch_call(src_key_padding_mask=kpm)
        assert_close(ours(x, mask=masks.from_torch_key_padding_mask(kpm)), want)
        want = torch_call(src_mask=causal.isinf(), src_key_padding_mask=kpm)  # True = blocked
        assert_close(ours(x, mask=encoder_mask_from_torch(causal, kpm)), want)
        assert_close(ours(x, mask=masks.from_torch_key_padding_mask(kpm), causal=True), want)


def test_fully_padded_sequence_gives_zero_attention_not_nan():
    """torch 2.13: NaN on the inference fast path, attention output 0 on the regular path."""
    theirs = torch_layer(batch_first=True, norm_first=True)
    ours = encoder_from_torch(theirs).eval()
    x = rand(2, 5, 24)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1] = True
    with torch.no_grad():
        fast = theirs(x, src_key_padding_mask=kpm)  # eval + no_grad: the fast path
    regular = theirs(x, src_key_padding_mask=kpm).detach()  # autograd on: regular path
    got = ours(x, mask=masks.from_torch_key_padding_mask(kpm))
    assert torch.isfinite(got).all()
    assert_close(got.detach(), regular)
    assert_close(got[0].detach(), fast[0])
    assert fast[1].isnan().all() or torch.equal(fast[1], regular[1])  # whichever torch does
    got.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters())


@pytest.mark.parametrize("kwargs", CASES, ids=["post-relu", "pre-gelu", "nobias", "gelu-tanh"])
def test_round_trips_are_bit_identical(kwargs):
    theirs = torch_layer(batch_first=False, **kwargs)
    back = encoder_to_torch(encoder_from_torch(theirs, batch_first=True))  # keeps the layout
    assert not back.self_attn.batch_first
    assert back.norm_first == theirs.norm_first and back.norm1.eps == theirs.norm1.eps
    assert back.activation_relu_or_gelu == theirs.activation_relu_or_gelu
    for (k1, p1), (k2, p2) in zip(
        theirs.state_dict().items(), back.state_dict().items(), strict=True
    ):
        assert k1 == k2 and p1.dtype == p2.dtype and torch.equal(p1, p2)
    dropouts = (back.dropout.p, back.dropout1.p, back.dropout2.p, back.self_attn.dropout)
    assert dropouts == (0.1,) * 4


@pytest.mark.parametrize("norm_first", [True, False])
def test_attnkit_to_torch_matches(norm_first):
    ours = EncoderBlock(36, 4, 52, norm_first=norm_first, activation="relu", norm_eps=1e-6)
    ours.eval()
    theirs = encoder_to_torch(ours).eval()
    again = encoder_from_torch(theirs)
    for (k1, p1), (k2, p2) in zip(
        ours.state_dict().items(), again.state_dict().items(), strict=True
    ):
        assert k1 == k2 and torch.equal(p1, p2)
    x, kpm = rand(2, 11, 36), padding(2, 11, seed=3)
    with torch.no_grad():
        want = theirs(x, src_key_padding_mask=kpm)
        assert_close(ours(x, mask=masks.from_torch_key_padding_mask(kpm)), want)


def test_refusals_and_state_dict_errors():
    with pytest.raises(ValueError, match="GQA"):
        encoder_to_torch(EncoderBlock(24, 4, 8, attn=MultiHeadAttention(24, 4, num_kv_heads=2)))
    state = torch_layer().state_dict()
    state["linear1.weight"] = state["linear1.weight"][:, :20]
    del state["norm2.bias"]
    with pytest.raises(ValueError) as err:
        load_torch_encoder_state(EncoderBlock(24, 3, 40), state)
    msg = str(err.value)
    assert "'linear1.weight' has shape (40, 20), wanted (40, 24)" in msg
    assert "missing 'norm2.bias' (wanted (24,))" in msg
    with pytest.raises(ValueError, match="other than 0 and -inf"):
        encoder_mask_from_torch(torch.randn(4, 4))
    with pytest.raises(ValueError, match="TransformerEncoderLayer"):
        encoder_from_torch(nn.Linear(2, 2))


def test_encoder_block_methods_wrap_the_converters():
    layer = nn.TransformerEncoderLayer(12, 3, 20, batch_first=True, norm_first=True).eval()
    block = from_torch(layer).eval()
    x = torch.randn(2, 5, 12)
    torch.testing.assert_close(block(x), layer(x), atol=1e-6, rtol=0)
    back = to_torch(block, batch_first=False)
    assert not back.self_attn.batch_first
    for (_, a), (_, b) in zip(layer.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b)
