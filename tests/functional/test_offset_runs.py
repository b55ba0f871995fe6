"""The compiled backward's offset path for rows of several runs (_native/offset_runs.h, the
default on AVX-512 builds; ATTNKIT_OFFSET_BACKWARD=1 switches it on elsewhere): 2-D
neighbourhoods in token order and unions of row intervals, 8 queries a tile. Gradients against
float64 autograd through an explicit masked softmax at odd canvases, kernels 3 to 15, oblong
kernels, GQA, several heads and empty rows; the path taken is checked through the
computed-entry counter, which `kernel_work` predicts."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.analysis import kernel_work
from attnkit.functional import native
from attnkit.functional._grid import offset_runs
from attnkit.functional._row_masks import RowIntervals, RowRuns

pytestmark = pytest.mark.skipif(not native.available(), reason="no compiled kernel")


@pytest.fixture(autouse=True)
def _offsets_on(monkeypatch):
    monkeypatch.setenv("ATTNKIT_OFFSET_BACKWARD", "1")


def _inputs(h, hkv, n, d, dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, h, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(1, hkv, n, d, generator=g, dtype=torch.float64)
    v = torch.randn(1, hkv, n, dv, generator=g, dtype=torch.float64)
    cot = torch.randn(1, h, n, dv, generator=g, dtype=torch.float64)
    return q, k, v, cot


def _reference(q, k, v, cot, allowed):
    """float64 (out, dq, dk, dv) through softmax(q k^T / sqrt(D) masked by `allowed`) v; rows
    that see nothing give out 0."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ kk.transpose(-1, -2)) / q.shape[-1] ** 0.5
    p = torch.softmax(s.masked_fill(~allowed, -torch.inf), -1)
    out = torch.where(allowed.any(-1, keepdim=True), p, 0.0).nan_to_num(0.0) @ vv
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), cot))


