// The backward's S = (scale q) k^T and dP~ = dO' v^T as gemm_acc.h's register tiles, which
// read B's rows contiguously: each thread keeps its sequence's keys and values transposed
// (Scratch::kt, vt: row d holds the d-th floats of every key), filled bk keys at a time on
// first use and read by every later query block (and the G query heads sharing them). A key
// block anywhere (a window's, starting where the window does) is one column range of a cache.
//
// Why: MKL's sgemm_ packs the key block and the query block on every call and zeroes S first
// (mscale). Measured alone (128 x 256 blocks over 16-64 key blocks, 1 thread, AMD EPYC Zen 4,
// AVX-512, best of 9): sgemm_ 88-98 GFLOP/s, the tiles over transposed keys 97-103 (with a
// zero fill, which the kernel does not need); transposing each key block for each query block
// instead: 67-73.
//
// Legend: transposed_ld a cache's row length; transposable whether a sequence's keys of `width`
// floats fit one; transpose_keys the transposition (simd.h's transpose8); make_ready fills
// what a key block needs; transposing whether a query block uses the caches; times_keys
// C = A X[j0 .. j0 + nk)^T. The offset path's padded caches (offset_path.h): kOffsetPad their
// zero columns, offset_ready a sequence's whole (offset_ld its row length, offset_cacheable
// whether it fits), offset_window a sliding one (kOffsetWindow keys at least).

#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "args.h"
#include "blas.h"
#include "gemm_acc.h"
#include "masks.h"
#include "scratch.h"
#include "simd.h"

