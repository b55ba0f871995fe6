"""The compiled kernel's backward tile path (_native/tile_backward.h): query blocks whose tiles
of 8 rows each span at most 32 keys (short documents, a strided mask's short interleaved
sequences, calls of at most 32 keys) get S, dP~, dQ, dK and dV as small register-tiled products
per tile, dK and dV summed over the block's tiles before they reach the head's rows. Gradients
against the float64 reference at documents of 1-32 tokens, head widths 8-128 with Dv != D,
causal documents, N != S, interleaved sequences, rows that see nothing, GQA, two threads, every
feature that leaves the lane-by-lane gradients (bias, score functions, dense masks, dropout),
non-finite inputs; and that the backward's blocks do take the path (`kernel_work`)."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.analysis.kernel_work import TILE_ROWS, kernel_work
from attnkit.functional import native
from attnkit.functional.chunked import chunked_attention
from tests.functional.test_tile_path import (
    LANE_FEATURES,
    _documents,
    _inputs,
    _takes_tiles,
    with_feature,
)

pytestmark = pytest.mark.skipif(not native.available(), reason="no compiled kernel")


def _grads(q, k, v, mask=None, causal=False, dtype=torch.float32, **kw):
    """out and the gradients of q, k, v through a random cotangent on out."""
    x = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    backend = "reference" if dtype == torch.float64 else "chunked"
    got = attnkit.attention(*x, mask=mask, causal=causal, backend=backend, **kw)
    g = torch.Generator().manual_seed(5)
    cot = torch.randn(got.out.shape, generator=g, dtype=torch.float64).to(dtype)
    return got.out, torch.autograd.grad((got.out * cot).sum(), x)


def _check(q, k, v, mask=None, causal=False, atol=2e-5, **kw):
    """Gradients of a float32 chunked call against the float64 reference's."""
    _, want = _grads(q, k, v, mask, causal, torch.float64, **kw)
    _, got = _grads(q, k, v, mask, causal, **kw)
    for name, a, b in zip("qkv", got, want, strict=True):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, rtol=0, atol=atol, msg=f"d{name}")
    return got


@pytest.mark.parametrize("d, dv", [(8, 8), (40, 44), (64, 64), (80, 72), (128, 128)], ids=str)
@pytest.mark.parametrize("length", [1, 8, 9, 16, 32])
def test_documents_against_float64(length, d, dv):
    """Documents of 8, 16, 32 tokens: tiles of whole documents; of 9: tiles where a block's
    tiles compute at most 5/4 of its entries; of 1: the row path."""
    n = 97  # the last document and the last tile shorter
    assert _takes_tiles(_documents(n, length), n, n, pass_="backward") == (length >= 8)
    _check(*_inputs(n, n, d=d, dv=dv), mask=_documents(n, length))


@pytest.mark.parametrize("length", [8, 16, 32])
def test_causal_documents(length):
    """Causal documents: each tile over its rows' keys where that computes at most 5/4 of the
    entries they see (documents of 16 and 32: some tiles; of 8: the row path)."""
    n = 90
    mask = _documents(n, length, causal=True)
    assert _takes_tiles(mask, n, n, pass_="backward") == (length > 8)
    _check(*_inputs(n, n, d=64, dv=40), mask=mask)


def test_a_cotangent_on_lse():
    """dlse (Args::dlse, subtracted from D_i) on the tiles: against the PyTorch kernel in
    float64 (`chunked_attention`'s float64 truth), whose lse is differentiable."""
    n = 90
    mask = _documents(n, 16, causal=True) & masks.padding(torch.tensor([80, 90]), n)
    grads = []
    for dtype in (torch.float64, torch.float32):
        x = [t.to(dtype).requires_grad_() for t in _inputs(n, n, d=40, dv=24, seed=3)]
        out, lse = chunked_attention(*x, mask=mask, bias=None, causal=False, scale=0.3,
                                     dropout_p=0.0, training=False)  # fmt: skip
        g = torch.Generator().manual_seed(6)
        cot = torch.randn(out.shape, generator=g, dtype=torch.float64).to(dtype)
        lse_cot = torch.randn(lse.shape, generator=g, dtype=torch.float64).to(dtype)
        loss = (out * cot).sum() + (lse.where(torch.isfinite(lse), 0) * lse_cot).sum()
        grads.append(torch.autograd.grad(loss, x))
    for a, b in zip(grads[1], grads[0], strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5)


