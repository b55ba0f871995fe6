"""torch.nn.TransformerDecoderLayer <-> attnkit DecoderBlock: same weights, same numbers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.convert import from_torch, to_torch
from attnkit.convert.torch_decoder import (
    decoder_config_from_torch,
    decoder_from_torch,
    decoder_masks_from_torch,
    decoder_to_torch,
    load_torch_decoder_state,
)
from attnkit.models import DecoderBlock, KVCache, TransformerConfig
from tests.convert.helpers import assert_close, padding, rand, randomize

C, H, F, T, S = 24, 3, 40, 7, 11


def torch_layer(seed=0, **kwargs):
    torch.manual_seed(seed)
    return randomize(
        nn.TransformerDecoderLayer(C, H, F, dropout=0.1, **kwargs), seed=seed, scale=0.2
    )


def run_torch(layer, x, memory, **masks):
    """Batch-first in and out, whatever the layer's batch_first."""
    bf = layer.self_attn.batch_first
    if not bf:
        x, memory = x.transpose(0, 1), memory.transpose(0, 1)
    with torch.no_grad():
        y = layer(x, memory, **masks)
    return y if bf else y.transpose(0, 1)


CASES = [
    dict(norm_first=False, activation="relu"),
    dict(norm_first=True, activation="gelu"),
    dict(norm_first=True, activation="relu", bias=False, layer_norm_eps=1e-6),
    dict(norm_first=False, activation=nn.GELU(approximate="tanh"), layer_norm_eps=1e-3),
]
IDS = ["post-relu", "pre-gelu", "nobias", "gelu-tanh"]


@pytest.mark.parametrize("kwargs", CASES, ids=IDS)
@pytest.mark.parametrize("batch_first", [True, False])
def test_decoder_layer_matches_torch_with_causal_and_padding(kwargs, batch_first):
    theirs = torch_layer(batch_first=batch_first, **kwargs)
    ours = decoder_from_torch(theirs, batch_first=True).eval()  # acknowledges (B, T, C)
    x, memory = rand(3, T, C), rand(3, S, C, seed=2)
    causal = nn.Transformer.generate_square_subsequent_mask(T)  # float, -inf above diagonal
    tkpm, mkpm = padding(3, T), padding(3, S, seed=3)
    with torch.no_grad():
        want = run_torch(theirs, x, memory, tgt_mask=causal, tgt_is_causal=True)
        mask, mem = decoder_masks_from_torch(tgt_mask=causal)
        assert mask is None and mem is None
        assert_close(ours(x, memory), want)
        torch_masks = dict(
            tgt_mask=causal.isinf(), tgt_key_padding_mask=tkpm, memory_key_padding_mask=mkpm
        )
        want = run_torch(theirs, x, memory, **torch_masks)
        mask, mem = decoder_masks_from_torch(**torch_masks)
        assert_close(ours(x, memory, mask=mask, memory_mask=mem), want)


def test_more_than_causal_and_memory_masks_convert():
    theirs = torch_layer(batch_first=True, norm_first=True)
    ours = decoder_from_torch(theirs).eval()
    x, memory = rand(2, T, C), rand(2, S, C, seed=2)
    tgt_mask = torch.ones(T, T, dtype=torch.bool).triu(1)  # True = blocked
    tgt_mask[4, 1] = True  # also block one past key
    memory_mask = rand(T, S, seed=5) > 0.7
    memory_mask[:, 0] = False
    torch_masks = dict(tgt_mask=tgt_mask, memory_mask=memory_mask)
    with torch.no_grad():
        want = run_torch(theirs, x, memory, **torch_masks)
        mask, mem = decoder_masks_from_torch(**torch_masks)
        assert_close(ours(x, memory, mask=mask, memory_mask=mem), want)


def test_fully_masked_rows_give_zero_attention_not_nan():
    """torch 2.13's decoder layer has no fast path; it gives attention output 0 too."""
    theirs = torch_layer(batch_first=True, norm_first=True)
    ours = decoder_from_torch(theirs).eval()
    x, memory = rand(2, T, C), rand(2, S, C, seed=2)
    tkpm = torch.zeros(2, T, dtype=torch.bool)
    tkpm[1, 0] = True  # causal: query 0 of sequence 1 sees only key 0, which is padding
    mkpm = torch.zeros(2, S, dtype=torch.bool)
    mkpm[0] = True  # sequence 0 has no memory at all
    torch_masks = dict(
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(T),
        tgt_key_padding_mask=tkpm.float().masked_fill(tkpm, float("-inf")),
        memory_key_padding_mask=mkpm.float().masked_fill(mkpm, float("-inf")),
    )
    mask, mem = decoder_masks_from_torch(**torch_masks)
    with torch.no_grad():
        want = run_torch(theirs, x, memory, **torch_masks)
    got = ours(x, memory, mask=mask, memory_mask=mem)
    assert torch.isfinite(got).all() and torch.isfinite(want).all()
    assert_close(got.detach(), want)
    got.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters())


