"""Masks computed in another token order (dilated windows, strided, 2-D neighbourhoods,
`masks.reorder`) mean their token-order definition on every backend, and skip like their
reordered form."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional import native
from attnkit.functional.chunked import chunked_attention
from attnkit.functional.reordered import _take, merge_groups, split_groups
from attnkit.functional.structured import RowIntervals, window

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


# ------------------------------------------------------------------ interleaved sequences
# Where the dilation or stride divides N, the residue classes are independent sequences of
# N / g tokens: one call reads them in place (`groups`), no gather.


def _grouped_kinds():
    n = 35  # odd sizes: 7 sequences of 5 tokens, 5 of 7
    return {
        "strided": (masks.strided(n, 7), _brute_dilated(n, n, 7, False)),
        "strided-causal": (masks.strided(n, 5, causal=True), _brute_dilated(n, n, 5, True)),
        "dilated": (masks.dilated_window(n, 3, 5), _brute_dilated(n, 3, 5, False)),
        "dilated-causal": (
            masks.dilated_window(n, 2, 7, causal=True),
            _brute_dilated(n, 2, 7, True),
        ),
    }


GROUPED = list(_grouped_kinds())


def _gqa_inputs(n, dtype):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, n, 8, generator=g, dtype=dtype)  # H=4 query heads on Hkv=2
    k, v = (torch.randn(2, 2, n, w, generator=g, dtype=dtype) for w in (8, 6))
    return [t.requires_grad_() for t in (q, k, v)]


def _check_against_reference(mask, dense, dtype, atol, grad_atol):
    q, k, v = _gqa_inputs(mask.n, torch.float64)
    ref = attnkit.attention(q, k, v, mask=dense, backend="reference")
    ref_lse = torch.logsumexp(  # the reference's lse, from its scores
        (q @ k.repeat_interleave(2, 1).transpose(-1, -2) / 8**0.5).masked_fill(~dense, -torch.inf),
        -1,
    )
    cot = torch.randn_like(ref.out)
    want = torch.autograd.grad(ref.out, (q, k, v), cot)
    q2, k2, v2 = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    out, lse = chunked_attention(
        q2, k2, v2, mask=mask, bias=None, causal=False, scale=8**-0.5, dropout_p=0.0,
        training=False,
    )  # fmt: skip
    torch.testing.assert_close(out.double(), ref.out, rtol=0, atol=atol)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=atol)
    got = torch.autograd.grad(out, (q2, k2, v2), cot.to(dtype))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=grad_atol)


@pytest.mark.parametrize("kind", GROUPED)
def test_interleaved_sequences_in_float64(kind):
    mask, dense = _grouped_kinds()[kind]
    assert mask.groups is not None and torch.equal(mask.dense()[0, 0], dense)
    _check_against_reference(mask, dense, torch.float64, 1e-12, 1e-12)


@needs_kernel
@pytest.mark.parametrize("kind", GROUPED)
def test_interleaved_sequences_on_the_kernel_read_in_place(kind):
    mask, dense = _grouped_kinds()[kind]
    with native.count_work() as work:
        _check_against_reference(mask, dense, torch.float32, 2e-6, 1e-5)
    g = mask.groups.count
    per_head = g * (mask.n // g) ** 2  # every sequence's whole square at most
    assert 0 < work.item() <= 2 * 2 * 4 * per_head  # forward + backward, B=2, H=4


@pytest.mark.parametrize("kernel, threads", [("torch", 1), ("native", 1), ("native", 4)])
def test_groups_with_empty_rows_give_zero(kernel, threads):
    """chunked_attention(groups=3) == each interleaved sequence alone (GQA: 2 query heads on
    one kv head), rows that see nothing giving out 0, lse -inf and gradient 0. 4 threads on
    B·Hkv·g = 3 kv sequences: the kernel splits each one's query blocks between threads."""
    if kernel == "native" and not native.available():
        pytest.skip("no compiled kernel")
    dtype = torch.float32 if kernel == "native" else torch.float64
    g, t = 3, 7
    lo = torch.tensor([0, 0, 5, 2, 0, 4, 6])
    hi = torch.tensor([3, 0, 7, 2, 1, 7, 7])  # rows 1 and 3 see nothing
    mask = RowIntervals(lo, hi, t) & window(t, 3)
    q = torch.randn(1, 2, g * t, 4, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(1, 1, g * t, 4, dtype=dtype, requires_grad=True) for _ in range(2))
    kw = dict(bias=None, causal=True, scale=0.5, dropout_p=0.0, training=False, kernel=kernel)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, lse = chunked_attention(q, k, v, mask=mask, groups=g, **kw)
        cot = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), cot)
    finally:
        torch.set_num_threads(before)
    sq, sk, sv = (split_groups(x.detach().double(), g).requires_grad_() for x in (q, k, v))
    dense = mask.dense() & masks.causal(t)
    ref = attnkit.attention(sq, sk, sv, mask=dense, scale=0.5, backend="reference").out
    torch.testing.assert_close(out.double(), merge_groups(ref, g), rtol=0, atol=1e-6)
    position = torch.arange(g * t) // g  # each token's position in its sequence
    blind = (position == 1) | (position == 3)
    assert torch.all(out[:, :, blind] == 0) and torch.all(lse[:, :, blind] == -torch.inf)
    assert torch.all(got[0][:, :, blind] == 0)
    want = torch.autograd.grad(ref, (sq, sk, sv), split_groups(cot.double(), g))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), merge_groups(b, g), rtol=0, atol=1e-5)


