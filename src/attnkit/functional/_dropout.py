"""Counter-based attention dropout for the chunked backend.

Shapes: B batch, H query heads, N queries, S keys; a block covers rows i0:i1 and keys j0:j1.

Why not ``F.dropout``: the chunked backward must see the forward's keep mask again without
storing the N×S mask, and torch's CPU ``bernoulli_`` is ~10× slower than drawing raw bits
(PERF-NOTES.md). The bits are a counter-based hash of the entry's position (the idea of Philox
offsets in FlashAttention-2, Dao 2023, section 3.1, with splitmix64 as the hash): entry
(b, h, i, j) of a call reads byte j % 8 of splitmix64(seed + (R · ceil(S / 8) + j // 8 + 1) ·
golden), R = (b · H + h) · N + i, with one fresh seed per call. Forward and backward regenerate
the same bits for any blocking, and the compiled kernel (``_native/attention_cpu.cpp``) and the
PyTorch kernel here drop exactly the same entries.

Exact keep probability: one random byte ``u`` (uniform on 0..255, tested) per probability;
the entry is kept iff ``u < T`` with ``T = round(256 * (1 - p))``. So P(keep) = T / 256 exactly
(within 1/512 of 1 - p), and kept entries are scaled by 256 / T, so E[dropout(P)] = P exactly.
Example: p = 0.1 gives T = 230, keep probability 0.8984375, scale 1.1130435.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def draw_seed(device: torch.device | str | None = None) -> Tensor:
    """A 62-bit seed, a 0-d int64 tensor on `device`, from torch's generator for that device
    (``torch.manual_seed`` controls it). A tensor, not an int: torch.compile and export trace
    the draw instead of stopping at ``.item()``, and a CUDA seed never syncs with the host."""
    return torch.randint(0, 1 << 62, (), dtype=torch.int64, device=device)


def keep_threshold(p: float) -> tuple[int, float]:
    """Byte threshold T (keep iff byte < T) and the scale 256 / T applied to kept entries."""
    t = min(256, max(0, round(256.0 * (1.0 - p))))
    return t, (256.0 / t if t > 0 else 0.0)


Alloc = Callable[[str, tuple[int, ...], torch.dtype], Tensor]


def _empty(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    return torch.empty(shape, dtype=dtype)


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MUL1 = _signed(0xBF58476D1CE4E5B9)
_MUL2 = _signed(0x94D049BB133111EB)


def _lsr(z: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 words (torch's >> is arithmetic on signed integers)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def row_ids(b: int, h: int, n: int, i0: int, i1: int, device=None) -> Tensor:
    """Row numbers (b * H + h) * N + i of rows i0:i1 of every head, in (B·H, nq) order."""
    heads = torch.arange(b * h, device=device).unsqueeze(1) * n  # (B·H, 1)
    return (heads + torch.arange(i0, i1, device=device)).reshape(-1)


def keep_bytes(seed: int, rows: Tensor, j0: int, nk: int, s: int) -> Tensor:
    """Uniform bytes of keys j0:j0+nk of the given rows: (len(rows), nk) uint8.

    Word w of row R is splitmix64's output for the counter R · ceil(S / 8) + w (int64 products
    wrap like the kernel's uint64 ones), and key j reads byte j % 8 of word j // 8.
    """
    wpr = (s + 7) // 8
    w0, nw = j0 // 8, (j0 % 8 + nk + 7) // 8
    words = torch.arange(w0 + 1, w0 + nw + 1, device=rows.device)  # (nw,)
    z = (rows.unsqueeze(1) * wpr + words) * _GOLDEN + seed
    z = (z ^ _lsr(z, 30)) * _MUL1  # (R, nw)
    z = (z ^ _lsr(z, 27)) * _MUL2
    z = z ^ _lsr(z, 31)
    return z.view(torch.uint8)[:, j0 % 8 : j0 % 8 + nk]  # little-endian bytes, as the kernel


def block_keep(
    seed: int,
    rows: Tensor,
    j0: int,
    nk: int,
    s: int,
    t: int,
    dtype: torch.dtype,
    alloc: Alloc = _empty,
) -> Tensor:
    """0/1 keep mask (len(rows), nk) in ``dtype`` of keys j0:j0+nk; keep iff byte < T.

    ``alloc(name, shape, dtype)`` may hand out reused scratch buffers.
    """
    bytes_ = keep_bytes(seed, rows, j0, nk, s)
    return torch.lt(bytes_, t, out=alloc("keep", tuple(bytes_.shape), dtype))


def dropout_keep_mask(seed: int, shape: tuple[int, int, int, int], p: float) -> Tensor:
    """The full (B, H, N, S) boolean keep mask of a call with this seed (tests only)."""
    b, h, n, s = shape
    t, _ = keep_threshold(p)
    rows = row_ids(b, h, n, 0, n)
    return (keep_bytes(seed, rows, 0, s, s) < t).view(shape)
