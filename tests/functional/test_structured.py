"""Structured masks mean their `.dense()` on every backend and kernel, forward and gradients."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional import native
from attnkit.functional._mask_plan import plan_mask
from attnkit.functional.chunked import chunked_attention
from attnkit.functional.structured import EMPTY, FULL, PARTIAL, RowIntervals, causal_intervals

N = 150
IDS = masks.document_ids([40, 70, 15, 25])


def _kinds(n=N):
    ids = masks.document_ids([n // 4, n // 2, n - n // 4 - n // 2])
    pos = torch.arange(n)
    return {
        "window-causal": masks.window(n, 23, causal=True),
        "window": masks.window(n, 9),
        "document": masks.document(ids),
        "document-causal": masks.document(ids, causal=True),
        "document-batch": masks.document(torch.stack([ids, masks.document_ids([n])])),
        "document-scattered": masks.document(torch.arange(n) % 3),
        "prefix": masks.prefix(n, 31),
        "prefix-rows": masks.prefix(n, torch.tensor([0, 90])),
        "function": masks.from_function(lambda b, h, q, k: ((q - k) % 5 == 0) | (k < 2), n),
        "function-heads": masks.from_function(lambda b, h, q, k: k <= q + 7 * h, n, heads=4),
        "union": masks.window(n, 12, causal=True) | masks.prefix(n, 20),
        "union-gaps": masks.window(n, 4, causal=True)
        | masks.from_function(lambda b, h, q, k: k < 3, n),
        # a window | a band 50 keys behind | the first 3 keys: rows see up to three runs
        "runs": masks.window(n, 4)
        | RowIntervals(pos - 50, pos - 40, n)
        | RowIntervals(0 * pos, 3 + 0 * pos, n),
        "with-padding": masks.document(ids, causal=True)
        & masks.padding(torch.tensor([n - 9, n]), n),
    }


KINDS = list(_kinds())


def _inputs(dtype, b=2, h=4, hkv=2, n=N, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda heads: torch.randn(b, heads, n, d, generator=g, dtype=dtype).requires_grad_()  # noqa: E731
    return make(h), make(hkv), make(hkv)


def _grads(out, inputs, cot):
    return torch.autograd.grad(out, inputs, cot)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["reference", "fused", "chunked", "auto"])
def test_every_backend_equals_the_dense_mask_in_float64(kind, backend):
    mask = _kinds()[kind]
    q, k, v = _inputs(torch.float64)
    bias = torch.randn(1, 4, N, N, dtype=torch.float64)
    want = attnkit.attention(q, k, v, mask=mask.dense(), bias=bias, backend="reference").out
    got = attnkit.attention(q, k, v, mask=mask, bias=bias, backend=backend).out
    cot = torch.randn_like(want)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for a, b in zip(_grads(got, (q, k, v), cot), _grads(want, (q, k, v), cot), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kernel", ["native", "torch"])
@pytest.mark.parametrize("causal", [False, True])
def test_float32_kernels_against_the_float64_reference(kind, kernel, causal):
    if kernel == "native" and not native.available():
        pytest.skip("the compiled kernel could not be built here (no C++ compiler)")
    mask = _kinds()[kind]
    q, k, v = _inputs(torch.float32, seed=1)
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = attnkit.attention(*ref_in, mask=mask.dense(), causal=causal, backend="reference")
    m = mask & causal_intervals(N) if causal else mask
    out, lse = chunked_attention(
        q, k, v, mask=m, bias=None, causal=False, scale=8**-0.5, dropout_p=0.0,
        training=False, kernel=kernel,
    )  # fmt: skip
    torch.testing.assert_close(out.double(), want.out, rtol=0, atol=2e-5)
    want_lse = torch.logsumexp(
        torch.where(
            (mask.dense() & masks.causal(N)) if causal else mask.dense(),
            ref_in[0].detach() @ ref_in[1].detach().repeat_interleave(2, 1).mT * 8**-0.5,
            float("-inf"),
        ),
        -1,
    )
    torch.testing.assert_close(lse.double(), want_lse, rtol=0, atol=2e-5)
    cot = torch.randn_like(out)
    for a, b in zip(
        _grads(out, (q, k, v), cot), _grads(want.out, ref_in, cot.double()), strict=True
    ):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=5e-5)


@pytest.mark.parametrize(
    "kind", ["window-causal", "document-causal", "function", "union-gaps", "runs"]
)
@pytest.mark.parametrize("kernel", ["native", "torch"])
def test_dropout_drops_what_the_dense_mask_drops(kind, kernel):
    """The hash dropout is a function of the position: skipping blocks changes no bit."""
    if kernel == "native" and not native.available():
        pytest.skip("the compiled kernel could not be built here (no C++ compiler)")
    mask = _kinds()[kind]
    q, k, v = _inputs(torch.float32, seed=2)
    results = []
    for m in (mask, mask.dense()):
        torch.manual_seed(7)
        out, _ = chunked_attention(
            q, k, v, mask=m, bias=None, causal=False, scale=0.3, dropout_p=0.3, training=True,
            kernel=kernel,
        )  # fmt: skip
        results.append((out, *_grads(out, (q, k, v), torch.ones_like(out))))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_gqa_with_dropout_through_attention_equals_dense():
    mask = masks.document(IDS, causal=True)
    q, k, v = _inputs(torch.float32, seed=3)
    outs = []
    for m in (mask, mask.dense()):
        torch.manual_seed(3)
        outs.append(
            attnkit.attention(q, k, v, mask=m, dropout_p=0.1, training=True, backend="chunked").out
        )
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-5)


def test_rows_that_see_nothing_give_zero_and_zero_gradient():
    # batch row 0 has prefix 0 and is also cut by a padding of 0 keys: nothing visible
    mask = masks.prefix(N, torch.tensor([0, 10])) & masks.padding(torch.tensor([0, N]), N)
    for backend in ("chunked", "reference", "fused"):
        q, k, v = _inputs(torch.float32, seed=4)
        out = attnkit.attention(q, k, v, mask=mask, backend=backend).out
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        (gq,) = torch.autograd.grad(out.sum(), q)
        assert torch.isfinite(gq).all() and torch.equal(gq[0], torch.zeros_like(gq[0]))


def test_n_not_equal_s_aligns_bottom_right():
    n, s = 5, 12
    assert torch.equal(
        masks.window(n, 3, s, causal=True).dense(), masks.sliding_window(n, 3, s, causal=True)
    )
    assert torch.equal(causal_intervals(n, s).dense(), masks.causal(n, s))
    pre = masks.prefix(n, 4, s).dense()[0, 0]
    for i in range(n):  # query i sits at key position i + 7
        assert pre[i].tolist() == [j < max(4, i + 8) for j in range(s)]
    q = torch.randn(1, 2, n, 4, dtype=torch.float64)
    kv = torch.randn(1, 2, s, 4, dtype=torch.float64)
    got = attnkit.attention(
        q, kv, kv, mask=masks.window(n, 3, s), causal=True, backend="chunked"
    ).out
    want = attnkit.attention(q, kv, kv, mask=masks.sliding_window(n, 3, s), causal=True).out
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- the descriptions


def test_document_ids_from_lengths():
    assert masks.document_ids([3, 0, 2]).tolist() == [0, 0, 0, 2, 2]
    assert masks.document_ids(torch.tensor([2, 1]), total=5).tolist() == [0, 0, 1, 2, 2]
    with pytest.raises(ValueError, match="total=2 is less than sum"):
        masks.document_ids([2, 1], total=2)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        masks.document_ids([2, -1])


def test_document_means_same_id_and_is_an_interval_when_contiguous():
    ids = torch.tensor([4, 4, 1, 1, 1, 9])
    m = masks.document(ids, causal=True)
    want = (ids[:, None] == ids[None, :]) & torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(m.dense()[0, 0], want)
    assert m.intervals() is not None
    scattered = masks.document(torch.tensor([0, 1, 0]))
    assert scattered.intervals() is None and "not contiguous" in repr(scattered)
    assert torch.equal(
        scattered.dense()[0, 0], torch.tensor([[1, 0, 1], [0, 1, 0], [1, 0, 1]]).bool()
    )


@pytest.mark.parametrize("kind", KINDS)
def test_block_map_and_density_agree_with_the_dense_mask(kind):
    mask = _kinds()[kind]
    dense = mask.dense().expand(mask.shape)
    assert mask.density == pytest.approx(dense.double().mean().item(), abs=1e-12)
    for bq, bk in ((16, 32), (128, 256), (7, 150)):
        got = mask.block_map(bq, bk)
        for qb in range(got.shape[2]):
            for kb in range(got.shape[3]):
                tile = dense[:, :, qb * bq : (qb + 1) * bq, kb * bk : (kb + 1) * bk]
                tile = tile.flatten(2)  # (B|1, H|1, entries)
                want = torch.where(tile.all(-1), FULL, torch.where(tile.any(-1), PARTIAL, EMPTY))
                assert torch.equal(got[:, :, qb, kb].expand_as(want), want.to(torch.int8)), (qb, kb)


def test_plan_keeps_only_partial_tiles_and_no_n_by_s_tensor():
    n = 4096
    mask = masks.from_function(lambda b, h, q, k: (q - k >= 0) & (q - k < 256), n)
    plan = plan_mask(mask, 128, 256, "cpu")
    partial = int((plan.table >= 0).sum())
    assert plan.tiles.shape == (partial, 128, 256)
    assert plan.tiles.numel() < n * n / 8  # a few diagonal bands, not the grid
    window = plan_mask(masks.window(n, 256, causal=True), 128, 256, "cpu")
    assert window.tiles is None and window.dense is None and window.rows.shape == (2, 1, 1, n)


def test_repr_draws_the_block_map():
    text = repr(masks.window(64, 8, causal=True))
    assert text.startswith("window(8, causal)  (1, 1, 64, 64), density")
    assert "█" in text and "░" in text and "(blocks of 2×2)" in text


def test_combining_with_tensors_and_none_either_side():
    w = masks.window(6, 2)
    pad = masks.padding(torch.tensor([4, 6]), 6)
    for m in (w & pad, pad & w):
        assert torch.equal(m.dense(), masks.sliding_window(6, 2) & pad)
    assert (w & None) is w and (w | None) is w
    assert torch.equal((pad | w).dense(), masks.sliding_window(6, 2) | pad)


def test_bad_descriptions_are_refused_by_name():
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        masks.window(4, 0)
    with pytest.raises(ValueError, match="prefix_len must be an int >= 0"):
        masks.prefix(4, -1)
    with pytest.raises(ValueError, match="ids must be an integer tensor"):
        masks.document(torch.zeros(3))
    with pytest.raises(
        ValueError, match=r"cannot combine masks of \(N, S\) = \(4, 4\) and \(5, 5\)"
    ):
        masks.window(4, 2) & masks.window(5, 2)
    with pytest.raises(ValueError, match="combines with masks and boolean tensors"):
        masks.window(4, 2) & torch.zeros(4, 4)
    with pytest.raises(ValueError, match="fn must return a boolean tensor"):
        masks.from_function(lambda b, h, q, k: q - k, 4).dense()
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match=r"describes \(B, H, N, S\) = \(1, 1, 5, 5\).*N=4"):
        attnkit.attention(q, q, q, mask=masks.window(5, 2))


def test_modules_take_structured_masks():
    torch.manual_seed(0)
    mha = attnkit.MultiHeadAttention(32, 4).double()
    x = torch.randn(2, N, 32, dtype=torch.float64)
    mask = masks.document(IDS, causal=True)
    torch.testing.assert_close(mha(x, mask=mask), mha(x, mask=mask.dense()), rtol=0, atol=1e-12)


@pytest.mark.skipif(not native.available(), reason="the compiled kernel could not be built here")
def test_kernel_skips_what_the_mask_hides():
    """The work counter on the kernel: a window of 256 over N=2048 computes ~1/6 of the grid."""
    n = 2048
    q = torch.randn(1, 1, n, 16)
    with native.count_work() as work:
        attnkit.attention(q, q, q, mask=masks.window(n, 256, causal=True), backend="chunked")
    assert 0 < work.item() < n * n / 5
    with native.count_work() as dense_work:
        attnkit.attention(
            q, q, q, mask=masks.sliding_window(n, 256, causal=True), backend="chunked"
        )
    assert dense_work.item() == n * n


def test_compiled_and_exported_models_take_descriptions():
    """Traced code runs a description's dense form: built inside the graph or passed in."""
    torch.manual_seed(0)
    mha = attnkit.MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 64, 32)
    ids = masks.document_ids([20, 44])

    def inside(x):
        return mha(x, mask=masks.document(ids, causal=True))

    def passed(x, m):
        return mha(x, mask=m)

    window = masks.window(64, 8, causal=True)
    torch.testing.assert_close(torch.compile(inside, fullgraph=True)(x), inside(x))
    torch.testing.assert_close(torch.compile(passed, fullgraph=True)(x, window), passed(x, window))

    class Windowed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x):
            return self.mha(x, mask=masks.window(64, 8, causal=True))

    exported = torch.export.export(Windowed(), (x,)).module()
    torch.testing.assert_close(exported(x), passed(x, window))


