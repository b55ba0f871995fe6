"""`torch.library.opcheck` on the compiled kernel's operators, attnkit::attention_fwd / _bwd.

opcheck's default test_utils: the schema (no hidden mutation or aliasing), the fake
implementation against the real one, the autograd registration, and AOT dispatch (the
operators as torch.compile and torch.export see them).
"""

from __future__ import annotations

import pytest
import torch

from attnkit.functional import native
from attnkit.functional._dropout import NO_DROPOUT, keep_threshold

pytestmark = pytest.mark.skipif(not native.available(), reason="no C++ compiler here")

B, H, N, S, D = 2, 2, 5, 7, 8


def _inputs(*, mask: bool, bias: bool, causal: bool, p: float, grad: bool):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (N, S, S))
    allowed = None
    if mask:
        allowed = torch.rand(B, 1, N, S, generator=g) > 0.3
        allowed[0, 0, 1] = False  # a query that sees nothing: output 0
    scores = torch.randn(1, H, N, S, generator=g) if bias else None
    keep_t, inv_keep = keep_threshold(p)
    seed = torch.tensor(1234, dtype=torch.int64) if p > 0 else None
    for t in (q, k, v):
        t.requires_grad_(grad)
    return (q, k, v, allowed, scores, causal, D**-0.5, keep_t, inv_keep, seed)


CASES = [
    dict(mask=False, bias=False, causal=False, p=0.0),
    dict(mask=True, bias=False, causal=False, p=0.0),
    dict(mask=False, bias=True, causal=True, p=0.0),
    dict(mask=True, bias=True, causal=True, p=0.25),
    dict(mask=False, bias=False, causal=False, p=0.5),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_opcheck_attention_fwd(case):
    args = _inputs(**case, grad=True)  # inputs needing a gradient: the autograd test runs too
    torch.library.opcheck(torch.ops.attnkit.attention_fwd.default, args)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_opcheck_attention_bwd(case):
    with_dlse = case["causal"]  # a gradient of the lse too, or only of out
    q, k, v, mask, bias, causal, scale, keep_t, inv_keep, seed = _inputs(**case, grad=False)
    out, lse = torch.ops.attnkit.attention_fwd(q, k, v, mask, bias, causal, scale, keep_t,
                                               inv_keep, seed)  # fmt: skip
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse) if with_dlse else None
    args = (dout, dlse, q, k, v, out, lse, mask, bias, causal, scale, keep_t, inv_keep, seed)
    torch.library.opcheck(torch.ops.attnkit.attention_bwd.default, args)


def test_operator_gradient_matches_float64_reference():
    """The registered autograd formula gives the float64 reference gradient (no dropout)."""
    q, k, v, mask, bias, causal, scale, *_ = _inputs(
        mask=True, bias=True, causal=True, p=0.0, grad=True
    )
    args = (mask, bias, causal, scale, NO_DROPOUT, 1.0, None)
    out, _ = torch.ops.attnkit.attention_fwd(q, k, v, *args)
    out.sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    allowed = mask & torch.ones(N, S, dtype=torch.bool).tril(S - N)
    scores = (q64 @ k64.transpose(-1, -2)) * scale + bias.double()
    scores = scores.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(scores, -1).nan_to_num(0.0)  # fully masked rows: 0
    (p @ v64).sum().backward()
    for ours, ref in ((out, p @ v64), (q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(ours.double(), ref.detach(), atol=1e-5, rtol=1e-5)
