"""torch's CausalBias (`causal_upper_left` / `causal_lower_right`) in the SDPA drop-in and in
`attnkit.attention`, as in torch: eager against torch's SDPA with the materialised mask
(float64), gradients, torch.compile with the bias as a graph input, L < S, L == S, L > S, and
never an (L, S) tensor."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias, causal_lower_right, causal_upper_left

import attnkit
from attnkit.nn.functional import scaled_dot_product_attention as sdpa

F64 = torch.float64
SIZES = [(5, 5), (7, 13), (13, 7), (1, 9)]  # (L, S)
VARIANTS = [causal_upper_left, causal_lower_right]


@pytest.fixture(autouse=True)
def _never_materialised(monkeypatch):
    """attnkit maps the bias onto causal / row intervals: building its (L, S) tensor fails."""

    def refuse(self, device=None):
        raise AssertionError("the CausalBias was materialised")

    monkeypatch.setattr(CausalBias, "_materialize", refuse)


def _inputs(n, s, dtype=F64):
    g = torch.Generator().manual_seed(n * 100 + s)
    q = torch.randn(2, 3, n, 8, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(2, 3, s, 8, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(2, 3, s, 6, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def _allowed(variant, n, s):
    """The variant's (L, S) booleans, built here (torch's _materialize is refused above)."""
    shift = s - n if variant is causal_lower_right else 0
    return torch.ones(n, s, dtype=torch.bool).tril(shift)


def _make(variant, n, s):
    """The bias; torch warns that a lower-right one with L > S gives NaN rows (attnkit: 0)."""
    nan_rows = variant is causal_lower_right and n > s
    with pytest.warns(UserWarning, match="NaN") if nan_rows else contextlib.nullcontext():
        return variant(n, s)


def _torch_sdpa(q, k, v, allowed):
    """torch's SDPA with the mask, rows that see nothing set to 0 (torch gives NaN there)."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    return torch.where(allowed.any(-1, keepdim=True), out, 0.0)


@pytest.mark.parametrize(("n", "s"), SIZES)
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda f: f.__name__)
def test_drop_in_and_attention_equal_torch_with_gradients(variant, n, s):
    q, k, v = _inputs(n, s)
    allowed = _allowed(variant, n, s)
    want = _torch_sdpa(q, k, v, allowed)
    cb = _make(variant, n, s)
    dout = torch.randn_like(want)
    wanted = torch.autograd.grad(want, (q, k, v), dout)
    for got in (
        sdpa(q, k, v, attn_mask=cb),
        attnkit.attention(q, k, v, mask=cb).out,
        attnkit.attention(q, k, v, bias=cb).out,
        attnkit.attention(q, k, v, mask=cb, backend="reference").out,
    ):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
        for g, w in zip(torch.autograd.grad(got, (q, k, v), dout), wanted, strict=True):
            torch.testing.assert_close(g, w, atol=1e-12, rtol=1e-12)


def test_combines_with_a_boolean_mask_in_attention():
    q, k, v = _inputs(7, 13)
    keep = torch.rand(1, 1, 7, 13, generator=torch.Generator().manual_seed(1)) > 0.3
    got = attnkit.attention(q, k, v, mask=keep, bias=causal_upper_left(7, 13)).out
    want = _torch_sdpa(q, k, v, keep & _allowed(causal_upper_left, 7, 13))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize(
    ("variant", "n", "s"),
    [(causal_upper_left, 13, 7), (causal_lower_right, 7, 13)],
    ids=["upper_left-13-7", "lower_right-7-13"],
)
def test_under_torch_compile_with_the_bias_as_input(variant, n, s):
    q, k, v = _inputs(n, s, torch.float32)
    cb = _make(variant, n, s)

    def step(q, k, v, bias):
        return sdpa(q, k, v, attn_mask=bias)

    got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, cb)
    want = _torch_sdpa(q, k, v, _allowed(variant, n, s))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    (g,) = torch.autograd.grad(got.sum(), q)
    (w,) = torch.autograd.grad(want.sum(), q)
    torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_errors_as_torch():
    q, k, v = _inputs(5, 9)
    with pytest.raises(ValueError, match=r"made for \(L, S\) = \(5, 8\)"):
        sdpa(q, k, v, attn_mask=causal_upper_left(5, 8))
    with pytest.raises(ValueError, match=r"made for \(L, S\) = \(4, 9\)"):
        attnkit.attention(q, k, v, mask=causal_lower_right(4, 9))
    with pytest.raises(ValueError, match="not both"):
        sdpa(q, k, v, attn_mask=causal_upper_left(5, 9), is_causal=True)
