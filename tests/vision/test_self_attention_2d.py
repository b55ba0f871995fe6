"""SAGAN / non-local block against a float64 reference."""

from __future__ import annotations

import pytest
import torch

from attnkit import record_attention
from attnkit.vision.self_attention_2d import SelfAttention2d


def reference(block, x):
    """The SAGAN equations written out with einsum in float64 (one head)."""
    x = x.double()

    def conv(m, t):  # a 1x1 convolution
        w = m.weight.double()[:, :, 0, 0]
        return torch.einsum("oc,bchw->bohw", w, t) + m.bias.double()[None, :, None, None]

    f, g, h = conv(block.key, x).flatten(2), conv(block.query, x).flatten(2), conv(block.value, x)
    s = torch.einsum("bci,bcj->bji", f, g)  # s[j, i] = f(x_i)ᵀ g(x_j)
    beta = torch.softmax(s, dim=-1)
    o = torch.einsum("bji,bci->bcj", beta, h.flatten(2)).reshape(h.shape)
    return x + block.gamma.double() * conv(block.out, o), beta


def test_matches_float64_reference_and_records_maps():
    torch.manual_seed(0)
    block = SelfAttention2d(16, reduction=4, gamma_init=0.7)
    x = torch.randn(2, 16, 5, 7)
    with record_attention(block) as rec:
        y = block(x)
    want, beta = reference(block, x)
    torch.testing.assert_close(y.double(), want, atol=1e-5, rtol=0)
    assert rec["attend"].shape == (2, 1, 35, 35)
    torch.testing.assert_close(rec["attend"][:, 0].double(), beta, atol=1e-6, rtol=0)


def test_starts_as_identity_and_learns_gamma():
    block = SelfAttention2d(8, reduction=2)
    x = torch.randn(1, 8, 4, 4)
    y = block(x)
    assert torch.equal(y, x)
    y.square().sum().backward()
    assert block.gamma.grad is not None and block.gamma.grad != 0


def test_heads_and_bad_input():
    block = SelfAttention2d(16, reduction=2, num_heads=2, value_channels=8)
    assert block(torch.randn(1, 16, 3, 3)).shape == (1, 16, 3, 3)
    with pytest.raises(ValueError, match=r"x must have shape \(B, 16, h, w\)"):
        block(torch.randn(1, 8, 3, 3))
    with pytest.raises(ValueError, match="multiples of num_heads=3"):
        SelfAttention2d(16, reduction=2, num_heads=3)


def test_query_position_map_is_drawn_over_the_input(tmp_path):
    from attnkit.viz.rollout import plot_query_attention, query_map

    block = SelfAttention2d(8, reduction=2, num_heads=2, value_channels=8)
    x = torch.randn(1, 8, 4, 6)
    with record_attention(block) as rec:
        block(x)
    weights = rec["attend"]  # (1, 2, 24, 24)
    maps = query_map(weights, (2, 5), (4, 6))
    assert maps.shape == (1, 2, 4, 6)
    torch.testing.assert_close(maps[0, 1, 3, 0], weights[0, 1, 2 * 6 + 5, 3 * 6 + 0])
    torch.testing.assert_close(maps.sum((-1, -2)), torch.ones(1, 2))
    path = plot_query_attention(torch.rand(32, 48), maps[0], (2, 5), tmp_path / "q.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="outside the 4×6 grid"):
        query_map(weights, (4, 0), (4, 6))
    with pytest.raises(ValueError, match=r"weights must have shape \(B, H, 20, 20\)"):
        query_map(weights, (0, 0), (4, 5))
