"""Counter-based attention dropout for the chunked backend.

Shapes: B batch, H query heads, N queries, S keys; a block covers rows i0:i1 and keys j0:j1.

Why not ``F.dropout``: the chunked backward must see the forward's keep mask again without
storing the N×S mask, and torch's CPU ``bernoulli_`` is ~10× slower than drawing raw bits
(PERF-NOTES.md). The bits are a counter-based hash of the entry's position (the idea of Philox
offsets in FlashAttention-2, Dao 2023, section 3.1), with one fresh seed per call:

* row R = (b · H + h) · N + i has the 64-bit key K_R = splitmix64(seed + (R + 1) · golden);
* entry (b, h, i, j) reads the 32-bit word mix32(j + lo(K_R), hi(K_R)), where mix32 is
  Wellons' lowbias32 integer hash with hi(K_R) xored in between its two multiply rounds.

For each row, j -> word is a bijection, so a row never repeats a word; rows differ by their
64-bit keys. Forward and backward regenerate the same bits for any blocking, and the compiled
kernel (``_native/dropout.h``) and the PyTorch kernel here drop exactly the same entries
(tested). One 32-bit hash per entry: its multiplies are 32-bit, so they vectorise on AVX2, where
half a splitmix64 per entry cost 3× as much (0.64 vs 0.21 ns per entry, AMD EPYC).

Exact keep probability: one random 32-bit word ``u`` (uniform on 0..2^32 - 1, tested) per
probability; the entry is kept iff ``u < T`` with ``T = round(2^32 (1 - p))`` clamped to
[1, 2^32 - 1], so that any p in (0, 1) drops something sometimes and keeps something sometimes.
P(keep) = T / 2^32 exactly: within 2^-33 of 1 - p (2^-32 at the clamped ends, p < 2^-33 or
p > 1 - 2^-33). Kept entries are scaled by 2^32 / T, so E[dropout(P)] = P exactly.
Example: p = 0.001 gives T = 4290672329, keep probability 0.99899999990 (one random byte
per weight, as attnkit drew before, kept everything: round(256 · 0.999) = 256).
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


def _lsr(z: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 words (torch's >> is arithmetic on signed integers)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def row_ids(b: int, h: int, n: int, i0: int, i1: int, device=None) -> Tensor:
    """Row numbers (b * H + h) * N + i of rows i0:i1 of every head, in (B·H, nq) order."""
    heads = torch.arange(b * h, device=device).unsqueeze(1) * n  # (B·H, 1)
    return (heads + torch.arange(i0, i1, device=device)).reshape(-1)


_M32 = 0xFFFFFFFF
_LOWBIAS1 = 0x7FEB352D  # lowbias32's multipliers (C. Wellons, "hash prospector")
_LOWBIAS2 = 0x846CA68B


def row_keys(seed: int | Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """The dropout keys of the given rows: low and high 32-bit halves of
    splitmix64(seed + (R + 1) · golden), each (len(rows), 1) int64 in 0..2^32 - 1."""
    z = (rows + 1) * _GOLDEN + seed  # int64 products wrap like the kernel's uint64 ones
    z = (z ^ _lsr(z, 30)) * _MUL1
    z = (z ^ _lsr(z, 27)) * _MUL2
    z = z ^ _lsr(z, 31)
    return (z & _M32).unsqueeze(1), _lsr(z, 32).unsqueeze(1)


def keep_words(seed: int | Tensor, rows: Tensor, j0: int, nk: int) -> Tensor:
    """Uniform 32-bit words of keys j0:j0+nk of the given rows, (len(rows), nk) int64 in
    0..2^32 - 1: mix32(j + lo(K_R), hi(K_R)), the kernel's ``keep_word``.

    Products of two values below 2^32 wrap in int64; their low 32 bits (kept by the mask)
    are exact, as in the kernel's uint32 arithmetic.
    """
    lo, hi = row_keys(seed, rows)
    x = (torch.arange(j0, j0 + nk, device=rows.device) + lo) & _M32  # (R, nk)
    x ^= x >> 16  # x >= 0 here: >> is the logical shift
    x = (x * _LOWBIAS1) & _M32
    x ^= x >> 15
    x ^= hi
    x = (x * _LOWBIAS2) & _M32
    return x ^ (x >> 16)


def as_unsigned(words: Tensor) -> Tensor:
    """Words as unsigned values 0..2^32 - 1 in int64 (the kernel hands out int32 bits)."""
    return words.long() & _M32


def block_keep(
    seed: int | Tensor,
    rows: Tensor,
    j0: int,
    nk: int,
    t: int,
    dtype: torch.dtype,
    alloc: Alloc = _empty,
) -> Tensor:
    """0/1 keep mask (len(rows), nk) in ``dtype`` of keys j0:j0+nk; keep iff word < T.

    ``alloc(name, shape, dtype)`` may hand out reused scratch buffers.
    """
    words = keep_words(seed, rows, j0, nk)
    return torch.lt(words, t, out=alloc("keep", tuple(words.shape), dtype))


def dropout_keep_mask(seed: int, shape: tuple[int, int, int, int], p: float) -> Tensor:
    """The full (B, H, N, S) boolean keep mask of a call with this seed (tests only)."""
    b, h, n, s = shape
    t, _ = keep_threshold(p)
    rows = row_ids(b, h, n, 0, n)
    return (keep_words(seed, rows, 0, s) < t).view(shape)
