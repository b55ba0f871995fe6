"""The compiled kernel merges adjacent key blocks of a tiled mask into one product
(`kMergeKeys` in _native/masks.h): full and partial blocks side by side, the last block cut
short, with a score function whose derivative buffer grows with the block, forward and
backward against float64.

Legend: B batch, H query heads, Hkv key/value heads, N queries, S keys, D head width.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks, score_mods
from attnkit.functional import native
from attnkit.functional._mask_plan import call_plan

pytestmark = pytest.mark.skipif(not native.available(), reason="no compiled kernel")


def _predicate(q, k):
    """A band with holes: adjacent non-empty blocks, some full, some partial, and a row
    (query 5) that sees nothing."""
    return ((q - k).abs() < 40) & ((q * 3 + k) % 5 != 0) & (q != 5)


@pytest.mark.parametrize("n, s", [(513, 513), (261, 411)])
@pytest.mark.parametrize("cap", [None, 2.0])
def test_merged_blocks_equal_the_float64_reference(n, s, cap):
    mask = masks.from_function(lambda b, h, q, k: _predicate(q, k), n, s)
    plan = call_plan(mask, torch.device("cpu"), None, None, True)
    assert plan.table is not None and plan.rows is None  # tiles, no runs: blocks merge
    row = plan.table[0, 0]
    assert ((row[:, :-1] != -1) & (row[:, 1:] != -1)).any()  # adjacent non-empty blocks
    assert (row == -2).any() or n != s  # 513: a full block among them
    g = torch.Generator().manual_seed(n)
    q64 = torch.randn(2, 4, n, 8, generator=g, dtype=torch.float64)
    k64, v64 = (torch.randn(2, 2, s, w, generator=g, dtype=torch.float64) for w in (8, 5))
    q, k, v = (t.float().requires_grad_() for t in (q64, k64, v64))
    leaves = [t.requires_grad_() for t in (q64, k64, v64)]
    mod = None if cap is None else score_mods.softcap(cap)
    r = attnkit.attention(q, k, v, mask=mask, score_mod=mod, backend="chunked")
    scores = q64 @ k64.repeat_interleave(2, 1).transpose(-1, -2) * 8**-0.5
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    allowed = _predicate(torch.arange(n)[:, None], torch.arange(s)[None])
    scores = scores.masked_fill(~allowed, -torch.inf).masked_fill(~allowed.any(-1)[:, None], 0)
    p = torch.softmax(scores, -1).masked_fill(~allowed.any(-1)[:, None], 0)
    want = p @ v64.repeat_interleave(2, 1)
    torch.testing.assert_close(r.out.double(), want.detach(), rtol=0, atol=2e-6)
    assert torch.all(r.out[:, :, 5] == 0)
    cot = torch.randn_like(want)
    got = torch.autograd.grad(r.out, (q, k, v), cot.float())
    ref = torch.autograd.grad(want, leaves, cot)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5)
