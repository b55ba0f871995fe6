"""Counter-based attention dropout for the chunked backend.

Shapes: B batch, H query heads, N queries, S keys; a block covers rows i0:i1 and keys j0:j1.

Why not ``F.dropout``: the chunked backward must see the forward's keep mask again without
storing the N×S mask, and torch's CPU ``bernoulli_`` is ~10× slower than drawing raw bits
(PERF-NOTES.md). The bits are a counter-based hash of the entry's position (the idea of Philox
offsets in FlashAttention-2, Dao 2023, section 3.1, with splitmix64 as the hash): entry
(b, h, i, j) of a call reads the 32-bit half j % 2 (0 = low) of splitmix64(seed + (R · ceil(S / 2)
+ j // 2 + 1) · golden), R = (b · H + h) · N + i, with one fresh seed per call. Forward and
backward regenerate the same bits for any blocking, and the compiled kernel
(``_native/attention_cpu.cpp``) and the PyTorch kernel here drop exactly the same entries.

Exact keep probability: one random 32-bit word ``u`` (uniform on 0..2^32 - 1, tested) per
probability; the entry is kept iff ``u < T`` with ``T = round(2^32 (1 - p))`` clamped to
[1, 2^32 - 1], so that any p in (0, 1) drops something sometimes and keeps something sometimes.
P(keep) = T / 2^32 exactly: within 2^-33 of 1 - p (2^-32 at the clamped ends, p < 2^-33 or
p > 1 - 2^-33). Kept entries are scaled by 2^32 / T, so E[dropout(P)] = P exactly.
Example: p = 0.001 gives T = 4290672329, keep probability 0.99899999990 (one random byte,
as before, kept everything: round(256 · 0.999) = 256).
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


NO_DROPOUT = 1 << 32  # the threshold that keeps every entry (p = 0)


def keep_threshold(p: float) -> tuple[int, float]:
    """Word threshold T (keep iff 32-bit word < T) and the scale 2^32 / T of kept entries.

    p = 0 gives (2^32, 1.0) (keep all), p = 1 gives (0, 0.0); any p in (0, 1) gives
    1 <= T <= 2^32 - 1.
    """
    if p <= 0.0:
        return NO_DROPOUT, 1.0
    if p >= 1.0:
        return 0, 0.0
    t = min(NO_DROPOUT - 1, max(1, round(NO_DROPOUT * (1.0 - p))))
    return t, NO_DROPOUT / t


Alloc = Callable[[str, tuple[int, ...], torch.dtype], Tensor]


def _empty(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    return torch.empty(shape, dtype=dtype)


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MUL1 = _signed(0xBF58476D1CE4E5B9)
_MUL2 = _signed(0x94D049BB133111EB)
_SIGN = -(1 << 31)  # the int32 sign bit


def _lsr(z: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 words (torch's >> is arithmetic on signed integers)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def row_ids(b: int, h: int, n: int, i0: int, i1: int, device=None) -> Tensor:
    """Row numbers (b * H + h) * N + i of rows i0:i1 of every head, in (B·H, nq) order."""
    heads = torch.arange(b * h, device=device).unsqueeze(1) * n  # (B·H, 1)
    return (heads + torch.arange(i0, i1, device=device)).reshape(-1)


def keep_words(seed: int, rows: Tensor, j0: int, nk: int, s: int) -> Tensor:
    """Uniform 32-bit words of keys j0:j0+nk of the given rows, as (len(rows), nk) int32.

    The int32 holds the word's bits (u >= 2^31 reads negative; `as_unsigned` gives u). Word w
    of row R is splitmix64's output for the counter R · ceil(S / 2) + w (int64 products wrap
    like the kernel's uint64 ones), and key j reads its 32-bit half j % 2 (0 = low).
    """
    wpr = (s + 1) // 2
    w0, nw = j0 // 2, (j0 % 2 + nk + 1) // 2
    words = torch.arange(w0 + 1, w0 + nw + 1, device=rows.device)  # (nw,)
    z = (rows.unsqueeze(1) * wpr + words) * _GOLDEN + seed
    z = (z ^ _lsr(z, 30)) * _MUL1  # (R, nw)
    z = (z ^ _lsr(z, 27)) * _MUL2
    z = z ^ _lsr(z, 31)
    return z.view(torch.int32)[:, j0 % 2 : j0 % 2 + nk]  # (R, 2·nw) little-endian halves


def as_unsigned(words: Tensor) -> Tensor:
    """int32 words -> their unsigned values 0..2^32 - 1 as int64."""
    return words.long() & 0xFFFFFFFF


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
    """0/1 keep mask (len(rows), nk) in ``dtype`` of keys j0:j0+nk; keep iff word < T.

    ``alloc(name, shape, dtype)`` may hand out reused scratch buffers.
    """
    words = keep_words(seed, rows, j0, nk, s)
    # unsigned u < T on signed int32 bits: flipping the sign bit maps u to u - 2^31 in order
    shifted = torch.bitwise_xor(words, _SIGN, out=alloc("words", tuple(words.shape), torch.int32))
    return torch.lt(shifted, t - (1 << 31), out=alloc("keep", tuple(words.shape), dtype))


def dropout_keep_mask(seed: int, shape: tuple[int, int, int, int], p: float) -> Tensor:
    """The full (B, H, N, S) boolean keep mask of a call with this seed (tests only)."""
    b, h, n, s = shape
    t, _ = keep_threshold(p)
    rows = row_ids(b, h, n, 0, n)
    return (as_unsigned(keep_words(seed, rows, 0, s, s)) < t).view(shape)
