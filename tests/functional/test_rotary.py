"""Rotary position embedding: formula, relative property, parity with transformers, backends."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit import BACKENDS, RotaryEmbedding, attention
from attnkit.functional.rotary import apply_rotary, rotary_tables
from tests.naive import naive_attention


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_tables_formula_offset_and_tensor_positions():
    cos, sin = rotary_tables(50, 16, base=500.0, dtype=torch.float64)
    assert cos.shape == sin.shape == (50, 8)
    p, i = 37, 3
    assert sin[p, i].item() == pytest.approx(math.sin(p * 500.0 ** (-2 * i / 16)), abs=1e-15)
    assert cos[p, i].item() == pytest.approx(math.cos(p * 500.0 ** (-2 * i / 16)), abs=1e-15)
    c2, s2 = rotary_tables(10, 16, base=500.0, offset=40, dtype=torch.float64)
    assert torch.equal(c2, cos[40:]) and torch.equal(s2, sin[40:])
    ids = torch.tensor([[3, 7], [0, 49]])
    c3, s3 = rotary_tables(ids, 16, base=500.0, dtype=torch.float64)
    assert c3.shape == (2, 2, 8) and torch.equal(c3, cos[ids]) and torch.equal(s3, sin[ids])


def test_rotation_by_hand_both_conventions():
    """One head, D = 4: pairs (0, 2), (1, 3) rotate-half; (0, 1), (2, 3) interleaved."""
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64).view(1, 1, 1, 4)
    cos, sin = rotary_tables(torch.tensor([5]), 4, base=100.0, dtype=torch.float64)
    t0, t1 = 5.0, 5.0 / 10.0  # θ_i = p · 100^(-2i/4)

    def rot(a, b, t):
        return a * math.cos(t) - b * math.sin(t), b * math.cos(t) + a * math.sin(t)

    (a0, b0), (a1, b1) = rot(1.0, 3.0, t0), rot(2.0, 4.0, t1)
    half = apply_rotary(x, cos, sin).flatten().tolist()
    assert half == pytest.approx([a0, a1, b0, b1], abs=1e-14)
    (a0, b0), (a1, b1) = rot(1.0, 2.0, t0), rot(3.0, 4.0, t1)
    inter = apply_rotary(x, cos, sin, interleaved=True).flatten().tolist()
    assert inter == pytest.approx([a0, b0, a1, b1], abs=1e-14)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(("d", "r"), [(16, 16), (24, 8), (10, 6)])
def test_scores_depend_only_on_relative_position_and_norms_kept(interleaved, d, r):
    q, k = rand(2, 3, 5, d, dtype=torch.float64), rand(2, 3, 7, d, seed=1, dtype=torch.float64)
    rope = RotaryEmbedding(r, interleaved=interleaved)
    s1 = rope.rotate(q, 4) @ rope.rotate(k, 0).transpose(-1, -2)
    s2 = rope.rotate(q, 104) @ rope.rotate(k, 100).transpose(-1, -2)  # everything shifted
    torch.testing.assert_close(s1, s2, rtol=0, atol=1e-11)
    torch.testing.assert_close(rope.rotate(q, 9).norm(dim=-1), q.norm(dim=-1), rtol=1e-13, atol=0)
    assert torch.equal(rope.rotate(q, 9)[..., r:], q[..., r:])  # the pass-through channels
    # but not position-free: the same pair at another distance scores differently
    s3 = rope.rotate(q, 5) @ rope.rotate(k, 0).transpose(-1, -2)
    assert (s3 - s1).abs().max() > 1e-3


def test_the_conventions_differ_by_a_channel_permutation():
    x = rand(2, 2, 6, 8, dtype=torch.float64)
    cos, sin = rotary_tables(6, 8, dtype=torch.float64)
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])  # interleaved pair (2i, 2i+1) = half (i, i+4)
    half = apply_rotary(x, cos, sin)
    inter = apply_rotary(x[..., perm], cos, sin, interleaved=True)
    torch.testing.assert_close(inter, half[..., perm], rtol=0, atol=0)


def test_llama_rotate_half_parity():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply

    b, h, hkv, n, d = 2, 4, 2, 9, 32
    cfg = LlamaConfig(hidden_size=h * d, num_attention_heads=h, num_key_value_heads=hkv,
                      head_dim=d, rope_theta=500000.0)  # fmt: skip
    q, k = rand(b, h, n, d), rand(b, hkv, n, d, seed=1)
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [3, 4, 5, 6, 7, 8, 9, 10, 11]])  # (B, N)
    cos_hf, sin_hf = LlamaRotaryEmbedding(cfg)(q, ids)
    want_q, want_k = llama_apply(q, k, cos_hf, sin_hf)
    cos, sin = rotary_tables(ids, d, base=500000.0)  # (B, N, D/2)
    torch.testing.assert_close(apply_rotary(q, cos, sin), want_q, rtol=0, atol=2e-6)
    torch.testing.assert_close(apply_rotary(k, cos, sin), want_k, rtol=0, atol=2e-6)


def test_gpt_neox_partial_rotary_parity():
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_apply

    cfg = GPTNeoXConfig(hidden_size=96, num_attention_heads=4, rotary_pct=0.25)  # R = 6 of D = 24
    q, k = rand(2, 4, 7, 24), rand(2, 4, 7, 24, seed=1)
    ids = torch.arange(7)[None].expand(2, 7) + 20
    cos_hf, sin_hf = GPTNeoXRotaryEmbedding(cfg)(q, ids)
    want_q, want_k = neox_apply(q, k, cos_hf, sin_hf)
    rope = RotaryEmbedding(6)
    got_q, got_k = rope(q, k, offset=20)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=2e-6)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=2e-6)


@pytest.mark.parametrize("rotary_dim", [16, 6])
def test_gptj_interleaved_parity(rotary_dim):
    from transformers.models.gptj.modeling_gptj import (
        apply_rotary_pos_emb as gptj_apply,
    )
    from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions

    b, n, h, d = 2, 11, 3, 16
    x = rand(b, n, h, d)  # GPT-J rotates in (B, N, H, D)
    ids = torch.arange(n)[None].expand(b, n) + torch.tensor([[0], [30]])  # (B, N)
    sincos = create_sinusoidal_positions(64, rotary_dim)[ids]  # (B, N, R)
    sin_hf, cos_hf = torch.split(sincos, rotary_dim // 2, dim=-1)
    want = torch.cat([gptj_apply(x[..., :rotary_dim], sin_hf, cos_hf), x[..., rotary_dim:]], -1)
    cos, sin = rotary_tables(ids, rotary_dim)
    got = apply_rotary(x.transpose(1, 2), cos, sin, interleaved=True).transpose(1, 2)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("interleaved", [False, True])
def test_every_backend_with_rotary_against_float64(backend, interleaved):
    b, h, hkv, n, d = 2, 4, 2, 13, 12
    q, k, v = rand(b, h, n, d), rand(b, hkv, n, d, seed=1), rand(b, hkv, n, d, seed=2)
    rope = RotaryEmbedding(8, interleaved=interleaved)
    mask = torch.ones(b, 1, n, n, dtype=torch.bool)
    mask[0, 0, 3] = False  # a query that may attend to nothing
    out = attention(*rope(q, k, offset=5), v, mask=mask, causal=True, backend=backend).out
    q64, k64 = rope(q.double(), k.double(), offset=5)
    want, _ = naive_attention(q64, k64, v, mask=mask, causal=True)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-5)
    assert torch.equal(out[0, :, 3], torch.zeros_like(out[0, :, 3]))


def test_module_tables_grow_follow_dtype_and_stay_out_of_the_state_dict():
    rope = RotaryEmbedding(8, base=100.0)
    assert rope.state_dict() == {}
    x = rand(1, 1, 3, 8)
    rope.rotate(x, 200)
    assert rope.cos.shape[0] >= 203 and rope.cos.dtype == torch.float32
    got = rope.rotate(x.double(), 200)
    assert rope.cos.dtype == torch.float64
    cos, sin = rotary_tables(3, 8, base=100.0, offset=200, dtype=torch.float64)
    torch.testing.assert_close(got, apply_rotary(x.double(), cos, sin), rtol=0, atol=0)


def test_bad_input_raises_naming_the_argument():
    with pytest.raises(ValueError, match="dim"):
        rotary_tables(4, 7)
    with pytest.raises(ValueError, match="positions"):
        rotary_tables(-1, 8)
    with pytest.raises(ValueError, match="base"):
        rotary_tables(4, 8, base=0.0)
    cos, sin = rotary_tables(4, 8)
    with pytest.raises(ValueError, match=r"x must have shape \(B, H, N, D\)"):
        apply_rotary(torch.zeros(4, 8), cos, sin)
    with pytest.raises(ValueError, match="R <= D=6"):
        apply_rotary(torch.zeros(1, 1, 4, 6), cos, sin)
    with pytest.raises(ValueError, match="N=5"):
        apply_rotary(torch.zeros(1, 1, 5, 8), cos, sin)
    with pytest.raises(ValueError, match="cos and sin"):
        apply_rotary(torch.zeros(1, 1, 4, 8), cos, sin[:, :2])
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(5)
    with pytest.raises(ValueError, match="offset"):
        RotaryEmbedding(4).rotate(torch.zeros(1, 1, 2, 4), -1)