def _kernel(q, k, v, cot, mask):
    """(out, dq, dk, dv) of the compiled kernel in float32, and the entries its backward
    computed."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = attnkit.attention(q, k, v, mask=mask, backend="chunked").out
    with native.count_work() as counted:
        grads = torch.autograd.grad(out, (q, k, v), cot.float())
    return (out.detach(), *grads), counted.item()


def _check(got, want, atol=2e-5):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize(
    "height, width, kernel, d, dv",
    [(33, 64, 15, 64, 64), (41, 57, 7, 40, 24), (31, 33, 3, 24, 72), (35, 65, 9, 72, 16),
     (16, 24, (5, 7), 64, 64), (9, 9, 9, 8, 8), (13, 21, 7, 64, 40)],
)  # fmt: skip
def test_neighbourhoods_in_token_order_against_float64(height, width, kernel, d, dv):
    """Interior and border tiles, canvas rows not a multiple of 8 queries, square and oblong
    kernels; GQA (4 query heads on 2 kv heads). Where the forward takes the offset path the
    backward computes the same entries (its query tiles)."""
    mask = masks.neighborhood_2d(height, width, kernel).natural
    n = height * width
    q, k, v, cot = _inputs(4, 2, n, d, dv, seed=height)
    got, counted = _kernel(q, k, v, cot, mask)
    _check(got, _reference(q, k, v, cot, mask.dense().bool()))
    assert counted == kernel_work(mask, heads=4, pass_="backward").computed
    forward = kernel_work(mask, heads=4)
    if forward.computed < 1.25 * forward.allowed and offset_runs():  # the offset paths
        assert counted == forward.computed


def test_rows_that_see_nothing_and_tiny_calls():
    """Rows with no runs get zero gradients, never NaN; a call smaller than a tile, and one
    that is all empty rows."""
    height, width, kernel = 24, 40, 5
    natural = masks.neighborhood_2d(height, width, kernel).natural
    lo, hi = natural.lo.clone(), natural.hi.clone()
    empty = (torch.arange(height * width) % 13 == 4) | (torch.arange(height * width) >= 900)
    hi[..., empty] = lo[..., empty]
    mask = RowRuns(lo, hi, height * width, "with empty rows")
    q, k, v, cot = _inputs(2, 1, height * width, 32, 32, seed=1)
    allowed = mask.dense().bool()
    got, _ = _kernel(q, k, v, cot, mask)
    _check(got, _reference(q, k, v, cot, allowed))
    assert bool((got[1][:, :, empty] == 0).all())  # dq of the empty rows
    for height, width, kernel in ((1, 1, 1), (1, 7, (1, 3)), (3, 2, (3, 1))):
        mask = masks.neighborhood_2d(height, width, kernel).natural
        q, k, v, cot = _inputs(2, 2, height * width, 16, 16, seed=2)
        _check(_kernel(q, k, v, cot, mask)[0], _reference(q, k, v, cot, mask.dense().bool()))


def test_a_training_step_runs_in_token_order_where_the_backward_takes_the_runs():
    """A NATTEN call with gradients (the reordered mask as users pass it): forward and backward
    in token order on AVX-512 and AVX2 builds (`offset_runs`), reordered elsewhere; the count is
    `kernel_work`'s either way, and the gradients the float64 reference's."""
    mask = masks.neighborhood_2d(32, 40, 7)
    q, k, v, cot = _inputs(2, 2, 32 * 40, 32, 32, seed=3)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    with native.count_work() as counted:
        out = attnkit.attention(qf, kf, vf, mask=mask, backend="chunked").out
        grads = torch.autograd.grad(out, (qf, kf, vf), cot.float())
    work = sum(kernel_work(mask, heads=2, pass_=p).computed for p in ("forward", "backward"))
    assert counted.item() == work
    natural = sum(
        kernel_work(mask.natural, heads=2, pass_=p).computed for p in ("forward", "backward")
    )
    assert (counted.item() == natural) == offset_runs()
    _check((out.detach(), *grads), _reference(q, k, v, cot, mask.dense().bool()))


@pytest.mark.parametrize("n, s", [(300, 300), (300, 1025)])
def test_unions_causal_bottom_right_and_a_batch_of_runs(n, s):
    """A causal window `|` the first keys (two runs a row, the lanes' first runs differing by
    one key a lane), N != S bottom-right with the call's causal limit on top, one batch row's
    rows emptied every 11th; GQA, Dv != D."""
    mask = masks.window(n, 40, s, causal=True) | masks.prefix(n, 4, s)
    rows = torch.arange(n)
    empty = torch.where(rows % 11 == 3, 0, s)
    mask = (
        mask & RowIntervals(torch.zeros(n), empty, s) & masks.padding(torch.tensor([s, s - 9]), s)
    )
    g = torch.Generator().manual_seed(s)
    q = torch.randn(2, 4, n, 24, generator=g, dtype=torch.float64)
    k = torch.randn(2, 1, s, 24, generator=g, dtype=torch.float64)
    v = torch.randn(2, 1, s, 40, generator=g, dtype=torch.float64)
    cot = torch.randn(2, 4, n, 40, generator=g, dtype=torch.float64)
    allowed = mask.dense().bool() & torch.ones(n, s, dtype=torch.bool).tril(s - n)
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    with native.count_work() as counted:
        out = attnkit.attention(qf, kf, vf, mask=mask, causal=True, backend="chunked").out
        grads = torch.autograd.grad(out, (qf, kf, vf), cot.float())
    _check((out.detach(), *grads), _reference(q, k, v, cot, allowed))
    work = sum(
        kernel_work(mask, causal=True, batch=2, heads=4, pass_=p).computed
        for p in ("forward", "backward")
    )
    assert counted.item() == work
    assert bool((grads[0][:, :, rows % 11 == 3] == 0).all())  # dq of the rows that see nothing


def test_two_threads_share_a_head():
    """Two threads on one kv head: its query blocks split into runs whose dk, dv sums go
    through private slots (partition.h), which hold only the keys their blocks see."""
    mask = masks.neighborhood_2d(40, 64, 7).natural
    q, k, v, cot = _inputs(1, 1, 40 * 64, 32, 32, seed=7)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got, counted = _kernel(q, k, v, cot, mask)
    finally:
        torch.set_num_threads(saved)
    _check(got, _reference(q, k, v, cot, mask.dense().bool()))
    assert counted == kernel_work(mask, pass_="backward").computed
