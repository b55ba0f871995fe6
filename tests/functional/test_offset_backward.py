"""The compiled backward's offset path (_native/offset_backward.h, switched on by
ATTNKIT_OFFSET_BACKWARD=1): narrow bands kTileRows queries at a time, keys addressed by their
offset from the query, with the rows whose tile does not share its offsets on the row path.
Gradients pinned to float64 autograd through an explicit masked softmax at odd sizes, clipped
and causal windows (N != S bottom-right), GQA, interleaved sequences, empty rows, NaN rows and
two threads (the kernel takes float32 only: no gradcheck)."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.analysis.kernel_work import kernel_work
from attnkit.functional import native
from attnkit.functional._grid import offset_bands

pytestmark = pytest.mark.skipif(not native.available(), reason="no compiled kernel")


@pytest.fixture(autouse=True)
def _offsets_on(monkeypatch):
    monkeypatch.setenv("ATTNKIT_OFFSET_BACKWARD", "1")


def _inputs(b, h, hkv, n, s, d, dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, hkv, s, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, hkv, s, dv, generator=g, dtype=torch.float64)
    cot = torch.randn(b, h, n, dv, generator=g, dtype=torch.float64)
    return q, k, v, cot


def _reference(q, k, v, cot, allowed):
    """float64 (dq, dk, dv) through softmax(q k^T / sqrt(D) masked by `allowed`) v; rows that
    see nothing give out 0."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ kk.transpose(-1, -2)) / q.shape[-1] ** 0.5
    p = torch.softmax(s.masked_fill(~allowed, -torch.inf), -1)
    out = torch.where(allowed.any(-1, keepdim=True), p, 0.0) @ vv
    return torch.autograd.grad(out, (q, k, v), cot)


def _kernel(q, k, v, cot, **kw):
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = attnkit.attention(q, k, v, backend="chunked", **kw).out
    return torch.autograd.grad(out, (q, k, v), cot.float())


def _check(got, want, atol=2e-5):
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, rtol=0, atol=atol, msg=name)


def _allowed(mask, n, s, causal=False):
    dense = mask.dense().bool()
    return dense & masks.causal(n, s) if causal else dense


@pytest.mark.parametrize(
    "n, s, w, d, dv",
    [(1, 1, 2, 8, 8), (7, 7, 3, 40, 24), (9, 9, 5, 64, 64), (97, 97, 5, 80, 64),
     (1025, 1025, 5, 64, 64), (300, 300, 9, 128, 40), (257, 257, 17, 64, 72),
     (200, 200, 32, 40, 40)],
)  # fmt: skip
def test_windows_against_float64(n, s, w, d, dv):
    """Two-sided windows of 2w - 1 keys (clipped at both ends), D and Dv from 8 to 128."""
    q, k, v, cot = _inputs(1, 2, 2, n, s, d, dv)
    mask = masks.window(n, w, s)
    _check(_kernel(q, k, v, cot, mask=mask), _reference(q, k, v, cot, _allowed(mask, n, s)))


@pytest.mark.parametrize("n, s, w", [(97, 130, 9), (1025, 1025, 5), (64, 200, 17), (33, 33, 32)])
def test_causal_windows_bottom_right(n, s, w):
    """Causal windows, N != S aligned bottom-right: each row's keys cut at i + S - N."""
    q, k, v, cot = _inputs(2, 2, 2, n, s, 64, 48, seed=1)
    mask = masks.window(n, w, s)
    want = _reference(q, k, v, cot, _allowed(mask, n, s, causal=True))
    _check(_kernel(q, k, v, cot, mask=mask, causal=True), want)


@pytest.mark.parametrize("hkv", [1, 2])
def test_gqa_heads_add_into_one_dk_dv(hkv):
    q, k, v, cot = _inputs(2, 4, hkv, 161, 161, 40, 40, seed=2)
    mask = masks.window(161, 7)
    _check(_kernel(q, k, v, cot, mask=mask), _reference(q, k, v, cot, _allowed(mask, 161, 161)))


@pytest.mark.parametrize("causal", [False, True])
def test_dilated_windows_interleaved_sequences(causal):
    """A dilated window: `groups` interleaved sequences read in place, each a band."""
    n = 3 * 97
    mask = masks.dilated_window(n, 6, 3, causal=causal)
    q, k, v, cot = _inputs(1, 2, 1, n, n, 64, 64, seed=3)
    _check(_kernel(q, k, v, cot, mask=mask), _reference(q, k, v, cot, _allowed(mask, n, n)))