namespace {

// Floats one cache may hold (8 MiB: up to S = 32752 keys of 64 floats); longer sequences
// keep sgemm_.
constexpr int64_t kMaxTransposed = int64_t{1} << 21;

// The row length of a cache: S rounded up to whole vectors, plus one vector so that rows are
// not a power of two apart (S = 16384: 64 rows 64 KiB apart share L1 sets).
inline int64_t transposed_ld(const Args& a) { return ceil_div(a.S, kLanes) * kLanes + kLanes; }

inline bool transposable(const Args& a, int64_t width) {
    return kGemmTiles && transposed_ld(a) * width <= kMaxTransposed;
}

// dst (width x n, rows ldd apart) = the n keys at x (rows ldx apart, `width` floats each)
// transposed, in 8 x 8 squares in registers. Element by element it took ~1 ns a float (a
// 256 x 64 block ~15 us, a third of a product's time), and with one AVX-512 gather per 16
// floats it still took 5% of a window-256 backward (perf, N=16384), whose key blocks serve
// ~3 query blocks each.
inline void transpose_keys(const float* x, int64_t ldx, int64_t n, int64_t width, float* dst,
                           int64_t ldd) {
    int64_t j = 0;
#if defined(__AVX__)
    for (; j + 8 <= n; j += 8) {
        int64_t d = 0;
        for (; d + 8 <= width; d += 8) {
            attnkit_simd::transpose8(x + j * ldx + d, ldx, dst + d * ldd + j, ldd);
        }
        for (; d < width; ++d) {
            for (int64_t u = 0; u < 8; ++u) dst[d * ldd + j + u] = x[(j + u) * ldx + d];
        }
    }
#endif
    for (; j < n; ++j) {
        for (int64_t d = 0; d < width; ++d) dst[d * ldd + j] = x[j * ldx + d];
    }
}

// Makes keys [j0, j0 + nk) of x (rows ldx apart, `width` floats each) ready in the cache c:
// row d of c.t (transposed_ld(a) + 2 * c.pad floats) holds the d-th floats of the sequence's
// keys from column c.pad on, filled bk keys at a time; the c.pad columns either side and
// those past S are zero.
void make_ready(const Args& a, Transposed& c, const float* x, int64_t ldx, int64_t width,
                int64_t j0, int64_t nk) {
    const int64_t ld = transposed_ld(a) + 2 * c.pad;
    if (c.src != x) {  // another sequence: nothing cached
        c.src = x;
        c.t.resize(width * ld);
        c.ready.assign(ceil_div(a.S, a.bk), 0);
        for (int64_t d = 0; c.pad > 0 && d < width; ++d) {
            float* row = c.t.data() + d * ld;
            std::fill(row, row + c.pad, 0.0f);
            std::fill(row + c.pad + a.S, row + ld, 0.0f);
        }
    }
    for (int64_t jb = j0 / a.bk; jb * a.bk < j0 + nk; ++jb) {
        if (c.ready[jb]) continue;
        const int64_t first = jb * a.bk, n = std::min(a.bk, a.S - first);
        transpose_keys(x + first * ldx, ldx, n, width, c.t.data() + c.pad + first, ld);
        c.ready[jb] = 1;
    }
}

// Whether a query block with these key blocks reads its keys through the caches: where the
// sequence's keys fit them and the block sees at least kCacheFromKeys keys. A key is
// transposed once and then saves ~7% of two products for each query row that sees it, about
// as many rows as a query block sees keys in a band-like mask: break-even near 500 (perf: 88 ns
// to transpose a key's k and v rows of 64, 2.6 ns of products a row). Measured (backward,
// N=16384, 1 thread, AMD EPYC Zen 4): a causal window of 256 (383 keys a block) 3% slower
// through the caches than through sgemm_; causal N=4096 (2100 a block on average) 5% faster.
constexpr int64_t kCacheFromKeys = 1024;

inline bool transposing(const Args& a, const std::vector<KeyBlock>& blocks, int64_t D,
                        int64_t Dv) {
    if (!transposable(a, std::max(D, Dv))) return false;
    int64_t keys = 0;
    for (const KeyBlock& blk : blocks) keys += blk.nk;
    return keys >= kCacheFromKeys;
}

// C (nq x nk) = A (nq x width) . X[j0 .. j0 + nk)^T, X's rows ldx apart: through the cache c
// (made ready first) or sgemm_.
void times_keys(const Args& a, bool cache, Transposed& c, const float* x, int64_t ldx,
                int64_t width, int64_t nq, const float* A, int64_t lda, int64_t j0, int64_t nk,
                float* C, int64_t ldc) {
    if (!cache) {
        mm_nt(nq, nk, width, A, lda, x + j0 * ldx, ldx, 0.0f, C, ldc);
        return;
    }
    make_ready(a, c, x, ldx, width, j0, nk);
    gemm_tiles<true>(nq, nk, width, A, lda, 1, c.t.data() + j0, transposed_ld(a), C, ldc);
}

// ------------------------------------------------------------------ the offset path's caches
// Padded transposed keys (offset_path.h): key j's d-th float at [d * ld + j], zero columns
// either side of the keys held.

// Zero columns either side of a padded cache: lane u reads keys i + u + delta for every
// delta of a run's union [dlo, dhi), the offsets of lanes v: from lo_v + u - v >= lo_v - 7 to
// hi_v + u - v - 1 <= hi_v + 6 (lo_v, hi_v: lane v's keys), within 7 (kTileRows - 1) of the keys
// the tile's lanes see (offset_path.h).
constexpr int64_t kOffsetPad = 8;

// Makes keys [j0, j1) of x (rows ldx apart, `width` floats each) ready in the padded cache c
// (make_ready, kOffsetPad zero columns either side); returns key 0's column:
// key j's d-th float at [d * ld + j] for -kOffsetPad <= j < S + kOffsetPad, ld =
// offset_ld(a).
inline int64_t offset_ld(const Args& a) { return transposed_ld(a) + 2 * kOffsetPad; }

inline const float* offset_ready(const Args& a, Transposed& c, const float* x, int64_t ldx,
                                 int64_t width, int64_t j0, int64_t j1) {
    c.pad = kOffsetPad;
    j0 = std::max<int64_t>(j0, 0), j1 = std::min(j1, a.S);
    if (j0 < j1) make_ready(a, c, x, ldx, width, j0, j1 - j0);
    return c.t.data() + kOffsetPad;
}

// Keys the sliding cache holds at least (offset_window): 64 dimensions of 512 keys, 128 KiB,
// within the second-level cache; a block whose keys span more (a 2-D neighbourhood's: a query
// block of 128 spans ~kernel + 1 canvas rows) gets twice its span.
constexpr int64_t kOffsetWindow = 512;

// Makes keys [j0, j1) of x (rows ldx apart, `width` floats each) ready in c as a sliding
// cache, for the query blocks of one sequence in order: the keys past those it holds are
// appended (transposed), and where they would not fit within its `cap` keys, or the block
// starts before them, it starts again at j0. Returns key 0's column (key j's d-th float at
// [d * ldt + j]; kOffsetPad zero columns either side of what it holds) and sets ldt.
// The per-sequence cache (offset_ready) writes and reads back a sequence's whole transposed
// keys, 1.1 MiB at S=4096, D=64, out of the second-level cache: measured (window of 9 keys,
// N=4096, H=8, D=64, forward, AMD EPYC Zen 4) 6.9 ms on it against 5.7 sliding.
inline const float* offset_window(Transposed& c, const float* x, int64_t ldx, int64_t width,
                                  int64_t j0, int64_t j1, int64_t& ldt) {
    const int64_t cap = std::max(kOffsetWindow, 2 * (j1 - j0));
    ldt = std::max(c.cap, cap) + 2 * kOffsetPad + 16;
    if (cap > c.cap || c.t.size() < static_cast<size_t>(width * ldt)) {  // grown: start again
        c.cap = std::max(c.cap, cap);
        c.t.resize(width * ldt);
        c.src = nullptr;
    }
    float* t = c.t.data();
    if (c.src != x || j0 < c.first || j1 - c.first > c.cap) {  // start again at j0
        c.src = x, c.first = c.end = j0;
        for (int64_t d = 0; d < width; ++d) std::fill(t + d * ldt, t + d * ldt + kOffsetPad, 0.0f);
    }
    if (j1 > c.end) {
        transpose_keys(x + c.end * ldx, ldx, j1 - c.end, width, t + kOffsetPad + c.end - c.first,
                       ldt);
        c.end = j1;
        const int64_t past = kOffsetPad + c.end - c.first;  // zero columns after the keys
        for (int64_t d = 0; d < width; ++d) {
            std::fill(t + d * ldt + past, t + d * ldt + past + kOffsetPad, 0.0f);
        }
    }
    return t + kOffsetPad - c.first;
}

// Whether a sequence's keys of `width` floats fit a padded cache (kMaxTransposed).
inline bool offset_cacheable(const Args& a, int64_t width) {
    return offset_ld(a) * width <= kMaxTransposed;
}

}  // namespace
