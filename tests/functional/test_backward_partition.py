"""How the compiled kernel's backward shares its work among threads (_native/partition.h).

Legend: B batch, H heads, Hkv kv heads, N queries, S keys, D head width, Dv value width.

With fewer than 4 kv heads a thread, each kv head's query blocks are cut into runs of equal
work whose dk, dv sums meet in fixed order after the loop; `_backward` has the kernel write
dk and dv (each head's first run zeroes its rows). Pinned to the float64 truth at 1, 2 and 3
threads on shapes that split (few kv heads, several query blocks, odd sizes, N != S,
structured masks with query blocks that see nothing), and run to run: the sums do not depend
on which thread came first.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional import native
from tests.functional.test_native import check_against_truth, make
from tests.functional.test_runs import band as _band


def band(n, offset, width):
    return _band(n, n, offset, width)


pytestmark = pytest.mark.skipif(not native.available(), reason="no compiled kernel")


@pytest.fixture(params=[1, 2, 3], ids=lambda t: f"{t}threads")
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


SHAPES = [  # (B, H, Hkv, N, S, D, Dv): B·Hkv < 8 · threads, several 128-row query blocks
    (1, 8, 8, 300, 300, 24, 24),  # B=1, H=8: whole heads on 2 threads, 2 runs a head on 3
    (1, 4, 1, 517, 517, 16, 8),  # one kv head (GQA): 3 runs
    (2, 3, 3, 257, 1025, 32, 16),  # N < S
    (1, 2, 2, 401, 130, 8, 8),  # N > S: causal leaves the first rows with no key
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_split_backward_matches_float64_truth(threads, shape, causal):
    check_against_truth(*make(*shape, seed=3), causal=causal, scale=0.4)


def _grads(q, k, v, mask, cot):
    ins = [t.detach().float().requires_grad_() for t in (q, k, v)]
    out = attnkit.attention(*ins, mask=mask, backend="chunked").out
    return out, torch.autograd.grad(out, ins, cot.float())


STRUCTURED = {
    "documents": lambda n: masks.document(masks.document_ids([40, 150, 3, n - 193])),
    "window": lambda n: masks.window(n, 37, causal=True),
    "narrow window": lambda n: masks.window(n, 5),  # the row path (9 keys a row)
    "dilated": lambda n: masks.dilated_window(n, 20, 3),  # interleaved sequences
    "neighbourhood": lambda n: masks.neighborhood_2d(n // 20, 20, 5),  # tiles
    "runs": lambda n: masks.window(n, 9) | band(n, 150, 7) | band(n, -200, 4),  # 3 runs a row
}


@pytest.mark.parametrize("kind", list(STRUCTURED))
def test_structured_split_backward_matches_the_reference(threads, kind):
    n = 400
    q, k, v = make(1, 4, 2, n, n, 16, 12, seed=5)
    mask = STRUCTURED[kind](n)
    cot = torch.randn(1, 4, n, 12, generator=torch.Generator().manual_seed(6), dtype=q.dtype)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    want = attnkit.attention(*ref_in, mask=mask, backend="reference").out
    gw = torch.autograd.grad(want, ref_in, cot)
    got, gg = _grads(q, k, v, mask, cot)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6)
    for name, a, b in zip(("dq", "dk", "dv"), gg, gw, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=3e-5, msg=name)


def test_split_backward_is_the_same_run_to_run():
    q, k, v = make(1, 6, 2, 700, 700, 32, 32, seed=8)
    cot = torch.randn(1, 6, 700, 32, generator=torch.Generator().manual_seed(9), dtype=q.dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        first = _grads(q, k, v, masks.causal(700), cot)
        for _ in range(3):
            again = _grads(q, k, v, masks.causal(700), cot)
            for a, b in zip((first[0], *first[1]), (again[0], *again[1]), strict=True):
                assert torch.equal(a, b)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("groups", [1, 3])
def test_written_gradients_ignore_what_dk_and_dv_held(threads, causal, groups):
    """`_backward` has the kernel write dk and dv (each kv head's first run zeroes its rows):
    into memory full of NaN the numbers are those added to zeros, bit for bit, on whole heads
    and on runs (2 kv heads, 3 interleaved sequences: runs from 2 threads on)."""
    q, k, v = (t.float() for t in make(1, 4, 2, 3 * 190, 3 * 190, 16, 8, seed=11))
    kw = dict(causal=causal, scale=0.3, keep_t=1 << 32, inv_keep=1.0, seed=None, groups=groups)
    none = dict(mask=None, bias=None)
    out, lse = native._forward(q, k, v, **none, **kw)
    dout = torch.randn_like(out)
    added = [torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)]
    native._backward_into(*added, dout, None, q, k, v, out, lse, **none, **kw)
    written = [torch.empty_like(q), torch.full_like(k, math.nan), torch.full_like(v, math.nan)]
    native._backward_into(*written, dout, None, q, k, v, out, lse, **none, **kw, accumulate=False)
    for a, b in zip(added, written, strict=True):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(added, native._backward(
        dout, None, q, k, v, out, lse, **none, **kw), strict=True))  # fmt: skip
