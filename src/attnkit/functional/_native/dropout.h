// Dropout bits of the kernel: a counter-based hash of the position, not of the blocking, so the
// backward regenerates the forward's bits and nothing N x S is stored. Row
// r = (b * H + h) * N + i has the 64-bit key K_r = splitmix64(seed + (r + 1) * golden), and entry
// (b, h, i, j) reads the 32-bit word mix32(j + lo(K_r), hi(K_r)) (Wellons' lowbias32 with the
// key's high half xored in between its two rounds; see keep_word). It is kept iff that word is
// below T = round(2^32 (1 - p)) clamped to [1, 2^32 - 1]: P(keep) = T / 2^32, within 2^-33 of
// 1 - p. One 32-bit hash per entry costs ~0.2 ns here against ~0.6 ns for half a splitmix64
// (AVX2 has no 64-bit vector multiply). attnkit/functional/_dropout.py computes the same words
// with torch integer ops (the PyTorch chunked path and the tests use it).
//
// Legend: mix64 splitmix64's output function; RowKey / row_key a row's key K_r as two 32-bit
// halves; keep_word the word of key j (keep_words in simd.h: the same, a vector of keys at a
// time); Args::keep_t is T, kNoDropout (2^32) meaning no dropout.

#pragma once

#include <cstdint>

#include "args.h"

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

inline uint64_t mix64(uint64_t z) {  // splitmix64's output function (Steele et al. 2014)
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

constexpr int64_t kNoDropout = int64_t{1} << 32;  // keep_t meaning "keep everything"

// The dropout key of one row (the hash's two 32-bit halves), computed once per row and block.
struct RowKey {
    uint32_t lo, hi;
};

inline RowKey row_key(const Args& a, int64_t row) {
    const uint64_t z = mix64(a.seed + static_cast<uint64_t>(row + 1) * kGolden);
    return {static_cast<uint32_t>(z), static_cast<uint32_t>(z >> 32)};
}

// The 32-bit word of key j in a row: a bijection of j for each row key, so every word of a row
// is distinct; the multiplies are 32-bit and vectorise on AVX2 (8 lanes) and AVX-512 (16).
inline uint32_t keep_word(RowKey key, int64_t j) {
    uint32_t x = static_cast<uint32_t>(j) + key.lo;
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x ^= key.hi;
    x *= 0x846ca68bU;
    return x ^ (x >> 16);
}

}  // namespace
