"""The classic variants built from MultiHeadAttention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnkit import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    T2TAttention,
    bert_self_attention,
    paper_attention,
    positional,
)


def numel(m):
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("heads", [1, 4])
def test_t2t_worked_example(heads):
    t2t = T2TAttention(49, 64, heads, qkv_bias=False).eval()
    x = torch.randn(13, 100, 49)
    out = t2t(x)
    assert out.shape == (13, 100, 64)
    assert numel(t2t.attn.in_proj) == 49 * 64 * 3 == 9408
    assert numel(t2t.attn.proj) == 64 * 64 + 64
    # the T2T math written out: v + proj(softmax(q kᵀ · (49 // H)^-0.5) v)
    w = t2t.attn.in_proj.qkv.weight.double()
    q, k, v = (x.double() @ w.T).split(64, dim=-1)
    split = lambda t: t.unflatten(-1, (heads, 64 // heads)).transpose(1, 2)  # noqa: E731
    p = torch.softmax(split(q) @ split(k).transpose(-1, -2) * (49 // heads) ** -0.5, -1)
    o = (p @ split(v)).transpose(1, 2).flatten(2)
    want = v + o @ t2t.attn.proj.weight.double().T + t2t.attn.proj.bias.double()
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0)


def test_bert_block_is_post_norm_with_tiny_epsilon():
    block = bert_self_attention(32, 4).eval()
    assert block.norm.eps == 1e-12
    x = torch.randn(2, 5, 32)
    want = F.layer_norm(x + block.fn(x), (32,), block.norm.weight, block.norm.bias, 1e-12)
    torch.testing.assert_close(block(x), want)


def test_paper_attention_has_four_square_projections():
    m = paper_attention()
    assert m.num_heads == 8 and m.head_dim == 64 and m.attend.dropout == 0.1
    assert numel(m) == 4 * (512 * 512 + 512)


def test_positional_modules():
    x = torch.zeros(2, 5, 8)
    sin = SinusoidalPositionalEncoding(8, max_len=16)
    torch.testing.assert_close(sin(x, offset=3)[0], positional.sinusoidal(5, 8, offset=3))
    learned = LearnedPositionalEmbedding(16, 8)
    torch.testing.assert_close(learned(x)[1], learned.weight[:5])
    with pytest.raises(ValueError, match="exceed max_len=16"):
        learned(torch.zeros(1, 17, 8))
    with pytest.raises(ValueError, match=r"x must have shape \(B, N, 8\)"):
        sin(torch.zeros(2, 5, 7))
