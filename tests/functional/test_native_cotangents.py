"""The compiled kernel's backward reads the output's cotangent through its strides
(`_native_args.point_at_cotangent`, ``Args::dout_st``): broadcast, transposed and sliced
cotangents give the gradients of the same values made contiguous, bit for bit, and the
float64 truth's.

Legend: B batch, H heads, N queries, S keys, D head width, Dv value width.
"""

from __future__ import annotations

import pytest
import torch

from attnkit import masks, score_mods
from attnkit.functional import _native_args, native
from attnkit.functional.attention import attention
from tests.functional.test_chunked import naive

needs_kernel = pytest.mark.skipif(not native.available(), reason="no compiled kernel")

B, H, DV = 2, 3, 24


def cotangents(n: int) -> dict[str, torch.Tensor]:
    """(B, H, N, Dv) cotangents of every stride pattern, none of them contiguous."""
    gen = torch.Generator().manual_seed(5)

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    full = (B, H, n, DV)
    return {
        "ones, out.sum()": torch.ones(()).expand(full),  # strides all 0
        "per head": rand(1, H, 1, DV).expand(full),  # 0 in B and N, rows contiguous
        "per token, one value a row": rand(B, 1, n, 1).expand(full),  # 0 along Dv
        "transposed": rand(B, H, DV, n).transpose(2, 3),
        "every other column": rand(B, H, n, 2 * DV)[..., 1::2],
        "every other row": rand(B, H, 2 * n, DV)[:, :, ::2],
    }


def _calls(n: int) -> dict[str, dict]:
    """Calls on each of the backward's paths: dense with a causal limit, a structured mask's
    rows, interleaved sequences (strided: Args::groups), and a built-in score function."""
    return {
        "causal": {"causal": True},
        "window": {"mask": masks.window(n, 16, causal=True)},
        "strided": {"mask": masks.strided(n, 4)},
        "softcap": {"causal": True, "score_mod": score_mods.softcap(5.0)},
    }


def _inputs(n: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [
        torch.randn(B, H, n, d, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
        for d in (16, 16, DV)
    ]


def _grads(cot: torch.Tensor, n: int, **kw) -> tuple[torch.Tensor, ...]:
    q, k, v = _inputs(n)
    out = attention(q, k, v, backend="chunked", **kw).out
    return torch.autograd.grad(out, (q, k, v), cot)


@needs_kernel
@pytest.mark.parametrize("call", list(_calls(1)))
@pytest.mark.parametrize("kind", list(cotangents(1)))
def test_strided_cotangents_give_the_contiguous_cotangents_gradients(kind, call):
    n = 97
    cot = cotangents(n)[kind]
    kw = _calls(n)[call]
    got = _grads(cot, n, **kw)
    want = _grads(cot.contiguous(), n, **kw)
    for name, g, w in zip("qkv", got, want, strict=True):
        assert torch.isfinite(g).all(), name
        assert torch.equal(g, w), f"d{name}: max diff {(g - w).abs().max().item():.2e}"


@needs_kernel
@pytest.mark.parametrize("kind", list(cotangents(1)))
def test_strided_cotangents_match_the_float64_truth(kind):
    n = 61
    cot = cotangents(n)[kind]
    got = _grads(cot, n, causal=True)
    q, k, v = _inputs(n, torch.float64)
    out, _ = naive(q, k, v, causal=True, scale=16**-0.5)
    truth = torch.autograd.grad(out, (q, k, v), cot.double())
    for name, g, w in zip("qkv", got, truth, strict=True):
        torch.testing.assert_close(g.double(), w, atol=2e-5, rtol=1e-5, msg=f"d{name}")


@needs_kernel
def test_a_broadcast_cotangent_is_read_in_place():
    """The kernel is pointed at the broadcast tensor itself (strides 0), not at a copy."""
    cot = torch.ones(()).expand(B, H, 50, DV)
    a = _native_args.Args()
    _native_args.point_at_cotangent(a, cot)
    assert a.dout == cot.data_ptr() and list(a.dout_st) == [0, 0, 0, 0]


@needs_kernel
def test_gradients_of_lse_alone_use_a_zero_cotangent_for_out():
    n = 33
    q, k, v = _inputs(n)
    lse = attention(q, k, v, backend="chunked", causal=True).lse
    got = torch.autograd.grad(lse.sum(), (q, k, v), materialize_grads=True)
    q64, k64, v64 = _inputs(n, torch.float64)
    _, lse64 = naive(q64, k64, v64, causal=True, scale=16**-0.5)
    truth = torch.autograd.grad(lse64.sum(), (q64, k64, v64), materialize_grads=True)
    for name, g, w in zip("qkv", got, truth, strict=True):
        torch.testing.assert_close(g.double(), w, atol=2e-5, rtol=1e-5, msg=f"d{name}")
