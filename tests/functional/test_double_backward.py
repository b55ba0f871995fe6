"""Higher-order gradients (create_graph=True) through every backend: exact, or a clear refusal.

Legend: B batch, H heads, Hkv kv heads, N queries, S keys, D head width, Dv value width.

float64 is checked with torch.autograd.gradgradcheck (reference, fused, chunked's PyTorch kernel,
auto). The compiled kernel computes in float32 only, so its double backward is pinned to the
PyTorch kernel's in float64 (same dropout bits), within float32 tolerance.
"""

from __future__ import annotations

import pytest
import torch

from attnkit import attention
from attnkit.functional import _double_backward, native
from attnkit.functional._dropout import draw_seed, keep_threshold

needs_kernel = pytest.mark.skipif(not native.available(), reason="compiled kernel unavailable")

BACKENDS = ("reference", "fused", "chunked", "auto")
SDPA_NODE = "ScaledDotProductFlashAttentionForCpu"  # the fused CPU kernel's autograd node


def _mask(n, s, dead_row=True):
    """(N, S) True = may attend, with one row that sees nothing (out 0, gradients 0)."""
    allowed = torch.rand(n, s, generator=torch.Generator().manual_seed(7)) > 0.4
    allowed[:, 0] = True  # every other row sees at least one key
    if dead_row:
        allowed[1] = False
    return allowed


# name -> (H, Hkv, N, S, attention() keyword arguments)
CASES = {
    "plain": (2, 2, 3, 4, {}),
    "mask": (2, 2, 3, 4, {"mask": _mask(3, 4)}),
    "causal": (2, 2, 4, 4, {"causal": True}),
    "causal_n_ne_s": (2, 2, 3, 5, {"causal": True}),
    "gqa_mask": (4, 2, 3, 4, {"mask": _mask(3, 4)}),
    "bias": (2, 2, 3, 4, {"bias": torch.randn(3, 4, generator=torch.Generator().manual_seed(3))}),
    "dropout": (4, 2, 3, 5, {"dropout_p": 0.3, "training": True, "causal": True}),
}


