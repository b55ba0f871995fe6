"""Issue 28: `chunked` with a value width Dv = 0 printed "Intel oneMKL ERROR: Parameter 8 was
incorrect" once per matrix product (the compiled kernel's BLAS refuses a zero leading
dimension). Every backend must give the empty (B, H, N, 0) result silently.

The BLAS library prints the message with C stdio (on stdout here, not stderr), past Python's
sys.stdout and sys.stderr, so the calls run in a child process whose two streams are read at
the file-descriptor level."""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = r"""
import torch
from attnkit import attention

torch.manual_seed(0)
B, H, HKV, N, S, D = 2, 4, 2, 6, 7, 8
for dtype in (torch.float32, torch.bfloat16):
    q = torch.randn(B, H, N, D, dtype=dtype)
    k = torch.randn(B, HKV, S, D, dtype=dtype)
    v = torch.randn(B, HKV, S, 0, dtype=dtype)
    mask = torch.rand(B, 1, N, S) > 0.3
    want = attention(q.double(), k.double(), v.double(), mask=mask, causal=True,
                     backend="reference")
    for backend in ("reference", "fused", "chunked", "auto"):
        for dropout in (0.0, 0.25):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            res = attention(*leaves, mask=mask, causal=True, dropout_p=dropout, training=True,
                            backend=backend)
            assert res.out.shape == (B, H, N, 0) and res.out.dtype == dtype, (backend, res.out)
            if res.lse is not None:
                torch.testing.assert_close(res.lse.double(), want.lse, atol=2e-2, rtol=0)
            grads = torch.autograd.grad(res.out.sum(), leaves, allow_unused=True)
            for g, t in zip(grads, leaves):
                assert g is None or (g.shape == t.shape and not g.any()), (backend, g)
print("done")
"""


def test_value_width_zero_is_silent_and_empty_on_every_backend():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    both = done.stdout + done.stderr
    assert "MKL" not in both and "ERROR" not in both, both
    assert done.stdout.strip() == "done", both
