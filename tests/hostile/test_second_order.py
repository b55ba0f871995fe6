"""Issue 28, "silently wrong": a gradient penalty through the compiled kernel.

``torch.autograd.grad(loss, params, create_graph=True)``, then backward of the gradient's norm,
gave ‖W.grad‖ 117.6 on backend="chunked" where "reference" and a float64 hand computation gave
290.24: the compiled kernel's backward was opaque to autograd, so the second-order term through
attention was silently dropped. "auto" took that path whenever dropout was on, and "fused"
(SDPA) raised torch's "derivative ... is not implemented". Every backend must now give the
float64 hand computation's gradient.

The issue did not record its model; this is the same computation on a small one (before the
fix, float32: chunked 0.0595 where the hand computation gives 0.2446; float64 chunked and every
fused/auto call without dropout raised).
"""

from __future__ import annotations

import pytest
import torch

from attnkit import MultiHeadAttention
from attnkit.functional._dropout import draw_seed, dropout_keep_mask, keep_threshold
from tests.naive import naive_attention

B, N, C, HEADS = 2, 9, 32, 4


def w_grad(backend, dtype, p=0.0, by_hand=False):
    """‖W.grad‖ (W: the output projection) of the gradient penalty ‖∂loss/∂params‖."""
    torch.manual_seed(0)
    m = MultiHeadAttention(C, HEADS, backend=backend, dropout=p).double().to(dtype).train(p > 0)
    x = torch.randn(B, N, C, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.manual_seed(2)  # the dropout seed that attention() draws
    if by_hand:  # plain float64 matmul + softmax, the kernel's dropout bits
        q, k, v = m.heads_qkv(x)
        keep = None
        if p:
            bits = dropout_keep_mask(int(draw_seed()), (B, HEADS, N, N), p)
            keep = bits.double() * keep_threshold(p)[1]
        out, _ = naive_attention(q, k, v, causal=True, keep=keep)
        y = m.proj(m.merge_heads(out))
    else:
        y = m(x.to(dtype), causal=True)
    params = list(m.parameters())
    grads = torch.autograd.grad(y.square().mean(), params, create_graph=True)
    torch.sqrt(sum(g.square().sum() for g in grads)).backward()
    return m.proj.weight.grad.norm().item()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("backend", ["reference", "chunked", "auto", "fused"])
def test_gradient_penalty_equals_the_hand_computation(backend, dtype):
    truth = w_grad("reference", torch.float64, by_hand=True)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert w_grad(backend, dtype) == pytest.approx(truth, rel=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("backend", ["chunked", "auto"])
def test_gradient_penalty_with_dropout_equals_the_hand_computation(backend, dtype):
    """auto takes the compiled kernel whenever dropout is on (float32 input)."""
    truth = w_grad("reference", torch.float64, p=0.1, by_hand=True)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert w_grad(backend, dtype, p=0.1) == pytest.approx(truth, rel=tol)
