"""Counter-based attention dropout for the chunked backend.

Shapes: B batch, H query heads, N queries, S keys; a block covers rows i0:i1 and keys j0:j1.

Why not ``F.dropout``: the chunked backward must see the forward's keep mask again without
storing the N×S mask, and torch's CPU ``bernoulli_`` is ~10× slower than drawing raw bits
(PERF-NOTES.md). Each (query block, key block) gets its own ``torch.Generator`` seeded from one
per-call seed and the block coordinates (the idea of Philox offsets in FlashAttention-2, Dao
2023, section 3.1, done with torch's own generator), so forward and backward regenerate the
same bits block by block.

Exact keep probability: one random byte ``u`` (uniform on 0..255, tested) per probability;
the entry is kept iff ``u < T`` with ``T = round(256 * (1 - p))``. So P(keep) = T / 256 exactly
(within 1/512 of 1 - p), and kept entries are scaled by 256 / T, so E[dropout(P)] = P exactly.
Example: p = 0.1 gives T = 230, keep probability 0.8984375, scale 1.1130435.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

_MASK64 = (1 << 64) - 1


def draw_seed() -> int:
    """One 63-bit seed from torch's default generator, so ``torch.manual_seed`` controls it."""
    return int(torch.empty((), dtype=torch.int64).random_().item())


def keep_threshold(p: float) -> tuple[int, float]:
    """Byte threshold T (keep iff byte < T) and the scale 256 / T applied to kept entries."""
    t = min(256, max(0, round(256.0 * (1.0 - p))))
    return t, (256.0 / t if t > 0 else 0.0)


def _mix(x: int) -> int:
    # splitmix64 finaliser (Steele et al. 2014): nearby block ids give unrelated seeds.
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


Alloc = Callable[[str, tuple[int, ...], torch.dtype], Tensor]


def _empty(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    return torch.empty(shape, dtype=dtype)


def block_keep(
    seed: int,
    qi: int,
    kj: int,
    shape: tuple[int, ...],
    t: int,
    dtype: torch.dtype,
    alloc: Alloc = _empty,
) -> Tensor | None:
    """0/1 keep mask of block (qi, kj) in ``dtype``; None when everything is kept (T = 256).

    ``alloc(name, shape, dtype)`` may hand out reused scratch buffers.
    """
    if t >= 256:
        return None
    gen = torch.Generator().manual_seed(_mix(_mix(seed ^ (qi << 32)) ^ kj) >> 1)
    n = 1
    for d in shape:
        n *= d
    # Full-range int64 words (random_(-2**63, None): all 8 bytes uniform; measured as cheap as
    # the default 63-bit random_() on torch 2.13), read as one contiguous uint8 run. Comparing a
    # contiguous uint8 tensor with a scalar straight into a float tensor is ~6x cheaper than the
    # same compare on a strided view (1 thread, 262k bytes: 0.05 ms vs 0.28 ms), and ~5x cheaper
    # than a bool mask times a float.
    m = (n + 7) // 8
    bits = alloc("bits", (m,), torch.int64).random_(-(2**63), None, generator=gen)
    uniform = bits.view(torch.uint8)[:n]  # (n,) uniform on 0..255
    keep = torch.lt(uniform, t, out=alloc("keep", (n,), dtype))  # (n,)
    return keep.view(shape)


def dropout_keep_mask(
    seed: int, shape: tuple[int, int, int, int], p: float, block_q: int, block_k: int
) -> Tensor:
    """Materialise the full (B, H, N, S) keep mask the chunked backend uses (tests only)."""
    b, h, n, s = shape
    t, _ = keep_threshold(p)
    full = torch.ones(shape, dtype=torch.bool)
    for qi, i0 in enumerate(range(0, n, block_q)):
        i1 = min(i0 + block_q, n)
        for kj, j0 in enumerate(range(0, s, block_k)):
            j1 = min(j0 + block_k, s)
            keep = block_keep(seed, qi, kj, (b, h, i1 - i0, j1 - j0), t, torch.float32)
            if keep is not None:
                full[:, :, i0:i1, j0:j1] = keep > 0
    return full
