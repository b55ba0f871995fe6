"""The compiled kernel's offset path (_native/offset_path.h): rows of several runs of keys (a
2-D neighbourhood in token order, unions of row intervals) computed 8 queries a tile, keys
addressed by their offset from each query, in a plain forward. Against a float64 softmax over
the dense mask; the path taken is checked through the computed-entry counter, which
`kernel_work` predicts."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.analysis import kernel_work
from attnkit.functional import native
from attnkit.functional._grid import offset_runs
from attnkit.functional._row_masks import RowIntervals
from attnkit.functional.reordered import natural_runs

needs_kernel = pytest.mark.skipif(not native.available(), reason="compiled kernel not built")


def _reference(q, k, v, allowed):
    """out, lse in float64 over the dense mask (B|1, H|1, N, S); rows that see nothing: 0, -inf."""
    g = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(g, 1) for t in (k, v))
    s = (q.double() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None].clamp(min=-1e300)).nan_to_num(0.0)
    return p @ v, lse


def _call(q, k, v, mask):
    with native.count_work() as counted:
        res = attnkit.attention(q, k, v, mask=mask, backend="chunked")
    return res.out, res.lse, counted.item()


def _inputs(b, h, hkv, n, d, dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g)
    k = torch.randn(b, hkv, n, d, generator=g)
    v = torch.randn(b, hkv, n, dv, generator=g)
    return q, k, v


def _natten_cases():
    # (height, width, kernel): interior and border tiles, canvases whose rows are not a
    # multiple of 8 queries (a tile spans two canvas rows), square and oblong kernels
    return [(13, 21, 7), (13, 21, 3), (9, 9, 9), (16, 24, (5, 7)), (32, 32, 15), (1, 9, (1, 3))]


@needs_kernel
@pytest.mark.parametrize("height,width,kernel", _natten_cases())
@pytest.mark.parametrize("d,dv", [(8, 8), (40, 24), (64, 64), (80, 128)])
def test_neighbourhood_in_token_order_matches_float64(height, width, kernel, d, dv):
    mask = masks.neighborhood_2d(height, width, kernel)
    q, k, v = _inputs(2, 4, 2, height * width, d, dv)  # GQA: 2 query heads a kv head
    out, lse, counted = _call(q, k, v, mask)
    want_out, want_lse = _reference(q, k, v, mask.dense().bool())
    torch.testing.assert_close(out.double(), want_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=1e-5)
    # the count is the offset path's (kernel_work without gradients), and for these kernels
    # the token-order runs are taken where the kernel's limits let them
    assert counted == kernel_work(mask, batch=2, heads=4, grad=False).computed
    assert mask.natural is not None


@needs_kernel
def test_the_offset_path_computes_only_the_interior_entries():
    """An interior tile (8 queries of one canvas row, none at a border) computes exactly its
    kh * kw keys a query: on a canvas whose borders are a small part, the forward computes
    close to the allowed entries (the reordered tiles: 2.15 and more)."""
    mask = masks.neighborhood_2d(64, 64, 7)
    work = kernel_work(mask, heads=1, grad=False)
    assert work.computed < 1.15 * work.allowed
    q, k, v = _inputs(1, 1, 1, 64 * 64, 16, 16)
    assert _call(q, k, v, mask)[2] == work.computed


@needs_kernel
def test_gradients_take_token_order_where_the_backward_does():
    """With gradients wanted the forward runs in token order only where the backward takes
    rows of several runs too (_native/offset_runs.h: `offset_runs`, AVX-512 and AVX2 builds), else
    reordered: the count is `kernel_work`'s, and the results are the same function."""
    mask = masks.neighborhood_2d(13, 21, 7)
    q, k, v = (t.requires_grad_() for t in _inputs(1, 2, 2, 13 * 21, 16, 16))
    with native.count_work() as counted:
        out = attnkit.attention(q, k, v, mask=mask, backend="chunked").out
    assert counted.item() == kernel_work(mask, heads=2).computed
    natural = kernel_work(mask, heads=2, grad=False).computed
    assert (counted.item() == natural) == offset_runs()
    with torch.no_grad():
        torch.testing.assert_close(out, _call(q, k, v, mask)[0], atol=1e-5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("n", [9, 97, 1025])
def test_unions_of_runs_match_float64(n):
    """A causal window | the first keys (two runs a row, sinks): taken on the offset path (the
    lanes' first runs differ by one key a lane); rows that see nothing give 0 and -inf."""
    mask = masks.window(n, 40, causal=True) | masks.prefix(n, 4)
    rows = torch.arange(n)
    mask = mask & RowIntervals(torch.zeros(n), torch.where(rows % 11 == 3, 0, n), n)
    q, k, v = _inputs(1, 3, 1, n, 40, 24, seed=n)
    out, lse, counted = _call(q, k, v, mask)
    want_out, want_lse = _reference(q, k, v, mask.dense().bool())
    torch.testing.assert_close(out.double(), want_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=1e-5)
    empty = rows % 11 == 3
    assert bool((out[:, :, empty] == 0).all()) and bool(torch.isneginf(lse[:, :, empty]).all())
    work = kernel_work(mask, heads=3)
    assert counted == work.computed
    if n == 1025:  # the offset path: the window exact, the sinks 11 offsets for 4 keys
        assert work.computed < 1.3 * work.allowed


@needs_kernel
def test_nan_reaches_only_the_rows_that_read_it():
    """A NaN in a key and an inf in a query reach only the rows that read them: not the other
    lanes of their tiles, which compute that key's offset but mask it."""
    height, width = 12, 48
    mask = masks.neighborhood_2d(height, width, 3)
    q, k, v = _inputs(1, 1, 1, height * width, 16, 16)
    bad, bad_q = 5 * width + 7, 9 * width + 20
    k[0, 0, bad, 3] = float("nan")
    q[0, 0, bad_q, 1] = float("inf")
    out, lse, counted = _call(q, k, v, mask)
    work = kernel_work(mask, heads=1, grad=False)
    assert counted == work.computed < 1.25 * work.allowed  # on the offset path
    allowed = mask.dense().bool()[0, 0]
    hit = allowed[:, bad].clone()
    hit[bad_q] = True
    assert bool(torch.isnan(out[0, 0, hit]).all()) and bool(torch.isnan(lse[0, 0, hit]).all())
    k2, q2 = k.clone(), q.clone()
    k2[0, 0, bad], q2[0, 0, bad_q] = 0.0, 0.0
    want_out, want_lse = _reference(q2, k2, v, allowed)
    clean = ~hit
    torch.testing.assert_close(
        out[0, 0, clean].double(), want_out[0, 0, clean], atol=2e-5, rtol=1e-4
    )
    torch.testing.assert_close(
        lse[0, 0, clean].double(), want_lse[0, 0, clean], atol=2e-5, rtol=1e-5
    )


def test_natural_runs_are_the_neighbourhood():
    """The token-order runs mean the same mask; kernels past the offset path's limits get none."""
    for h, w, kern in ((13, 21, 7), (7, 30, (3, 5)), (16, 16, 15)):
        mask = masks.neighborhood_2d(h, w, kern)
        assert torch.equal(mask.natural.dense(), mask.dense())
    assert natural_runs(64, 64, 17, 17, "x") is None  # 17 runs a row
    assert natural_runs(64, 64, 3, 45, "x") is None  # a border union of 67 offsets


@needs_kernel
@pytest.mark.parametrize("n,s", [(97, 130), (300, 1025)])
def test_runs_with_more_keys_than_queries_bottom_right(n, s):
    """N != S: a causal window `|` the first keys, bottom-right aligned, and the call's causal
    limit on top; GQA, Dv != D."""
    mask = masks.window(n, 40, s, causal=True) | masks.prefix(n, 4, s)
    g = torch.Generator().manual_seed(s)
    q = torch.randn(2, 4, n, 24, generator=g)
    k, v = torch.randn(2, 1, s, 24, generator=g), torch.randn(2, 1, s, 40, generator=g)
    with native.count_work() as counted:
        res = attnkit.attention(q, k, v, mask=mask, causal=True, backend="chunked")
    allowed = mask.dense().bool() & torch.ones(n, s, dtype=torch.bool).tril(s - n)
    want_out, want_lse = _reference(q, k, v, allowed)
    torch.testing.assert_close(res.out.double(), want_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(res.lse.double(), want_lse, atol=2e-5, rtol=1e-5)
    work = kernel_work(mask, causal=True, batch=2, heads=4)
    assert counted.item() == work.computed
    if n == 300:
        assert work.computed < 1.3 * work.allowed  # the offset path
