"""The compiled kernel's query row map (`Args::qrows`, `native_attention(qrows=)`): query
position i of the mask is row qrows[i] of q, out, lse and their gradients, so a reordered mask
(`masks.neighborhood_2d`, a strided mask whose stride does not divide N) gathers only k and v.

Legend: B batch, H query heads, Hkv key/value heads, N = S tokens, D head width, Dv value width.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional import chunked, native, reordered
from attnkit.functional._dropout import NO_DROPOUT, keep_threshold
from attnkit.functional._mask_plan import call_plan
from attnkit.functional.chunked import chunked_attention
from attnkit.functional.structured import RowIntervals, window

pytestmark = pytest.mark.skipif(not native.available(), reason="no compiled kernel")


def _tensors(b, h, hkv, n, d, dv, seed=0):
    """float64 q (B, H, N, D), k (B, Hkv, N, D), v (B, Hkv, N, Dv)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, hkv, n, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, hkv, n, dv, generator=g, dtype=torch.float64)
    return q, k, v


def _position_masks(n):
    """Masks over (query position, key), each with rows that see nothing: a narrow window
    (the row path), a predicate (partial tiles), a dense tensor, none but causal."""
    lo = (torch.arange(n) - 2).clamp(min=0)
    hi = torch.arange(n) + 3
    hi[n // 3] = lo[n // 3]  # a row that sees nothing
    narrow = RowIntervals(lo, hi, n) & window(n, 2)
    pred = masks.from_function(lambda b, h, q, k: ((q * 7 + k * 3) % 5 < 2) & (q != n // 2), n)
    dense = torch.rand(n, n, generator=torch.Generator().manual_seed(5)) < 0.4
    return {"narrow": (narrow, False), "predicate": (pred, False), "dense": (dense, False),
            "causal": (None, True)}  # fmt: skip


def _allowed(m, causal, n):
    """The (N, N) booleans of query position i and key j."""
    if m is None:
        allowed = torch.ones(n, n, dtype=torch.bool)
    else:
        allowed = m if isinstance(m, torch.Tensor) else m.dense()[0, 0]
    return allowed & torch.ones(n, n, dtype=torch.bool).tril() if causal else allowed


def _reference(q, k, v, allowed, scale):
    """float64 out and lse with the mask given per query row; fully masked rows give 0 and
    -inf, and no gradient (their scores are set to 0 before the softmax, then dropped)."""
    rep = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(rep, 1) for t in (k, v))
    blind = ~allowed.any(-1)  # (N,)
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, -torch.inf)
    s = s.masked_fill(blind[:, None], 0.0)
    p = torch.softmax(s, -1).masked_fill(blind[:, None], 0.0)
    return p @ v, torch.logsumexp(s, -1).masked_fill(blind, -torch.inf)


def _run_kernel(q, k, v, m, causal, scale, qrows):
    plan = call_plan(m, q.device, None, None, True) if hasattr(m, "key_runs") else None
    dense = plan.dense if plan is not None else m
    t_keep, inv_keep = keep_threshold(0.0)
    return native.native_attention(
        q, k, v, mask=dense, bias=None, causal=causal, scale=scale, keep_t=t_keep,
        inv_keep=inv_keep, seed=None, plan=plan, qrows=qrows,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["narrow", "predicate", "dense", "causal"])
@pytest.mark.parametrize("n", [1, 7, 97])
@pytest.mark.parametrize("threads", [1, 3])
def test_rows_through_the_map_equal_the_float64_reference(kind, n, threads):
    """B=2, H=4 on Hkv=2 (GQA), D=8, Dv=6, a random permutation: out, lse, dq, dk, dv
    against the float64 reference whose row qrows[i] takes position i's mask; a gradient of
    lse too; rows that see nothing give out 0, lse -inf and dq 0. 3 threads split the
    backward's kv heads into runs with private slots."""
    m, causal = _position_masks(n)[kind]
    qrows = torch.randperm(n, generator=torch.Generator().manual_seed(n))
    q, k, v = _tensors(2, 4, 2, n, 8, 6)
    token_mask = _allowed(m, causal, n)[torch.argsort(qrows)]  # row qrows[i] = position i's
    q64, k64, v64 = (t.clone().requires_grad_() for t in (q, k, v))
    want, want_lse = _reference(q64, k64, v64, token_mask, 0.3)
    q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, lse = _run_kernel(q32, k32, v32, m, causal, 0.3, qrows)
        cot, cot_lse = torch.randn_like(out), torch.randn_like(lse)
        got = torch.autograd.grad((out, lse), (q32, k32, v32), (cot, cot_lse))
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out.double(), want.detach(), rtol=0, atol=2e-6)
    torch.testing.assert_close(lse.double(), want_lse.detach(), rtol=0, atol=2e-6)
    grads = torch.autograd.grad((want, want_lse), (q64, k64, v64), (cot.double(), cot_lse.double()))
    for a, b in zip(got, grads, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5)
    rows = token_mask.any(-1)  # tokens whose query position sees a key
    if not rows.all():
        assert torch.all(out[:, :, ~rows] == 0) and torch.all(got[0][:, :, ~rows] == 0)