def inputs(h, hkv, n, s, dtype=torch.float64, d=3, dv=None, seed=0):
    """q, k, v; Dv = D by default, which SDPA's fused CPU kernel needs (else its math path)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, h, n, d, generator=gen, dtype=dtype)
    k = torch.randn(1, hkv, s, d, generator=gen, dtype=dtype)
    v = torch.randn(1, hkv, s, dv or d, generator=gen, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v)]


def outputs(backend, **kw):
    """attention() as a function of q, k, v: out, and lse where the backend differentiates it
    (-inf of rows that see nothing replaced by 0, so finite differences stay finite)."""

    def fn(q, k, v):
        torch.manual_seed(0)  # the same dropout entries on every evaluation
        res = attention(q, k, v, backend=backend, **kw)
        if res.lse is None or not res.lse.requires_grad:
            return res.out
        return res.out, res.lse.masked_fill(res.lse.detach().isneginf(), 0.0)

    return fn


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradgradcheck_float64(backend, case):
    h, hkv, n, s, kw = CASES[case]
    fn = outputs(backend, **kw)
    args = inputs(h, hkv, n, s)
    if backend in ("fused", "auto") and "dropout_p" not in kw:  # SDPA's fused kernel, hooked
        assert attention(*args, backend=backend, **kw).out.grad_fn.name().startswith(SDPA_NODE)
    assert torch.autograd.gradcheck(fn, args)
    assert torch.autograd.gradgradcheck(fn, args)


def test_gradgradcheck_value_width_differs():
    """Dv != D (SDPA takes its math path there; the kernels do not care)."""
    args = inputs(4, 2, 3, 5, d=3, dv=2)
    for backend in BACKENDS:
        fn = outputs(backend, mask=_mask(3, 5), causal=True)
        assert torch.autograd.gradgradcheck(fn, args)


def test_gradgradcheck_chunked_bias_gradient():
    """A bias that needs a gradient (the PyTorch kernel's dbias), masked, GQA, dropout."""
    q, k, v = inputs(4, 2, 3, 4)
    bias = torch.randn(1, 1, 3, 4, dtype=torch.float64, requires_grad=True)

    def fn(q, k, v, bias):
        torch.manual_seed(0)
        kw = {"mask": _mask(3, 4), "dropout_p": 0.25, "training": True}
        out, _, lse = attention(q, k, v, bias=bias, backend="chunked", **kw)
        return out, lse.masked_fill(lse.detach().isneginf(), 0.0)

    assert torch.autograd.gradgradcheck(fn, (q, k, v, bias))


# ----------------------------------------------------------------- the compiled kernel


def _kernel_call(route, q, k, v, mask, causal, p, seed):
    """The compiled kernel through its eager autograd.Function or its registered operator."""
    keep_t, inv_keep = keep_threshold(p)
    f32 = [t.to(torch.float32) for t in (q, k, v)]
    args = (*f32, mask, None, causal, q.shape[-1] ** -0.5, keep_t, inv_keep, seed)
    fn = native._Eager.apply if route == "eager" else torch.ops.attnkit.attention_fwd
    return fn(*args)


def _torch_kernel(q, k, v, mask, causal, p, seed):
    """The PyTorch chunked kernel in float64 with the same seed: the same dropped entries."""
    from attnkit.functional import chunked

    keep_t, _ = keep_threshold(p)
    kw = {"causal": causal, "scale": q.shape[-1] ** -0.5, "t_keep": keep_t, "seed": seed}
    return chunked._ChunkedAttention.apply(q, k, v, mask, None, *kw.values(), 2, 3)


def _second_order(fn, q, k, v, gen):
    """Gradients of a random linear function of (out, lse) taken with create_graph, and the
    gradient of a random linear function of those gradients: everything second order sees."""
    out, lse = fn(q, k, v)
    lse = lse.masked_fill(lse.detach().isneginf(), 0.0)
    loss = (out.double() * torch.randn(out.shape, generator=gen, dtype=torch.float64)).sum()
    loss = loss + (lse.double() * torch.randn(lse.shape, generator=gen, dtype=torch.float64)).sum()
    first = torch.autograd.grad(loss, (q, k, v), create_graph=True)
    weights = [torch.randn(g.shape, generator=gen, dtype=torch.float64) for g in first]
    penalty = sum((g.double() * w).sum() for g, w in zip(first, weights, strict=True))
    return [*first, *torch.autograd.grad(penalty, (q, k, v))]


@needs_kernel
@pytest.mark.parametrize("route", ["eager", "operator"])
@pytest.mark.parametrize("case", ["mask", "causal_n_ne_s", "gqa_mask", "dropout"])
def test_compiled_kernel_second_order_matches_float64(route, case):
    h, hkv, n, s, kw = CASES[case]
    p = kw.get("dropout_p", 0.0)
    seed = draw_seed() if p else None
    mask, causal = kw.get("mask"), kw.get("causal", False)
    q64, k64, v64 = inputs(h, hkv, n, s, d=5)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q64, k64, v64))
    got = _second_order(
        lambda *t: _kernel_call(route, *t, mask, causal, p, seed), q32, k32, v32,
        torch.Generator().manual_seed(1),
    )  # fmt: skip
    want = _second_order(
        lambda *t: _torch_kernel(*t, mask, causal, p, seed), q64, k64, v64,
        torch.Generator().manual_seed(1),
    )  # fmt: skip
    for g, w in zip(got, want, strict=True):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g.double(), w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", ["chunked", "fused", "auto"])
def test_half_precision_second_order_is_close_to_float64(backend, dtype):
    h, hkv, n, s, kw = CASES["gqa_mask"]
    q64, k64, v64 = inputs(h, hkv, n, s, d=8)
    low = [t.detach().to(dtype).requires_grad_() for t in (q64, k64, v64)]
    exact = [t.detach().to(dtype).double().requires_grad_() for t in (q64, k64, v64)]

    def run(backend, q, k, v):
        return _second_order(
            lambda *t: (attention(*t, backend=backend, **kw).out, torch.zeros(1)), q, k, v,
            torch.Generator().manual_seed(2),
        )  # fmt: skip

    got, want = run(backend, *low), run("reference", *exact)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype and torch.isfinite(g).all()
        scale = w.abs().max().clamp_min(1.0)
        assert ((g.double() - w).abs().max() / scale) < 5e-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_that_see_nothing_get_zero_second_order_gradients(backend):
    q, k, v = inputs(2, 2, 3, 4, dtype=torch.float32)
    mask = _mask(3, 4)  # query 1 sees no key
    grads = _second_order(
        lambda *t: (attention(*t, mask=mask, backend=backend).out, torch.zeros(1)), q, k, v,
        torch.Generator().manual_seed(3),
    )  # fmt: skip
    dq, ddq = grads[0], grads[3]
    assert all(torch.isfinite(g).all() for g in grads)
    assert (dq[:, :, 1] == 0).all() and (ddq[:, :, 1] == 0).all()


