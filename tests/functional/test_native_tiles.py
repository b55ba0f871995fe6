"""The compiled backward's register tiles (_native/gemm_acc.h) and each thread's transposed
keys (_native/transposed.h) pinned to a float64 truth where their edge cases are: key blocks
that start off the 256-key grid on which the transposed caches are filled (a window's blocks
start where the window does), head widths that leave a partial vector, query heads that share
a kv head (and its cache), batch rows and kv heads (a cache each), interleaved sequences.
The forward's block path reads the same key caches for S and adds P v on the same tiles
(_native/forward.h, at 1 thread: N * G >= 1024 * threads), so `out` here checks it too.

Legend: B batch, H heads, Hkv kv heads, N = S tokens, D head width, Dv value width.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from tests.functional.test_native import needs_kernel


def _truth(q, k, v, allowed, scale):
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    return s.softmax(-1) @ v


def _grads(fn, inputs, cot):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return [out, *torch.autograd.grad(out, leaves, cot.to(out.dtype))]


def _check(mask, b, h, hkv, n, d, dv, seed):
    """attnkit's kernel (float32) vs the float64 truth with mask.dense(): out and gradients
    within twice a float32 matmul + softmax's error (+ a floor), test_native's rule."""
    allowed = mask.dense()
    g = torch.Generator().manual_seed(seed)
    q64 = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    k64 = torch.randn(b, hkv, n, d, generator=g, dtype=torch.float64)
    v64 = torch.randn(b, hkv, n, dv, generator=g, dtype=torch.float64)
    cot = torch.randn(b, h, n, dv, generator=g, dtype=torch.float64)
    scale = d**-0.5
    rep = lambda t: t.repeat_interleave(h // hkv, dim=1)  # noqa: E731
    ref = lambda q, k, v: _truth(q, rep(k), rep(v), allowed, scale)  # noqa: E731
    truth = _grads(ref, (q64, k64, v64), cot)
    plain = _grads(ref, [t.float() for t in (q64, k64, v64)], cot)  # float32, same formula
    ours = _grads(
        lambda q, k, v: attnkit.attention(q, k, v, mask=mask, backend="chunked").out,
        [t.float() for t in (q64, k64, v64)],
        cot,
    )
    for name, got, want, base in zip(["out", "dq", "dk", "dv"], ours, truth, plain, strict=True):
        err = (got.double() - want).abs().max().item()
        naive_err = (base.double() - want).abs().max().item()
        assert err <= 2 * naive_err + 2e-6, f"{name}: error {err:.2e}, float32 {naive_err:.2e}"


@needs_kernel
@pytest.mark.parametrize(("d", "dv"), [(48, 40), (64, 64), (7, 20), (80, 96)])
def test_windows_off_the_key_grid_match_float64(d, dv):
    # query blocks of 128 see keys [i0 - 560, i0 + 688): off the 256 grid, and more than the
    # 1024 keys from which the caches are used (transposed.h, kCacheFromKeys)
    _check(masks.window(1400, 560), b=2, h=4, hkv=2, n=1400, d=d, dv=dv, seed=d)


@needs_kernel
def test_interleaved_sequences_match_float64():
    # strided(2): two interleaved sequences of 1100 positions (keys 2 rows apart in the cache's
    # source, a cache each), every query block seeing all 1100 keys of its sequence
    _check(masks.strided(2200, 2), b=1, h=2, hkv=1, n=2200, d=32, dv=48, seed=1)