def test_groups_refuse_bias_dropout_and_masks_of_their_own():
    q = torch.randn(1, 1, 6, 4)
    kw = dict(mask=None, causal=False, scale=1.0, training=True, groups=2)
    with pytest.raises(ValueError, match="groups > 1 takes no bias, dropout or score_mod"):
        chunked_attention(q, q, q, bias=torch.zeros(6, 6), dropout_p=0.0, **kw)
    with pytest.raises(ValueError, match="groups > 1 takes no bias, dropout or score_mod"):
        chunked_attention(q, q, q, bias=None, dropout_p=0.5, **kw)
    kw |= {"training": False}
    per_row = torch.ones(2, 1, 1, 3, dtype=torch.bool)  # a key padding mask of batch 2
    for mask, got in ((torch.ones(3, 3, dtype=torch.bool), "a tensor"),
                      (window(3, 1) & per_row, "batch 2")):  # fmt: skip
        with pytest.raises(ValueError, match=f"the mask is one sequence's.*got {got}"):
            chunked_attention(q, q, q, bias=None, dropout_p=0.0, **kw | {"mask": mask})


@needs_kernel
def test_second_order_gradients_through_interleaved_sequences():
    mask, dense = _grouped_kinds()["dilated"]
    q, k, v = (t.detach().float().requires_grad_() for t in _gqa_inputs(mask.n, torch.float64))
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))

    def grad_norm(qq, kk, vv, m):
        out = attnkit.attention(qq, kk, vv, mask=m, backend="chunked" if m is mask else "reference")
        (gq,) = torch.autograd.grad(out.out.square().sum(), qq, create_graph=True)
        return torch.autograd.grad(gq.square().sum(), (qq, kk, vv))

    got, want = grad_norm(q, k, v, mask), grad_norm(qd, kd, vd, dense)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not native.available(), reason="the plan is the compiled kernel's")
def test_calls_on_interleaved_sequences_plan_their_window_once(monkeypatch):
    """The window of the interleaved sequences is the same object call after call, so the
    kernel's plan cached on it (row intervals, query block) is made once, not per call."""
    from attnkit.functional import _mask_plan
    from attnkit.functional.reordered import Groups, group_call

    first = group_call(Groups(4, 21, False), 103)["m"]
    assert group_call(Groups(4, 21, False), 103)["m"] is first
    assert group_call(Groups(4, 21, True), 103)["m"] is not first  # another window
    planned = []
    choose = _mask_plan.choose_block_q
    monkeypatch.setattr(_mask_plan, "choose_block_q", lambda *a: planned.append(1) or choose(*a))
    q = torch.randn(1, 2, 412, 8)
    mask = masks.dilated_window(412, 21, 4)  # 4 sequences of 103 tokens, windows of 21
    for _ in range(3):
        attnkit.attention(q, q, q, mask=mask, backend="chunked")
    assert len(planned) == 1


@pytest.mark.parametrize("shape", [(2, 3, 97, 5), (1, 1, 7), (1, 4, 1025, 64)])
def test_the_gather_through_the_flat_view_is_index_select(shape):
    """`_take` (the reordered path's gathers and scatters): index_select along the token axis,
    values and gradients, on contiguous tensors and on views that are not."""
    gen = torch.Generator().manual_seed(len(shape))
    index = torch.randperm(shape[2], generator=gen)
    x = torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
    for view in (x, x.transpose(0, 1)):
        got, want = _take(view, index), view.index_select(2, index)
        assert torch.equal(got, want)
        weights = torch.randn(want.shape, generator=gen, dtype=torch.float64)
        (g_got,) = torch.autograd.grad((got * weights).sum(), x)
        (g_want,) = torch.autograd.grad((want * weights).sum(), x)
        assert torch.equal(g_got, g_want)
