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


@pytest.mark.parametrize("heads", [1, 4])
def test_t2t_scale_is_an_explicit_choice(heads):
    x = torch.randn(2, 10, 49, dtype=torch.float64)
    by_input = T2TAttention(49, 64, heads, dtype=torch.float64).eval()
    assert by_input.attn.attend.scale == (49 // heads) ** -0.5  # the reference code's default
    by_head = T2TAttention(49, 64, heads, scale="head", dtype=torch.float64).eval()
    assert by_head.attn.attend.scale == (64 // heads) ** -0.5  # 1/sqrt(d_k)
    by_head.load_state_dict(by_input.state_dict())
    # the same weights with scale 1/sqrt(d_k) equal a float64 rewrite with that multiplier
    q, k, v = by_head.attn.heads_qkv(x)
    p = torch.softmax(q @ k.transpose(-1, -2) * (64 // heads) ** -0.5, -1)
    merge = by_head.attn.merge_heads
    want = merge(v) + by_head.attn.proj(merge(p @ v))
    torch.testing.assert_close(by_head(x), want, rtol=0, atol=1e-12)
    assert not torch.allclose(by_head(x), by_input(x))  # the choice changes the output
    assert T2TAttention(49, 64, heads, scale=0.25).attn.attend.scale == 0.25
    assert T2TAttention(49, 64, heads, scale=None).attn.attend.scale == by_input.attn.attend.scale


@pytest.mark.parametrize("bad", ["width", "", 0.0, -1.0, float("nan"), float("inf"), True])
def test_t2t_scale_refuses_unknown_choices(bad):
    with pytest.raises(ValueError, match="scale must be"):
        T2TAttention(49, 64, scale=bad)


def test_t2t_input_scale_needs_dim_at_least_heads():
    with pytest.raises(ValueError, match=r"dim=1, num_heads=2"):
        T2TAttention(1, 4, 2)
    assert T2TAttention(1, 4, 2, scale="head").attn.attend.scale == 2**-0.5
