"""Hypothesis properties of attention: invariants, not examples."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import MultiHeadAttention, attention

sizes = st.integers(min_value=1, max_value=12)
settings.register_profile("attnkit", max_examples=40, deadline=None)
settings.load_profile("attnkit")


def _rand(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@given(n=sizes, s=sizes, d=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_probability_rows_sum_to_one(n, s, d, seed):
    q, k, v = _rand(seed, 1, 2, n, d), _rand(seed + 1, 1, 2, s, d), _rand(seed + 2, 1, 2, s, d)
    mask = _rand(seed + 3, 1, 1, n, s) > 0
    w = attention(q, k, v, mask=mask, need_weights=True).weights
    sums = w.sum(-1)
    seen = mask.any(-1).expand_as(sums)
    torch.testing.assert_close(sums[seen], torch.ones_like(sums[seen]))
    assert (sums[~seen] == 0).all() and (w[~mask.expand_as(w)] == 0).all()


@given(n=st.integers(2, 12), cut=st.integers(1, 11), seed=st.integers(0, 2**16))
def test_causal_outputs_ignore_future_tokens(n, cut, seed):
    cut = min(cut, n - 1)
    m = MultiHeadAttention(8, 2).eval()
    x = _rand(seed, 2, n, 8)
    y = x.clone()
    y[:, cut:] = _rand(seed + 1, 2, n - cut, 8)  # change the future only
    with torch.no_grad():
        a, b = m(x, causal=True), m(y, causal=True)
    torch.testing.assert_close(a[:, :cut], b[:, :cut], atol=1e-6, rtol=0)


@given(n=sizes, seed=st.integers(0, 2**16))
def test_permutation_equivariance_without_positions(n, seed):
    m = MultiHeadAttention(12, 3).eval()
    x = _rand(seed, 2, n, 12)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        torch.testing.assert_close(m(x)[:, perm], m(x[:, perm]), atol=1e-5, rtol=0)


@given(s=sizes, seed=st.integers(0, 2**16), shift=st.floats(-50, 50))
def test_adding_a_constant_bias_per_row_changes_nothing(s, seed, shift):
    q, k, v = _rand(seed, 1, 1, 3, 4), _rand(seed + 1, 1, 1, s, 4), _rand(seed + 2, 1, 1, s, 4)
    base = attention(q, k, v).out
    moved = attention(q, k, v, bias=torch.full((1, 1, 3, 1), shift)).out
    torch.testing.assert_close(base, moved, atol=1e-5, rtol=0)
