"""Rows that see several runs of keys (issue 36.2): `|` of row-interval masks is planned as
runs, skipped like its parts, and means what its `.dense()` means in both kernels."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.analysis import kernel_work
from attnkit.functional import native
from attnkit.functional._block_scan import scan
from attnkit.functional._mask_plan import dense_with_plan, kernel_plan, plan_mask
from attnkit.functional._runs import MAX_RUNS, merge_runs
from attnkit.functional.chunked import chunked_attention
from attnkit.functional.structured import RowIntervals, causal_intervals

needs_kernel = pytest.mark.skipif(
    not native.available(), reason="the compiled kernel could not be built here"
)


def band(n: int, s: int, offset, width: int) -> RowIntervals:
    """Keys j with |j - (p + offset)| < width, p = i + S - N; offset an int or (B, 1)."""
    pos = torch.arange(n) + (s - n)
    return RowIntervals(pos + offset - width + 1, pos + offset + width, s, "band")


def sink(n: int, s: int, first: int) -> RowIntervals:
    """The first `first` keys, for every row."""
    return RowIntervals(torch.zeros(n, dtype=torch.long), torch.full((n,), first), s, "sink")


def _kinds(n: int, s: int) -> dict:
    far = max(2, s // 3)
    g = torch.Generator().manual_seed(n * 1000 + s)
    offsets = torch.randint(-far, far + 1, (2, 1), generator=g)  # per batch row
    every5 = torch.arange(n) % 5 == 0
    empty = RowIntervals(torch.where(every5, s, 0), torch.full((n,), s), s, "some rows empty")

    def odd(b, h, q, k):
        return (q + k) % 3 != 0

    bands = masks.window(n, 3, s) | band(n, s, far, 3) | band(n, s, -far, 2)
    return {
        "bands": bands,
        "sink": masks.window(n, 5, s, causal=True) | (sink(n, s, 4) & causal_intervals(n, s)),
        "batch": band(n, s, offsets, 4) | masks.window(n, 2, s) | band(n, s, -offsets, 2),
        "overlapping": band(n, s, 0, 6) | band(n, s, 4, 3) | band(n, s, -far, 2),
        "runs&runs": bands & (masks.window(n, 2, s) | band(n, s, far, 1) | band(n, s, -far, 5)),
        "tiles": bands & masks.from_function(odd, n, s),
        "empty-rows": bands & empty,
    }


SIZES = [(1, 7), (7, 97), (97, 300), (300, 97), (97, 1)]


def test_merged_runs_are_sorted_disjoint_and_the_union():
    g = torch.Generator().manual_seed(0)
    lo = torch.randint(-3, 40, (6, 3, 50), generator=g)
    hi = lo + torch.randint(-5, 12, (6, 3, 50), generator=g)
    mlo, mhi = merge_runs(lo, hi)
    keys = torch.arange(-5, 60)
    want = ((keys >= lo[..., None]) & (keys < hi[..., None])).any(0)
    got = ((keys >= mlo[..., None]) & (keys < mhi[..., None])).any(0)
    assert torch.equal(got, want)
    seen = mlo < mhi
    assert torch.equal(seen, seen.cummin(0).values)  # empty runs last
    assert bool((mlo[~seen] == 0).all() and (mhi[~seen] == 0).all())
    both = seen[1:] & seen[:-1]
    assert bool((mlo[1:][both] > mhi[:-1][both]).all())  # sorted, apart, not touching


@pytest.mark.parametrize("n,s", SIZES, ids=str)
def test_unions_plan_as_runs_and_mean_their_dense_form(n, s):
    for name, mask in _kinds(n, s).items():
        a, b = mask.parts if name != "tiles" else (mask, None)
        if b is not None:  # | and & of descriptions mean | and & of their booleans
            want = (a.dense() | b.dense()) if mask.op == "|" else (a.dense() & b.dense())
            assert torch.equal(mask.dense(), want), name
        plan = plan_mask(mask, 16, 32, "cpu")
        assert plan.rows is not None and plan.rows.shape[1] <= MAX_RUNS, name
        assert (plan.table is None) == (name != "tiles"), name
        whole = dense_with_plan(None, plan.rows, plan.table, plan.tiles, n, s)
        assert torch.equal(whole.expand_as(mask.dense()), mask.dense()), name
        dense = mask.dense()
        assert mask.density == pytest.approx(dense.double().mean().item(), abs=1e-12), name
        for bq, bk in ((16, 32), (7, 5), (64, 128)):  # from the runs, equal to every entry read
            exact = scan(mask, bq, bk).classes
            assert torch.equal(mask.block_map(bq, bk).expand_as(exact), exact), name


def test_disjoint_bands_are_two_runs_and_overlapping_ones_one():
    n = 64
    two = masks.window(n, 4) | band(n, n, 30, 4)
    assert two.intervals() is None and two.key_runs()[0].shape[0] == 2
    one = masks.window(n, 9) | band(n, n, 5, 4)  # overlapping: one interval, as before
    lo, hi = one.intervals()
    assert torch.equal(RowIntervals(lo, hi, n).dense(), one.dense())
    many = masks.window(n, 1)
    for k in range(1, MAX_RUNS + 1):  # one more run than the plans hold: the tile table
        many = many | band(n, n, 3 * k, 1)
    assert many.key_runs() is None
    assert plan_mask(many, 16, 32, "cpu").table is not None


def _inputs(dtype, n, s, seed, b=2, h=4, hkv=2, d=8):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(b, hkv, s, d, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(b, hkv, s, d, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


@pytest.mark.parametrize("n,s", SIZES, ids=str)
@pytest.mark.parametrize("kernel", ["native", "torch"])
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_kernels_against_the_float64_reference(n, s, kernel, causal):
    """Outputs, lse and gradients of both float32 kernels (GQA, B=2 with per-row runs, fully
    masked rows) against the dense mask in float64."""
    if kernel == "native" and not native.available():
        pytest.skip("the compiled kernel could not be built here (no C++ compiler)")
    for name, mask in _kinds(n, s).items():
        m = mask & causal_intervals(n, s) if causal else mask
        dense = m.dense()
        q, k, v = _inputs(torch.float32, n, s, seed=n + s)
        ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
        want = attnkit.attention(*ref, mask=dense, backend="reference").out
        out, lse = chunked_attention(
            q, k, v, mask=m, bias=None, causal=False, scale=8**-0.5, dropout_p=0.0,
            training=False, kernel=kernel,
        )  # fmt: skip
        torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-5, msg=name)
        scores = ref[0].detach() @ ref[1].detach().repeat_interleave(2, 1).mT * 8**-0.5
        want_lse = torch.logsumexp(torch.where(dense, scores, float("-inf")), -1)
        torch.testing.assert_close(lse.double(), want_lse, rtol=0, atol=2e-5, msg=name)
        cot = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), cot)
        exp = torch.autograd.grad(want, ref, cot.double())
        for a, b in zip(got, exp, strict=True):
            assert not a.isnan().any(), name
            torch.testing.assert_close(a.double(), b, rtol=0, atol=5e-5, msg=name)


@pytest.mark.parametrize("kernel", ["native", "torch"])
def test_rows_that_see_nothing_give_zero_and_zero_gradient(kernel):
    if kernel == "native" and not native.available():
        pytest.skip("the compiled kernel could not be built here (no C++ compiler)")
    n = s = 97
    mask = _kinds(n, s)["empty-rows"]
    q, k, v = _inputs(torch.float32, n, s, seed=3)
    out, _ = chunked_attention(
        q, k, v, mask=mask, bias=None, causal=False, scale=1.0, dropout_p=0.0,
        training=False, kernel=kernel,
    )  # fmt: skip
    (dq,) = torch.autograd.grad(out.sum(), (q,))
    rows = torch.arange(n) % 5 == 0
    assert bool((out[:, :, rows] == 0).all()) and bool((dq[:, :, rows] == 0).all())
    assert not out.isnan().any() and not dq.isnan().any()


def test_second_order_gradients_keep_the_runs():
    n, s = 7, 11
    mask = masks.window(n, 2, s) | band(n, s, 5, 1)
    q, k, v = _inputs(torch.float64, n, s, seed=4, b=1, h=2, hkv=1, d=3)

    def f(q, k, v):
        return attnkit.attention(q, k, v, mask=mask, backend="chunked").out

    assert torch.autograd.gradgradcheck(f, (q, k, v))


def _counted(mask, n, s):
    q, k, v = _inputs(torch.float32, n, s, seed=5)
    with native.count_work() as forward:
        out = attnkit.attention(q, k, v, mask=mask, backend="chunked").out
    with native.count_work() as backward:
        out.sum().backward()
    return forward.item(), backward.item()


@needs_kernel
@pytest.mark.parametrize("n,s", [(97, 300), (300, 300), (1025, 1025)], ids=str)
def test_the_cost_model_counts_what_the_kernel_computes(n, s):
    for name, mask in _kinds(n, s).items():
        want = _counted(mask, n, s)
        got = tuple(
            kernel_work(mask, pass_=p, batch=2, heads=4).computed for p in ("forward", "backward")
        )
        assert got == want, name
        assert got[0] < 2 * 4 * n * s, name  # blocks between the runs are skipped


@needs_kernel
def test_far_bands_skip_the_keys_between_them():
    """A window | a far band computes about its own keys, not the span between them."""
    n = 2048
    mask = masks.window(n, 64) | band(n, n, 1024, 64)
    work = kernel_work(mask, pass_="forward")
    assert kernel_plan(mask, "cpu").rows.shape[1] == 2
    assert work.computed < 3 * work.allowed


def test_flex_block_masks_of_runs_per_batch_row():
    n = s = 97
    mask = _kinds(n, s)["batch"]
    bm = masks.to_block_mask(mask, 16)
    assert torch.equal(masks.from_block_mask(bm).dense(), mask.dense())
    idx = torch.arange(n)
    b = torch.arange(2)[:, None, None, None]
    got = bm.mask_mod(b, b * 0, idx[None, None, :, None], idx[None, None, None, :])
    assert torch.equal(got.expand(2, 1, n, s), mask.dense())


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_key_spans_of_runs_are_the_keys_each_rank_sees(layout):
    """exchange_pattern (what ring attention sends, from the description's runs) equals the
    keys each rank's queries see in the dense mask, for runs per batch row."""
    from attnkit.distributed import exchange_pattern, shard

    n, world = 48, 4
    mask = _kinds(n, n)["batch"] & causal_intervals(n)
    dense = mask.dense().any(1).any(0)  # (N, N): seen by some batch row and head
    pos = torch.arange(n)
    rows = [shard(pos, r, world, dim=0, layout=layout) for r in range(world)]
    want = []
    for dst in range(world):
        seen = dense[rows[dst]].any(0)  # (N,) keys seen by dst's queries
        got = {src: int(seen[rows[src]].sum()) for src in range(world) if src != dst}
        want.append({src: c for src, c in got.items() if c})
    assert exchange_pattern(mask, world, layout=layout) == want
