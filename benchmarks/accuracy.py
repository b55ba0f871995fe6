"""Max abs error of every backend and dtype against a float64 reference.

    python benchmarks/accuracy.py            # prints a markdown table

Random q, k, v (B=2, H=8, Hkv=2, N=257, S=300, D=64), a random boolean mask and
causal alignment, forward outputs and (float32) gradients; the "naive" column is
plain matmul + softmax computed in the same dtype, the yardstick of the
half-precision rule (at most 2× its error).
"""

from __future__ import annotations

import torch

from attnkit import attention


def naive(q, k, v, mask, dtype):
    q, k, v = (t.to(dtype) for t in (q, k, v))
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], 1) for t in (k, v))
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v


def main() -> None:
    g = torch.Generator().manual_seed(0)
    b, h, hkv, n, s, d = 2, 8, 2, 257, 300, 64
    q = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, hkv, s, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, hkv, s, d, generator=g, dtype=torch.float64)
    mask = torch.rand(b, 1, n, s, generator=g) > 0.3
    mask &= torch.ones(n, s, dtype=torch.bool).tril(s - n)
    mask[..., 0] = True
    truth = naive(q, k, v, mask, torch.float64)
    print("| dtype | reference | fused | chunked | naive same dtype |")
    print("|---|---|---|---|---|")
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        row = []
        for backend in ("reference", "fused", "chunked"):
            out = attention(*(t.to(dtype) for t in (q, k, v)), mask=mask, backend=backend).out
            row.append(f"{(out.double() - truth).abs().max().item():.1e}")
        ref_naive = (naive(q, k, v, mask, dtype).double() - truth).abs().max().item()
        print(f"| {str(dtype).removeprefix('torch.')} | {' | '.join(row)} | {ref_naive:.1e} |")
    grads = {}
    for backend in ("reference", "fused", "chunked"):
        leaves = [t.float().requires_grad_() for t in (q, k, v)]
        attention(*leaves, mask=mask, backend=backend).out.square().sum().backward()
        grads[backend] = [t.grad.double() for t in leaves]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    attention(*leaves, mask=mask, backend="reference").out.square().sum().backward()
    for backend, gs in grads.items():
        err = max((g - t.grad).abs().max().item() for g, t in zip(gs, leaves, strict=True))
        print(f"float32 gradient max error, {backend}: {err:.1e}")


if __name__ == "__main__":
    main()
