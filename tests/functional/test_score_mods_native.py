"""Built-in score functions on the compiled CPU kernel: float32 against a float64 reference of the
same function on the full score matrix, with masks (dense, structured), causal N != S, GQA,
dropout and lse; the relative table's gradient; second-order gradients; and the routing (which
calls the kernel takes)."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit import score_mods as sm
from attnkit.functional import _native_mod, alibi_slopes, native
from attnkit.functional.chunked import chunked_attention
from tests.functional.test_score_mods import _naive

pytestmark = pytest.mark.skipif(
    not native.available(), reason="compiled kernel unavailable (no C++ compiler)"
)

B, H, HKV, D = 2, 4, 2, 16


def _builtins():
    """name -> (score function, its table or None), every form the kernel runs."""
    t5 = torch.randn(32, H, dtype=torch.float64)
    swin = torch.randn(13**2, H, dtype=torch.float64)
    slopes = alibi_slopes(H)
    return {
        "softcap": (sm.softcap(2.0), None),
        "alibi": (sm.alibi(slopes, offset=5), None),
        "alibi-symmetric": (sm.alibi(slopes, symmetric=True), None),
        "t5": (lambda t: sm.relative_bias(t, sm.t5_buckets(32, 40, offset=-3)), t5),
        "t5-causal": (
            lambda t: sm.relative_bias(t, sm.t5_buckets(16, 20, bidirectional=False)),
            t5[:16],
        ),
        "swin": (lambda t: sm.relative_bias(t, sm.window_offsets(7)), swin),
        "t5+softcap+alibi": (
            lambda t: sm.relative_bias(t, sm.t5_buckets()) + sm.softcap(3.0) + sm.alibi(slopes),
            t5,
        ),
        "alibi+softcap+t5": (
            lambda t: sm.alibi(slopes) + sm.softcap(1.5) + sm.relative_bias(t, sm.t5_buckets()),
            t5,
        ),
    }


NAMES = list(_builtins())


def _make(name, dtype):
    fn, table = _builtins()[name]
    if table is None:
        return fn, None, fn  # a slopes-only function is the same in both precisions
    t = table.to(dtype).requires_grad_()
    t64 = table.clone().requires_grad_()
    return fn(t), t, (fn(t64), t64)


def _case(name, case, seed=0):
    n, s = (49, 49) if name == "swin" else (70, 131)
    g = torch.Generator().manual_seed(seed)
    q64 = torch.randn(B, H, n, D, generator=g, dtype=torch.float64)
    k64 = torch.randn(B, HKV, s, D, generator=g, dtype=torch.float64)
    v64 = torch.randn(B, HKV, s, D - 3, generator=g, dtype=torch.float64)
    kw, ref = {}, {}
    if case == "causal":
        kw["causal"] = ref["causal"] = True
    elif case == "dense-mask":
        dense = torch.rand(n, s, generator=g) > 0.3
        dense[4] = False
        kw["mask"] = ref["mask"] = dense
    elif case == "structured":
        kw["mask"] = masks.prefix(n, 9, s=s) if n != s else masks.window(n, 6, causal=True)
        ref["mask"] = kw["mask"].dense()[0, 0]
    elif case == "bias":
        bias = torch.randn(n, s, generator=g, dtype=torch.float64)
        kw["bias"], ref["bias"] = bias.float(), bias
    return (q64, k64, v64), kw, ref


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", ["plain", "causal", "dense-mask", "structured", "bias"])
def test_kernel_matches_float64_reference(name, case):
    (q64, k64, v64), kw, ref = _case(name, case)
    fn32, t32, pair = _make(name, torch.float32)
    fn64, t64 = pair if t32 is not None else (pair, None)
    q, k, v = (t.float().requires_grad_() for t in (q64, k64, v64))
    leaves64 = [t.requires_grad_() for t in (q64, k64, v64)]
    assert _native_mod.plan(fn32, q.shape[2], k.shape[2]) is not None
    with native.count_work() as work:
        r = attnkit.attention(q, k, v, score_mod=fn32, backend="chunked", **kw)
        assert int(work) > 0  # the compiled kernel ran it
        want, wlse = _naive(*leaves64, fn64, **ref)
        torch.testing.assert_close(r.out, want.float(), atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(r.lse, wlse.float(), atol=2e-5, rtol=1e-4)
        g_out = torch.randn_like(want)
        g_lse = torch.randn_like(wlse).masked_fill(torch.isneginf(wlse), 0.0)
        params = [q, k, v] + ([t32] if t32 is not None else [])
        params64 = leaves64 + ([t64] if t64 is not None else [])
        loss = (r.out * g_out.float()).sum() + (r.lse.nan_to_num(neginf=0) * g_lse.float()).sum()
        gs = torch.autograd.grad(loss, params)
    loss64 = (want * g_out).sum() + (wlse.nan_to_num(neginf=0) * g_lse).sum()
    ws = torch.autograd.grad(loss64, params64)
    for a, w in zip(gs, ws, strict=True):
        scale = w.abs().max().clamp_min(1.0)
        torch.testing.assert_close(a.double() / scale, w / scale, atol=3e-5, rtol=0)


@pytest.mark.parametrize("name", ["softcap", "t5+softcap+alibi", "swin"])
def test_kernel_dropout_draws_the_torch_kernels_bits(name):
    """Training with dropout: the compiled kernel keeps the same entries as the PyTorch kernel
    (whose stream the other tests pin to the no-score_mod stream), outputs and gradients."""
    (q64, k64, v64), _, _ = _case(name, "plain")
    fn, t, _ = _make(name, torch.float32)
    q, k, v = (x.float().requires_grad_() for x in (q64, k64, v64))
    res = []
    for kernel in ("native", "torch"):
        torch.manual_seed(7)
        o, lse = chunked_attention(
            q, k, v, mask=None, bias=None, causal=False, scale=D**-0.5, dropout_p=0.25,
            training=True, score_mod=fn, kernel=kernel,
        )  # fmt: skip
        params = [q, k, v] + ([t] if t is not None else [])
        res.append((o, lse, torch.autograd.grad(o.sum() + lse.sum(), params)))
    (o1, l1, g1), (o2, l2, g2) = res
    torch.testing.assert_close(o1, o2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(l1, l2, atol=1e-5, rtol=1e-5)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4 * b.abs().max().item() + 1e-5, rtol=1e-4)


def test_kernel_second_order_gradient_equals_the_torch_kernels():
    (q64, k64, v64), _, _ = _case("t5", "plain")
    fn, t, _ = _make("t5+softcap+alibi", torch.float32)
    q, k, v = (x.float().requires_grad_() for x in (q64, k64, v64))
    res = []
    for kernel in ("native", "torch"):
        o, _ = chunked_attention(
            q, k, v, mask=None, bias=None, causal=True, scale=D**-0.5, dropout_p=0.0,
            training=False, score_mod=fn, kernel=kernel,
        )  # fmt: skip
        gq, gt = torch.autograd.grad(o.square().sum(), (q, t), create_graph=True)
        res.append(torch.autograd.grad(gq.sum() + gt.square().sum(), (q, k, v, t)))
    for a, b in zip(*res, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4 * b.abs().max().item() + 1e-5, rtol=1e-4)


def test_what_the_kernel_takes():
    """The kernel runs built-ins (one of each); user functions, two tables, slopes that want a
    gradient and indices of the user's own go to the PyTorch kernel."""
    t = torch.zeros(32, H)
    slopes = alibi_slopes(H)
    rel = sm.relative_bias(t, sm.t5_buckets())
    assert _native_mod.plan(rel + sm.softcap(1.0) + sm.alibi(slopes), 8, 8) is not None
    assert _native_mod.plan(rel + rel, 8, 8) is None
    assert _native_mod.plan(sm.softcap(1.0) + sm.softcap(2.0), 8, 8) is None
    assert _native_mod.plan(lambda s, b, h, qi, ki: s, 8, 8) is None
    assert _native_mod.plan(sm.relative_bias(t, lambda qi, ki: (ki - qi).abs() % 32), 8, 8) is None
    assert _native_mod.plan(sm.alibi(slopes.clone().requires_grad_()), 8, 8) is None
    q = torch.randn(1, H, 8, D)
    with pytest.raises(ValueError, match="kernel='native' cannot run score_mod"):
        chunked_attention(
            q,
            q,
            q,
            mask=None,
            bias=None,
            causal=False,
            scale=1.0,
            dropout_p=0.0,
            training=False,
            score_mod=lambda s, *_: s,
            kernel="native",
        )