@pytest.mark.parametrize("n, s", [(8, 8), (17, 17), (32, 32), (8, 29), (29, 5), (30, 12)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_short_calls_n_not_s(n, s, causal):
    """Calls of at most 32 keys: one block of tiles (bottom-right causal: with N > S the first
    rows see nothing, their gradient 0)."""
    assert _takes_tiles(None, n, s, causal, pass_="backward")
    _check(*_inputs(n, s, d=40, dv=24), causal=causal)


@pytest.mark.parametrize("n, stride", [(96, 6), (1024, 64), (64, 4)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_strided_interleaved_sequences(n, stride, causal):
    mask = masks.strided(n, stride, causal=causal)
    assert kernel_work(mask, pass_="backward").blocks == 0  # sequences of 16, 16 and 16
    _check(*_inputs(n, n, d=64, dv=64, hkv=4), mask=mask)


def test_rows_that_see_nothing_get_zero_gradients():
    n = 97
    mask = _documents(n, 16) & masks.padding(torch.tensor([n - 20, 50]), n)
    got = _check(*_inputs(n, n), mask=mask)
    blind = ~mask.dense().expand(2, 4, n, n).any(-1)  # (B, H, N)
    assert blind.any() and torch.all(got[0][blind] == 0)


@LANE_FEATURES
def test_features_that_leave_the_lane_gradients(kw):
    """Bias, score functions and dense masks (with rows they empty): each lane's scores through
    the row path's stages."""
    n = 77
    mask, kw = with_feature(kw, n, empty_row=True)
    _check(*_inputs(n, n), mask=mask, **kw)


def test_two_threads_split_a_head_the_same():
    """Two threads on one kv head: runs of query blocks whose dK, dV go to slots
    (_native/partition.h), the same sums up to rounding."""
    n = 320
    q, k, v = _inputs(n, n, d=64, dv=64, hkv=1)
    mask = _documents(n, 16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _grads(q, k, v, mask)[1]
        torch.set_num_threads(2)
        two = _grads(q, k, v, mask)[1]
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, two, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    _check(q, k, v, mask=mask)


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_row_reaches_only_its_document(where, bad):
    """A tile's rows are lanes of its products: a NaN or inf in one row of a document of 16
    (two whole tiles) may reach that document's gradients, never another document's bits."""
    n = 64
    q, k, v = (t.float() for t in _inputs(n, n, d=64, dv=64))
    mask = _documents(n, 16)
    clean = _grads(q, k, v, mask)[1]
    x = {"q": q, "k": k, "v": v}
    x[where] = x[where].clone()
    x[where][0, 1, 20, 3] = bad
    got = _grads(x["q"], x["k"], x["v"], mask)[1]
    doc = torch.zeros(n, dtype=torch.bool)
    doc[16:32] = True
    # batch row 0; query heads 2, 3 on kv head 1 (a bad q row: head 1 on kv head 0)
    hq = torch.zeros(4, dtype=torch.bool)
    hq[[1] if where == "q" else [2, 3]] = True
    hk = torch.zeros(2, dtype=torch.bool)
    hk[0 if where == "q" else 1] = True
    hit_q = torch.zeros(2, 4, n, dtype=torch.bool)
    hit_q[0, hq] = doc
    hit_kv = torch.zeros(2, 2, n, dtype=torch.bool)
    hit_kv[0, hk] = doc
    for a, b, hit in zip(got, clean, (hit_q, hit_kv, hit_kv), strict=True):
        assert torch.equal(a[~hit], b[~hit])
    assert not torch.isfinite(got[0][hit_q]).all() or not torch.isfinite(got[1][hit_kv]).all()


@pytest.mark.parametrize("n", [97, 256])
def test_the_model_counts_the_backward_tiles(n):
    """`kernel_work` counts the backward's tiles as the forward's: each tile's rows x the union
    of their keys; the kernel's counter agrees over both passes."""
    mask = _documents(n, 16)
    q, k, v = (t.float().requires_grad_() for t in _inputs(n, n))
    with native.count_work() as counted:
        attnkit.attention(q, k, v, mask=mask, backend="chunked").out.sum().backward()
    work = [kernel_work(mask, pass_=p, batch=2, heads=4) for p in ("forward", "backward")]
    assert counted.item() == sum(w.computed for w in work)
    tiles = range(0, n - n % 16, TILE_ROWS)  # a last block of fewer rows: the block path
    assert work[1].computed == 8 * (TILE_ROWS * 16 * len(tiles) + (n % 16) ** 2)