@pytest.mark.parametrize("kwargs", CASES, ids=IDS)
def test_round_trips_are_bit_identical(kwargs):
    theirs = torch_layer(batch_first=False, **kwargs)
    with torch.no_grad():
        theirs.dropout3.p, theirs.multihead_attn.dropout = 0.2, 0.3
    back = decoder_to_torch(decoder_from_torch(theirs, batch_first=True))  # keeps the layout
    assert back.norm_first == theirs.norm_first and back.norm3.eps == theirs.norm3.eps
    assert type(back.activation) is type(theirs.activation) or back.activation is theirs.activation
    assert not back.self_attn.batch_first
    for (k1, p1), (k2, p2) in zip(
        theirs.state_dict().items(), back.state_dict().items(), strict=True
    ):
        assert k1 == k2 and p1.dtype == p2.dtype and torch.equal(p1, p2)
    dropouts = [back.dropout.p, back.dropout1.p, back.dropout2.p, back.dropout3.p]
    dropouts += [back.self_attn.dropout, back.multihead_attn.dropout]
    assert dropouts == [0.1, 0.1, 0.1, 0.2, 0.1, 0.3]


@pytest.mark.parametrize("norm_first", [True, False])
def test_attnkit_to_torch_matches_and_comes_back(norm_first):
    cfg = TransformerConfig(
        5, 5, d_model=36, num_heads=4, d_ff=52, norm_first=norm_first, norm_eps=1e-6, dropout=0.0
    )
    ours = DecoderBlock(cfg).eval()
    theirs = decoder_to_torch(ours).eval()
    again = decoder_from_torch(theirs)
    for (k1, p1), (k2, p2) in zip(
        ours.state_dict().items(), again.state_dict().items(), strict=True
    ):
        assert k1 == k2 and torch.equal(p1, p2)
    x, memory, mkpm = rand(2, 9, 36), rand(2, 13, 36, seed=2), padding(2, 13)
    causal = nn.Transformer.generate_square_subsequent_mask(9)
    with torch.no_grad():
        want = theirs(x, memory, tgt_mask=causal, memory_key_padding_mask=mkpm)
        mask, mem = decoder_masks_from_torch(tgt_mask=causal, memory_key_padding_mask=mkpm)
        assert_close(ours(x, memory, mask=mask, memory_mask=mem), want)


def test_cached_decoding_matches_torch_on_the_whole_sequence():
    theirs = torch_layer(batch_first=True, norm_first=True, activation="gelu")
    ours = from_torch(theirs).eval()
    x, memory = rand(2, T, C), rand(2, S, C, seed=2)
    want = run_torch(theirs, x, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(T))
    cache, steps = KVCache(), []
    with torch.no_grad():
        for t in range(T):
            steps.append(ours(x[:, t : t + 1], memory, cache=cache))
            cache.length += 1
    assert_close(torch.cat(steps, dim=1), want)


def test_config_refusals_and_state_dict_errors():
    layer = torch_layer(batch_first=True)
    cfg = decoder_config_from_torch(layer)
    assert (cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.dropout) == (C, H, F, 0.1)
    with pytest.raises(ValueError, match="not causal in torch"):
        decoder_masks_from_torch(tgt_key_padding_mask=padding(2, T))
    with pytest.raises(ValueError, match="lets a query see a later key"):
        decoder_masks_from_torch(tgt_mask=torch.zeros(T, T, dtype=torch.bool))
    with pytest.raises(ValueError, match="other than 0 and -inf"):
        decoder_masks_from_torch(tgt_mask=torch.randn(T, T))
    with pytest.raises(ValueError, match="needs a block with cross-attention"):
        decoder_to_torch(DecoderBlock(cfg, cross_attention=False))
    with pytest.raises(ValueError, match="TransformerDecoderLayer"):
        decoder_from_torch(nn.TransformerEncoderLayer(C, H, F))
    state = dict(layer.state_dict())
    state["multihead_attn.in_proj_weight"] = state["multihead_attn.in_proj_weight"][:, :20]
    del state["norm3.bias"]
    state["norm4.weight"] = torch.ones(C)
    with pytest.raises(ValueError) as err:
        load_torch_decoder_state(DecoderBlock(cfg), state)
    msg = str(err.value)
    assert "'multihead_attn.in_proj_weight' has shape (72, 20), wanted (72, 24)" in msg
    assert "missing 'norm3.bias' (wanted (24,))" in msg
    assert "unexpected 'norm4.weight' (24,)" in msg


def test_decoder_block_methods_wrap_the_converters():
    layer = nn.TransformerDecoderLayer(12, 3, 20, batch_first=True, norm_first=True).eval()
    block = from_torch(layer).eval()
    x, memory = torch.randn(2, 5, 12), torch.randn(2, 4, 12)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    torch.testing.assert_close(
        block(x, memory), layer(x, memory, tgt_mask=causal), atol=1e-6, rtol=0
    )
    back = to_torch(block, batch_first=False)
    assert not back.self_attn.batch_first
    for (_, a), (_, b) in zip(layer.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b)