def test_rows_that_see_nothing_get_zero_gradient():
    n = 130
    keep = torch.ones(2, 1, 1, n, dtype=torch.bool)
    keep[1, ..., n // 2 :] = False  # batch row 1: the last rows' windows are all padding
    mask = masks.window(n, 5) & keep
    q, k, v, cot = _inputs(2, 2, 2, n, n, 64, 64, seed=4)
    allowed = mask.dense().bool().expand(2, 2, n, n)
    got = _kernel(q, k, v, cot, mask=mask)
    _check(got, _reference(q, k, v, cot, allowed))
    blind = ~allowed.any(-1)  # (B, H, N)
    assert blind.any() and torch.all(got[0][blind] == 0)


def test_a_nan_query_stays_in_its_keys():
    """A NaN query row: NaN in its own dq and the dk, dv of the keys it sees; every other
    gradient equals the reference's."""
    n, w, r0 = 200, 5, 100
    q, k, v, cot = _inputs(1, 1, 1, n, n, 64, 64, seed=5)
    mask = masks.window(n, w)
    allowed = _allowed(mask, n, n)
    want = _reference(q, k, v, cot, allowed)
    q[0, 0, r0] = torch.nan
    dq, dk, dv = _kernel(q, k, v, cot, mask=mask)
    seen = allowed[0, 0, r0] if allowed.dim() == 4 else allowed.reshape(n, n)[r0]
    assert torch.isnan(dq[0, 0, r0]).all() and torch.isnan(dk[0, 0, seen]).any()
    rows = torch.arange(n) != r0
    torch.testing.assert_close(dq[0, 0, rows].double(), want[0][0, 0, rows], rtol=0, atol=2e-5)
    for got, ref in ((dk, want[1]), (dv, want[2])):
        torch.testing.assert_close(got[0, 0, ~seen].double(), ref[0, 0, ~seen], rtol=0, atol=2e-5)


def test_two_threads_share_a_head():
    """Two threads on one kv head: its query blocks split into runs whose dk, dv sums go
    through private slots (partition.h)."""
    q, k, v, cot = _inputs(1, 2, 1, 1025, 1025, 64, 64, seed=6)
    mask = masks.window(1025, 9)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = _kernel(q, k, v, cot, mask=mask)
    finally:
        torch.set_num_threads(saved)
    _check(got, _reference(q, k, v, cot, _allowed(mask, 1025, 1025)))


def test_the_switch_moves_the_backward(monkeypatch):
    """The path runs: with it the gradients differ from the row path's in their last bits
    (another order of the sums), both within float32 of the reference."""
    q, k, v, cot = _inputs(1, 2, 2, 513, 513, 64, 64, seed=7)
    mask = masks.window(513, 5)
    on = _kernel(q, k, v, cot, mask=mask)
    monkeypatch.setenv("ATTNKIT_OFFSET_BACKWARD", "0")
    off = _kernel(q, k, v, cot, mask=mask)
    assert not all(torch.equal(a, b) for a, b in zip(on, off, strict=True))
    want = _reference(q, k, v, cot, _allowed(mask, 513, 513))
    _check(on, want)
    _check(off, want)


@pytest.mark.parametrize("threads", [1, 2])
def test_bands_past_the_row_path_take_it_by_default(monkeypatch, threads):
    """Without the switch, bands of 33-64 keys take the path on AVX-512 builds (full query
    blocks, `_grid.backward_query_block`; other builds: the blocks, as with the switch "0"),
    on one thread and two, and `kernel_work` counts what the kernel counts."""
    monkeypatch.delenv("ATTNKIT_OFFSET_BACKWARD")
    n, w = 1025, 24  # 47 keys a row
    q, k, v, cot = _inputs(1, 2, 1, n, n, 64, 64, seed=8)
    mask = masks.window(n, w)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with native.count_work() as work:
            on = _kernel(q, k, v, cot, mask=mask)
        monkeypatch.setenv("ATTNKIT_OFFSET_BACKWARD", "0")
        off = _kernel(q, k, v, cot, mask=mask)
    finally:
        torch.set_num_threads(saved)
    monkeypatch.delenv("ATTNKIT_OFFSET_BACKWARD")
    same = all(torch.equal(a, b) for a, b in zip(on, off, strict=True))
    assert same == (not offset_bands())
    _check(on, _reference(q, k, v, cot, _allowed(mask, n, n)))
    model = sum(
        kernel_work(mask, pass_=p, batch=1, heads=2).computed for p in ("forward", "backward")
    )
    assert work.item() == model


def test_dilated_bands_by_default(monkeypatch):
    """A dilated window of 39 keys a sequence: its interleaved sequences' bands (`groups`,
    read in place) on the offset path by default, against the reference."""
    monkeypatch.delenv("ATTNKIT_OFFSET_BACKWARD")
    n = 3 * 130
    mask = masks.dilated_window(n, 20, 3)
    q, k, v, cot = _inputs(1, 2, 2, n, n, 64, 32, seed=9)
    _check(_kernel(q, k, v, cot, mask=mask), _reference(q, k, v, cot, _allowed(mask, n, n)))