def test_combine_takes_descriptions():
    pad = masks.padding(torch.tensor([5, 8]), 8)
    got = masks.combine(pad, None, masks.window(8, 3, causal=True))
    assert isinstance(got, masks.StructuredMask)
    assert torch.equal(got.dense(), pad & masks.sliding_window(8, 3, causal=True))


@pytest.mark.parametrize("kind", ["window-causal", "function", "with-padding"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_second_order_gradients_through_a_description(kind, dtype):
    """create_graph=True through the chunked kernels (float64: PyTorch, float32: compiled)
    keeps the description's mask in the differentiable backward."""
    n = 40
    mask = _kinds(n)[kind]
    q, k, v = _inputs(dtype, n=n, seed=5)

    def penalty(m, backend, inputs):
        out = attnkit.attention(*inputs, mask=m, backend=backend).out
        grads = torch.autograd.grad(out.square().sum(), inputs, create_graph=True)
        return torch.autograd.grad(sum(g.square().sum() for g in grads), inputs)

    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = penalty(mask.dense(), "reference", ref_in)
    got = penalty(mask, "chunked", (q, k, v))
    tol = 1e-10 if dtype == torch.float64 else 2e-3
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol)


def test_a_mask_is_classified_once_per_grid():
    calls = []

    def band(b, h, q, k):
        calls.append(1)
        return (q - k).abs() < 8

    mask = masks.from_function(band, 64)
    q = torch.randn(1, 2, 64, 8)
    for _ in range(3):
        attnkit.attention(q, q, q, mask=mask, backend="chunked")
    first = len(calls)
    attnkit.attention(q, q, q, mask=mask, backend="chunked")
    assert first > 0 and len(calls) == first
