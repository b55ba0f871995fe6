"""Masks computed in another token order (dilated windows, strided, 2-D neighbourhoods,
`masks.reorder`) mean their token-order definition on every backend, and skip like their
reordered form."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional import native
from attnkit.functional.structured import RowIntervals

needs_kernel = pytest.mark.skipif(not native.available(), reason="no compiled kernel")


def _brute_dilated(n, window, dilation, causal):
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    d = i - j
    near = (d >= 0) & (d < window * dilation) if causal else d.abs() < window * dilation
    return near & (d % dilation == 0)


def _brute_natten(height, width, kh, kw):
    out = torch.zeros(height * width, height * width, dtype=torch.bool)
    for qy in range(height):
        for qx in range(width):
            y0 = min(max(qy - kh // 2, 0), height - kh)
            x0 = min(max(qx - kw // 2, 0), width - kw)
            for ky in range(y0, y0 + kh):
                out[qy * width + qx, ky * width + x0 : ky * width + x0 + kw] = True
    return out


def _kinds():
    n = 97
    return {
        "dilated": (masks.dilated_window(n, 5, 3), _brute_dilated(n, 5, 3, False)),
        "dilated-causal": (
            masks.dilated_window(n, 4, 2, causal=True),
            _brute_dilated(n, 4, 2, True),
        ),
        "strided": (masks.strided(n, 10), _brute_dilated(n, n, 10, False)),
        "strided-causal": (masks.strided(n, 7, causal=True), _brute_dilated(n, n, 7, True)),
        "natten": (masks.neighborhood_2d(7, 13, 5), _brute_natten(7, 13, 5, 5)),
        "natten-rect": (masks.neighborhood_2d(10, 9, (3, 7)), _brute_natten(10, 9, 3, 7)),
        "reorder": (
            masks.reorder(
                masks.from_function(lambda b, h, q, k: (q % 4 == k % 4) | (k < 3), n),
                torch.argsort(torch.arange(n) % 4 * n + torch.arange(n)),
            ),
            (torch.arange(n)[:, None] % 4 == torch.arange(n)[None] % 4) | (torch.arange(n) < 3),
        ),
    }


KINDS = list(_kinds())


@pytest.mark.parametrize("kind", KINDS)
def test_dense_is_the_definition_and_the_inner_mask_is_it_reordered(kind):
    mask, want = _kinds()[kind]
    assert torch.equal(mask.dense()[0, 0], want)
    assert mask.density == pytest.approx(want.double().mean().item(), abs=1e-12)
    order = mask.order
    assert torch.equal(mask.inner.dense()[0, 0], want[order][:, order])
    if kind.startswith(("dilated", "strided")):
        assert isinstance(mask.inner, RowIntervals)  # skipped exactly, no tiles


def _inputs(n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, n, 8, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["reference", "chunked", "auto"])
def test_outputs_and_gradients_equal_the_dense_mask_in_float64(kind, backend):
    mask, _ = _kinds()[kind]
    q, k, v = _inputs(mask.n, torch.float64)
    cot = torch.randn(2, 3, mask.n, 8, dtype=torch.float64)
    want = attnkit.attention(q, k, v, mask=mask.dense(), backend="reference").out
    got = attnkit.attention(q, k, v, mask=mask, backend=backend).out
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    gw = torch.autograd.grad(want, (q, k, v), cot)
    gg = torch.autograd.grad(got, (q, k, v), cot)
    for a, b in zip(gg, gw, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@needs_kernel
@pytest.mark.parametrize("kind", KINDS)
def test_float32_kernel_against_the_float64_reference(kind):
    mask, _ = _kinds()[kind]
    q, k, v = _inputs(mask.n, torch.float64)
    want = attnkit.attention(q, k, v, mask=mask.dense(), backend="reference").out
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    with native.count_work() as work:
        got = attnkit.attention(q32, k32, v32, mask=mask, backend="chunked").out
    assert 0 < work.item() < 2 * (2 * 3 * mask.n * mask.n)  # fwd + bwd skipped blocks
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6)
    got.sum().backward()
    gw = torch.autograd.grad(want.sum(), (q, k, v))
    for t, g in zip((q32, k32, v32), gw, strict=True):
        torch.testing.assert_close(t.grad.double(), g, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["dilated", "natten"])
def test_bias_dropout_and_causal_take_the_token_order_path(kind):
    mask, dense = _kinds()[kind]
    q, k, v = _inputs(mask.n, torch.float64)
    bias = torch.randn(1, 3, mask.n, mask.n, dtype=torch.float64)
    want = attnkit.attention(q, k, v, mask=dense, bias=bias, causal=True, backend="reference")
    got = attnkit.attention(q, k, v, mask=mask, bias=bias, causal=True, backend="chunked")
    torch.testing.assert_close(got.out, want.out, rtol=0, atol=1e-12)
    torch.manual_seed(3)
    drop = attnkit.attention(q, k, v, mask=mask, dropout_p=0.3, training=True, backend="chunked")
    torch.manual_seed(3)
    same = attnkit.attention(q, k, v, mask=dense, dropout_p=0.3, training=True, backend="chunked")
    torch.testing.assert_close(drop.out, same.out, rtol=0, atol=1e-12)


@needs_kernel
def test_reordering_makes_a_strided_mask_cheap():
    """strided(1024, 64): 64 documents of 16 tokens once reordered; in token order every
    block is partial. The kernel computes at most 2.5x the allowed entries (was 64x)."""
    n = 1024
    mask = masks.strided(n, 64)
    q = torch.randn(1, 1, n, 16)
    with native.count_work() as work, torch.no_grad():
        attnkit.attention(q, q, q, mask=mask)
    allowed = n * n // 64
    assert work.item() <= 2.5 * allowed


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: masks.dilated_window(10, 0, 2), "dilated_window: window must be an integer >= 1"),
        (lambda: masks.strided(10, 0), "strided: stride must be an integer >= 1, got 0"),
        (lambda: masks.neighborhood_2d(4, 4, 2), "kernel height must be odd and <= 4, got 2"),
        (lambda: masks.neighborhood_2d(4, 4, (3, 5)), "kernel width must be odd and <= 4, got 5"),
        (
            lambda: masks.reorder(masks.window(5, 2), torch.arange(5)),
            "reorder: mask must come from masks.from_function",
        ),
        (
            lambda: masks.reorder(
                masks.from_function(lambda b, h, q, k: q >= k, 4), torch.tensor([0, 1, 1, 2])
            ),
            "reorder: order must be a permutation of 0..3",
        ),
    ],
)
def test_bad_arguments_are_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_predicate_that_is_not_deterministic_is_refused():
    mask = masks.from_function(lambda b, h, q, k: torch.rand(q.shape[2], k.shape[3]) < 0.5, 64)
    q = torch.randn(1, 1, 64, 8)
    with pytest.raises(ValueError, match="must be deterministic"):
        attnkit.attention(q, q, q, mask=mask)
