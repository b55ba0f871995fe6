"""The modules that built (N, S) biases give the same numbers as score functions, in O(N) memory:
`AlibiBias.score_mod`, `RelativePositionBias.score_mod` (T5), Swin's `WindowAttention`."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attnkit
from attnkit import AlibiBias, MultiHeadAttention, RelativePositionBias
from attnkit.functional import native
from attnkit.vision import WindowAttention

H = 4


@pytest.mark.parametrize("backend", ["reference", "chunked", "fused"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_alibi_module_score_mod_equals_its_bias(backend, symmetric):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, H).double()
    alibi = AlibiBias(H, symmetric=symmetric, dtype=torch.float64)
    x, ctx = torch.randn(2, 7, 32, dtype=torch.float64), torch.randn(2, 19, 32, dtype=torch.float64)
    with attnkit.use_backend(backend):
        got = mha(x, ctx, causal=not symmetric, score_mod=alibi.score_mod(7, 19))
        want = mha(x, ctx, causal=not symmetric, bias=alibi(7, 19))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_module_score_mod_equals_its_bias_with_the_tables_gradient(dtype, bidirectional):
    """float32 runs the compiled kernel (the table's gradient accumulated in it), float64 the
    PyTorch kernel; both against the dense bias on the reference path."""
    torch.manual_seed(1)
    mha = MultiHeadAttention(32, H).to(dtype)
    rel = RelativePositionBias(H, num_buckets=16, max_distance=40, bidirectional=bidirectional)
    rel = rel.to(dtype)
    x = torch.randn(2, 150, 32, dtype=dtype)
    causal = not bidirectional
    got = mha(x, causal=causal, score_mod=rel.score_mod(150))
    (g_got,) = torch.autograd.grad(got.square().sum(), rel.table.weight)
    with attnkit.use_backend("reference"):
        want = mha(x, causal=causal, bias=rel(150))
    (g_want,) = torch.autograd.grad(want.square().sum(), rel.table.weight)
    f64 = dtype == torch.float64  # float32: sums over ~1000 entries per table row
    tol = {"atol": 1e-12, "rtol": 1e-10} if f64 else {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(g_got, g_want, **tol)


def test_window_attention_adds_its_table_as_before():
    """Swin's window attention reads its (2M-1)² table per score: output and the table's
    gradient equal the dense (Hh, M², M²) bias it used to add (checkpoints: tests/convert)."""
    torch.manual_seed(2)
    m = WindowAttention(24, 3, 5, shift=2)
    x = torch.randn(2, 13, 11, 24)
    got = m(x)
    (g_got,) = torch.autograd.grad(got.sum(), m.bias_table)
    # the old formula: the dense bias from relative_bias() as `bias=`
    orig = m.attn.attend.forward

    def dense(q, k, v, *, mask=None, bias=None, causal=False, score_mod=None):
        return orig(q, k, v, mask=mask, bias=m.relative_bias().unsqueeze(0), causal=causal)

    m.attn.attend.forward = dense
    want = m(x)
    (g_want,) = torch.autograd.grad(want.sum(), m.bias_table)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(g_got, g_want, atol=2e-5, rtol=1e-4)


class _Largest(TorchDispatchMode):
    """The largest tensor any operation produces (numel), forward and backward."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.skipif(not native.available(), reason="compiled kernel unavailable")
@pytest.mark.parametrize("kind", ["alibi", "t5", "user"])
def test_no_tensor_grows_like_n_times_s(kind):
    """ALiBi and T5 at N = S = 4096 (the compiled kernel), and a user's function at 2048 (the
    PyTorch kernel, checkpointed query blocks), forward and backward: no operation produces a
    tensor of N·S/16 elements or more (a dense bias would be N·S·H), and the dense-bias call
    does, so the check can fail."""
    n = 2048 if kind == "user" else 4096
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 16, requires_grad=True) for _ in range(3))
    if kind == "alibi":
        fn = AlibiBias(2).score_mod(n)
    elif kind == "t5":
        fn = RelativePositionBias(2).score_mod(n)
    else:
        table = torch.randn(2, 64, requires_grad=True)
        fn = lambda s, b, h, qi, ki: s + table[h, (ki - qi).clamp(-32, 31) + 32]  # noqa: E731
    with _Largest() as seen:
        r = attnkit.attention(q, k, v, causal=True, score_mod=fn)
        r.out.sum().backward()
    assert seen.largest < n * n // 16, seen.largest
    if kind == "alibi":  # the control: the dense bias route does build (H, N, S)
        with _Largest() as dense, torch.no_grad():
            attnkit.attention(q, k, v, causal=True, bias=AlibiBias(2)(n))
        assert dense.largest >= n * n, dense.largest