# ----------------------------------------------------------------- SDPA


def test_fused_first_order_backward_keeps_sdpa_gradients():
    """Without create_graph the hook leaves SDPA's own gradients, bit for bit."""
    q, k, v = inputs(2, 2, 4, 4, dtype=torch.float32)
    out = attention(q, k, v, backend="fused", causal=True).out
    assert out.grad_fn.name().startswith(SDPA_NODE)
    got = torch.autograd.grad(out.sum(), (q, k, v))
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    plain = torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
    want = torch.autograd.grad(plain.sum(), (q2, k2, v2))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_fused_create_graph_after_a_retained_first_order_backward():
    q, k, v = inputs(2, 2, 3, 4)
    out = attention(q, k, v, backend="fused").out
    out.sum().backward(retain_graph=True)
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    (ddq,) = torch.autograd.grad(dq.square().sum(), q)
    ref = attention(q, k, v, backend="reference").out
    (rdq,) = torch.autograd.grad(ref.square().sum(), q, create_graph=True)
    (rddq,) = torch.autograd.grad(rdq.square().sum(), q)
    torch.testing.assert_close(ddq, rddq)


def test_fused_refuses_sdpa_dropout_it_cannot_replay(monkeypatch):
    """SDPA draws its dropout inside a fused kernel only off the CPU (CUDA); on the CPU it takes
    the math path, differentiable twice. The hook's refusal, driven by hand."""
    q, k, v = inputs(2, 2, 3, 4)
    out = attention(q, k, v, backend="fused").out
    node = out.grad_fn

    class WithDropout:  # the CUDA flash node's saved dropout_p
        _saved_dropout_p = 0.1

        def __getattr__(self, name):
            return getattr(node, name)

    monkeypatch.setattr(torch._C, "_current_autograd_node", WithDropout)
    with torch.enable_grad(), pytest.raises(NotImplementedError) as err:
        _double_backward._sdpa_hook((None,) * 3, (torch.ones_like(out),))
    message = str(err.value)
    assert "backend='fused'" in message and "backend='auto'" in message
    assert "backend='chunked' or backend='reference'" in message and "dropout" in message


# ----------------------------------------------------------------- a gradient penalty


def penalty_grads(backend, dtype, p=0.0):
    """A gradient penalty on a small GQA MultiHeadAttention: the norm of the loss's gradient in
    the parameters, taken with create_graph, then differentiated. Returns every parameter's
    gradient in float64; inputs and weights are the same for every dtype."""
    from attnkit import MultiHeadAttention

    torch.manual_seed(0)
    m = MultiHeadAttention(16, 4, num_kv_heads=2, backend=backend, dropout=p).double()
    m = m.to(dtype).train(p > 0)
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 5:] = False  # the second sequence is padded
    torch.manual_seed(2)  # the dropout seed
    y = m(x.to(dtype), mask=mask, causal=True)
    grads = torch.autograd.grad(y.square().mean(), list(m.parameters()), create_graph=True)
    torch.sqrt(sum(g.square().sum() for g in grads)).backward()
    return {name: w.grad.double() for name, w in m.named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("backend", ["chunked", "auto", "fused"])
def test_gradient_penalty_matches_reference(backend, dtype):
    want = penalty_grads("reference", torch.float64)
    got = penalty_grads(backend, dtype)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, atol=tol, rtol=tol, msg=name)


@pytest.mark.parametrize("backend", ["chunked", "auto"])
def test_gradient_penalty_with_dropout_matches_float64(backend):
    """With dropout, auto and chunked run the compiled kernel in float32; the truth is the
    PyTorch kernel in float64 with the same seed (the same dropped entries)."""
    want = penalty_grads("chunked", torch.float64, p=0.2)
    got = penalty_grads(backend, torch.float32, p=0.2)
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, atol=2e-5, rtol=2e-5, msg=name)
