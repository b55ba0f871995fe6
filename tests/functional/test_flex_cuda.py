"""The FlexAttention route on a CUDA GPU: `auto` sends structured masks and built-in score
functions to torch's compiled FlexAttention, and the results (forward, lse, gradients) equal
the chunked kernel's float64 truth on the CPU. Skipped without CUDA (`pytest -ra` says so); the
CPU tests of the route are in test_flex_route.py."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit import score_mods as sm
from attnkit.functional import _flex_backend

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here: the FlexAttention route did not run",
)

TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 3e-2}


def _case(n=384):
    ids = masks.document_ids([150, 100, n - 250])
    return {
        "window": (masks.window(n, 64, causal=True), None),
        "documents+softcap": (masks.document(ids, causal=True), sm.softcap(5.0)),
        "predicate+alibi": (
            masks.from_function(lambda b, h, q, kv: (q - kv) % 3 == 0, n) & masks.prefix(n, 40),
            sm.alibi(torch.linspace(0.05, 0.5, 4)),
        ),
    }


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("name", list(_case()))
def test_auto_routes_to_flex_and_equals_the_truth(name, dtype, monkeypatch):
    mask, mod = _case()[name]
    calls = []
    run = _flex_backend.run
    monkeypatch.setattr(_flex_backend, "run", lambda *a: calls.append(1) or run(*a))
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 4, 384, 64), (2, 2, 384, 64), (2, 2, 384, 64)]  # q, k, v: GQA
    cpu = [torch.randn(shape, generator=g, dtype=torch.float64) for shape in shapes]
    dev = [t.to("cuda", dtype).requires_grad_() for t in cpu]
    cpu = [t.requires_grad_() for t in cpu]
    cuda_mod = None if mod is None else _to_cuda(mod)
    got = attnkit.attention(*dev, mask=mask.to("cuda"), score_mod=cuda_mod)
    want = attnkit.attention(*cpu, mask=mask, score_mod=mod, backend="chunked")
    assert calls, "auto did not take the FlexAttention route"
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.out.double().cpu(), want.out.detach(), atol=tol, rtol=tol)
    torch.testing.assert_close(got.lse.double().cpu(), want.lse.detach(), atol=tol, rtol=tol)
    dout = torch.randn(want.out.shape, generator=g, dtype=torch.float64)
    g_dev = torch.autograd.grad(got.out, dev, dout.to("cuda", dtype))
    g_cpu = torch.autograd.grad(want.out, cpu, dout)
    for a, b in zip(g_dev, g_cpu, strict=True):
        torch.testing.assert_close(a.double().cpu(), b, atol=10 * tol, rtol=10 * tol)


def _to_cuda(mod):
    """The same built-in with its tensors on the GPU."""
    if isinstance(mod, type(sm.alibi(torch.ones(1)))):
        return sm.alibi(mod.slopes.to("cuda"))
    return mod


def test_flex_attention_drop_in_equals_torch_flex_on_cuda(monkeypatch):
    """The drop-in hands the user's BlockMask and score_mod to torch's FlexAttention."""
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as torch_flex

    from attnkit.nn.attention.flex_attention import flex_attention

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def relative(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx) / 64

    calls = []
    run = _flex_backend.run
    monkeypatch.setattr(_flex_backend, "run", lambda *a: calls.append(1) or run(*a))
    bm = create_block_mask(causal, None, None, 256, 256, device="cuda")
    q, k, v = (torch.randn(1, 4, 256, 64, device="cuda") for _ in range(3))
    want = torch.compile(torch_flex)(q, k, v, relative, block_mask=bm)
    got = flex_attention(q, k, v, relative, block_mask=bm)
    assert calls, "the drop-in did not take the FlexAttention route"
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
