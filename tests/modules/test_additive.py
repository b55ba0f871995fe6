"""Additive (Bahdanau), multiplicative (Luong) attention and attention pooling."""

from __future__ import annotations

import pytest
import torch

from attnkit import record_attention
from attnkit.modules import AdditiveAttention, AttentionPooling, LuongAttention


def rand(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def masked_softmax64(scores, mask):
    """Float64 softmax over the last axis; rows with no allowed entry give 0."""
    scores = scores.double().masked_fill(~mask, float("-inf"))
    dead = ~mask.any(-1, keepdim=True)
    return torch.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead | ~mask, 0.0)


def test_additive_with_projections_matches_bahdanau_formula():
    m = AdditiveAttention(24, key_dim=36, hidden=20).eval()
    q, k, v = rand(2, 7, 24), rand(2, 11, 36, seed=1), rand(2, 11, 5, seed=2)
    mask = rand(2, 1, 7, 11, seed=3) > -0.5
    mask[1, 0, 3] = False  # a row that sees nothing
    w = {n: p.double() for n, p in m.state_dict().items()}
    assert set(w) == {"q_proj.weight", "q_proj.bias", "k_proj.weight", "v"}
    hq = q.double() @ w["q_proj.weight"].T + w["q_proj.bias"]  # (B, N, A)
    hk = k.double() @ w["k_proj.weight"].T  # (B, S, A)
    scores = torch.tanh(hq[:, :, None] + hk[:, None]) @ w["v"]  # (B, N, S)
    probs = masked_softmax64(scores, mask[:, 0])
    with record_attention(m) as rec:
        got = m(q, v, k, mask=mask)
    torch.testing.assert_close(got.double(), probs @ v.double(), atol=1e-5, rtol=0)
    torch.testing.assert_close(rec["attend"][:, 0].double(), probs, atol=1e-6, rtol=0)
    assert got[1, 3].abs().max() == 0


def test_luong_general_and_dot():
    m = LuongAttention(24, key_dim=36).eval()
    with torch.no_grad():
        m.scale.fill_(0.7)
    q, k, v = rand(2, 7, 24), rand(2, 11, 36, seed=1), rand(2, 11, 5, seed=2)
    scores = 0.7 * (q.double() @ (k.double() @ m.general.weight.double().T).transpose(1, 2))
    want = masked_softmax64(scores, torch.ones(1, 1, dtype=torch.bool)) @ v.double()
    torch.testing.assert_close(m(q, v, k).double(), want, atol=1e-5, rtol=0)
    dot = LuongAttention()
    want_dot = torch.softmax(q.double() @ q.double().transpose(1, 2), -1) @ q.double()
    torch.testing.assert_close(dot(q, q).double(), want_dot, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="query width 24 != key width 36"):
        dot(q, k)


@pytest.mark.parametrize(("c", "t", "hidden"), [(24, 7, None), (36, 11, 16), (5, 1, 3)])
def test_pooling_matches_formula_and_records_weights(c, t, hidden):
    m = AttentionPooling(c, hidden).eval()
    x = rand(3, t, c)
    mask = rand(3, t, seed=1) > -0.5
    mask[:, 0] = True
    w = {n: p.double() for n, p in m.state_dict().items()}
    scores = torch.tanh(x.double() @ w["proj.weight"].T + w["proj.bias"]) @ w["v"]  # (B, T)
    probs = masked_softmax64(scores, mask)
    with record_attention(m) as rec:
        got = m(x, mask)
    assert got.shape == (3, c)
    torch.testing.assert_close(
        got.double(), (probs[:, :, None] * x.double()).sum(1), atol=1e-5, rtol=0
    )
    assert rec["attend"].shape == (3, 1, 1, t)
    torch.testing.assert_close(rec["attend"][:, 0, 0].double(), probs, atol=1e-6, rtol=0)
    torch.testing.assert_close(rec["attend"].sum(-1), torch.ones(3, 1, 1))


def test_pooling_fully_masked_sequence_is_zero_with_finite_gradients():
    m = AttentionPooling(12)
    x = rand(2, 5, 12).requires_grad_()
    mask = torch.tensor([[True, True, False, False, False], [False] * 5])
    out = m(x, mask)
    assert out[1].abs().max() == 0 and torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[1].abs().max() == 0
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    # padded steps change nothing
    x2 = x.detach().clone()
    x2[0, 2:] = 100.0
    torch.testing.assert_close(m(x2, mask)[0], out[0].detach())


def test_input_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"mask must be boolean \(B, T\) = \(2, 5\)"):
        AttentionPooling(4)(rand(2, 5, 4), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="x must have width 4"):
        AttentionPooling(4)(rand(2, 5, 3))
    with pytest.raises(ValueError, match="needs projections"):
        AdditiveAttention(8, key_dim=6)
    with pytest.raises(ValueError, match="same length S"):
        AdditiveAttention(8)(rand(2, 3, 8), rand(2, 4, 8), rand(2, 5, 8))