def _count_gathers(monkeypatch):
    counted = []
    take = reordered._take
    monkeypatch.setattr(reordered, "_take", lambda x, o: counted.append(x.shape) or take(x, o))
    return counted


@pytest.mark.parametrize(
    "mask",
    [masks.neighborhood_2d(9, 11, (5, 3)), masks.strided(97, 10), masks.dilated_window(61, 3, 4)],
    ids=lambda m: m.describe(),
)
def test_reordered_masks_gather_only_keys_and_values(mask, monkeypatch):
    """On the kernel a reordered mask gathers k and v (forward) and scatters dk, dv back
    (backward): 4 gathers, where q, out, lse, dO and dq made 9; results and gradients, lse's
    included, equal the token-order mask on the float64 reference. B=2, GQA. (A 2-D
    neighbourhood's training step runs in token order where the kernel's backward takes its
    runs, test_offset_runs.py: kept reordered here.)"""
    monkeypatch.setattr(chunked, "_natural_forward", lambda *args: False)
    n, dense = mask.n, mask.dense()[0, 0]
    q, k, v = _tensors(2, 4, 2, n, 8, 6, seed=1)
    q64, k64, v64 = (t.clone().requires_grad_() for t in (q, k, v))
    want, want_lse = _reference(q64, k64, v64, dense, 8**-0.5)
    q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
    counted = _count_gathers(monkeypatch)
    kw = dict(bias=None, causal=False, scale=8**-0.5, dropout_p=0.0, training=False)
    out, lse = chunked_attention(q32, k32, v32, mask=mask, **kw)
    assert [s[1] for s in counted] == [2, 2]  # k and v: Hkv = 2 heads
    cot, cot_lse = torch.randn_like(out), torch.randn_like(lse)
    got = torch.autograd.grad((out, lse), (q32, k32, v32), (cot, cot_lse))
    assert len(counted) == 4  # and dk, dv back
    torch.testing.assert_close(out.double(), want.detach(), rtol=0, atol=2e-6)
    torch.testing.assert_close(lse.double(), want_lse.detach(), rtol=0, atol=2e-6)
    grads = torch.autograd.grad((want, want_lse), (q64, k64, v64), (cot.double(), cot_lse.double()))
    for a, b in zip(got, grads, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5)


def test_the_pytorch_kernel_still_gathers_the_queries(monkeypatch):
    """float64 runs on the PyTorch kernel, which has no row map: q, k, v in, out, lse back,
    exact against the reference."""
    mask = masks.neighborhood_2d(7, 13, 5)
    q, k, v = _tensors(1, 2, 2, mask.n, 4, 4, seed=2)
    counted = _count_gathers(monkeypatch)
    got = attnkit.attention(q, k, v, mask=mask, backend="chunked").out
    assert len(counted) == 5
    want, _ = _reference(q, k, v, mask.dense()[0, 0], 0.5)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_opcheck_with_a_row_map():
    """The operators as torch.compile / export see them, with qrows (schema, fake, autograd)."""
    n = 6
    q, k, v = (t.float().requires_grad_() for t in _tensors(1, 2, 1, n, 4, 4, seed=3))
    qrows = torch.tensor([3, 0, 5, 1, 4, 2])
    mask = torch.rand(n, n, generator=torch.Generator().manual_seed(1)) < 0.6
    args = (q, k, v, mask, None, False, 0.5, NO_DROPOUT, 1.0, None, None, None, None, 1, qrows)
    torch.library.opcheck(torch.ops.attnkit.attention_fwd.default, args)
    out, _ = torch.ops.attnkit.attention_fwd(*args)
    want, _ = _reference(q.double(), k.double(), v.double(), mask[torch.argsort(qrows)], 0.5)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-6)


@pytest.mark.parametrize(
    "qrows, extra, match",
    [
        (torch.arange(5, dtype=torch.int32), {}, r"int64 of shape \(5,\), got torch.int32"),
        (torch.arange(4), {}, r"of shape \(5,\), got torch.int64 \(4,\)"),
        (torch.tensor([0, 1, 2, 3, 5]), {}, r"qrows must lie in 0..4"),
        (torch.arange(5), {"keep_t": 1 << 31}, r"qrows takes groups = 1 and no dropout"),
    ],
)
def test_bad_row_maps_are_refused_by_name(qrows, extra, match):
    q = torch.randn(1, 1, 5, 4)
    kw = dict(mask=None, bias=None, causal=False, scale=1.0, keep_t=NO_DROPOUT, inv_keep=1.0,
              seed=None, qrows=qrows) | extra  # fmt: skip
    with pytest.raises(ValueError, match=match):
        native.native_attention(q, q, q, **kw)
