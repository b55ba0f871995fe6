"""The compiled kernel's row path: query blocks whose rows each see a few keys of a wider span
(narrow windows) are computed a row at a time over each row's own keys (_native/row_path.h's
`row_path`). Same function as the block path: pinned here to the float64 reference with every
feature a row meets (dense masks with empty rows, bias, causal, GQA, score functions, dropout)."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks, score_mods
from attnkit.analysis.kernel_work import kernel_work
from attnkit.functional import native
from attnkit.functional.chunked import chunked_attention

pytestmark = pytest.mark.skipif(not native.available(), reason="no compiled kernel")


def _inputs(n, s, hkv=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, n, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, hkv, s, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, hkv, s, 12, generator=g, dtype=torch.float64)
    return q, k, v


def _both(q, k, v, **kw):
    """Outputs and gradients of a float32 chunked call (the kernel) and the float64 reference."""
    want = attnkit.attention(*(t.requires_grad_() for t in (q, k, v)), backend="reference", **kw)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    got = attnkit.attention(q32, k32, v32, backend="chunked", **kw)
    cot = torch.randn_like(want.out)
    gw = torch.autograd.grad(want.out, (q, k, v), cot)
    gg = torch.autograd.grad(got.out, (q32, k32, v32), cot.float())
    return got.out, want.out, gg, gw


@pytest.mark.parametrize("n, s", [(97, 97), (1, 40), (33, 70), (129, 129)])
@pytest.mark.parametrize("causal", [False, True])
def test_narrow_windows_with_padding_bias_and_gqa(n, s, causal):
    q, k, v = _inputs(n, s)
    keep = torch.ones(2, 1, 1, s, dtype=torch.bool)
    keep[1, ..., s // 2 :] = False  # batch row 1: the second half of the keys is padding
    mask = masks.window(n, 4, s) & keep  # so its last rows see nothing
    bias = torch.randn(1, 4, n, s, dtype=torch.float64)
    got, want, gg, gw = _both(q, k, v, mask=mask, bias=bias, causal=causal)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6)
    for a, b in zip(gg, gw, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5)
    dense = (mask.dense() & masks.causal(n, s)) if causal else mask.dense()
    blind = ~dense.expand(2, 4, n, s).any(-1)  # (B, H, N): rows that see nothing
    assert blind.any() and torch.all(got[blind] == 0)


def test_lse_and_empty_rows_on_the_row_path():
    n = 50
    q, k, v = (t.float() for t in _inputs(n, n, hkv=4))
    lo = torch.arange(n) - 3
    hi = torch.where(torch.arange(n) % 7 == 0, lo, torch.arange(n) + 4)  # every 7th row: none
    mask = masks.window(n, 10) & attnkit.functional.structured.RowIntervals(lo, hi, n)
    assert kernel_work(mask, heads=4, batch=2).blocks == 0  # the forward takes the row path
    out, lse = chunked_attention(
        q, k, v, mask=mask, bias=None, causal=False, scale=0.25, dropout_p=0.0, training=False
    )
    scores = (q.double() @ k.double().transpose(-1, -2) * 0.25).masked_fill(
        ~mask.dense(), -torch.inf
    )
    want_lse = torch.logsumexp(scores, -1)
    blind = torch.arange(n) % 7 == 0
    assert torch.all(lse[..., blind] == -torch.inf) and torch.all(out[..., blind, :] == 0)
    torch.testing.assert_close(lse[..., ~blind].double(), want_lse[..., ~blind], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "score_mod",
    [score_mods.softcap(2.0), score_mods.alibi(torch.tensor([0.5, 0.25, 0.125, 0.0625]))],
    ids=["softcap", "alibi"],
)
def test_score_functions_on_the_row_path(score_mod):
    n = 77
    q, k, v = _inputs(n, n)
    mask = masks.window(n, 6, causal=True)
    assert kernel_work(mask).blocks == 0
    got, want, gg, gw = _both(q, k, v, mask=mask, score_mod=score_mod)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6)
    for a, b in zip(gg, gw, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5)


@pytest.mark.parametrize("threads", [1, 4])  # 4 threads on B·Hkv = 2 kv heads: split blocks
def test_dropout_drops_the_entries_of_the_pytorch_kernel(threads):
    """Same seed, same dropped entries on the row path as on the PyTorch kernel's blocks,
    forward and backward."""
    n = 90
    results = []
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for kernel in ("native", "torch"):
            q, k, v = (t.float().requires_grad_() for t in _inputs(n, n, hkv=1))
            torch.manual_seed(7)
            out, lse = chunked_attention(
                q, k, v, mask=masks.window(n, 3), bias=None, causal=False, scale=0.25,
                dropout_p=0.4, training=True, kernel=kernel,
            )  # fmt: skip
            cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
            results.append((out, *torch.autograd.grad((out * cot).sum() + lse.sum(), (q, k, v))))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
