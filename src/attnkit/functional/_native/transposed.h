// The backward's S = (scale q) k^T and dP~ = dO' v^T as gemm_acc.h's register tiles: a key
// block's keys transposed (width rows of keys) are the contiguous rows those tiles read, and
// each thread keeps its sequence's transposed keys and values (Scratch::kt, vt), made once per
// key block and read by every query block after it (and the G query heads sharing them).
//
// Why: MKL's sgemm_ packs the key block and the query block on every call and zeroes S first
// (mscale). Measured alone (128 x 256 blocks over 16-64 key blocks, 1 thread, AMD EPYC Zen 4,
// AVX-512, best of 9): sgemm_ 88-98 GFLOP/s, the tiles over transposed keys 97-103 with a zero
// fill (none here); transposing each key block for each query block instead: 67-73.
//
// Legend: transposable whether a sequence's keys of `width` floats fit a cache; block_t the
// transposed block jb (made on first use); times_transposed C = A X[j0 .. j0 + nk)^T.

#pragma once

#include <algorithm>
#include <cstdint>

#include "args.h"
#include "blas.h"
#include "gemm_acc.h"
#include "scratch.h"

namespace {

// Floats one cache may hold (8 MiB: S = 32768 keys of 64); longer sequences keep sgemm_.
constexpr int64_t kMaxTransposed = int64_t{1} << 21;

inline bool transposable(const Args& a, int64_t width) {
    return kUseTiles && ceil_div(a.S, a.bk) * a.bk * width <= kMaxTransposed;
}

// Block jb of the keys x (rows ldx apart, `width` floats each) transposed: width rows of bk.
const float* block_t(const Args& a, Transposed& c, const float* x, int64_t ldx, int64_t width,
                     int64_t jb) {
    if (c.src != x) {  // another sequence: nothing cached
        const int64_t blocks = ceil_div(a.S, a.bk);
        c.src = x;
        c.t.resize(blocks * a.bk * width);
        c.ready.assign(blocks, 0);
    }
    float* dst = c.t.data() + jb * a.bk * width;
    if (!c.ready[jb]) {
        const int64_t j0 = jb * a.bk, n = std::min(a.bk, a.S - j0);
        constexpr int64_t kChunk = 16;  // keys: 16 source rows stay in L1 across the d loop
        for (int64_t j = 0; j < n; j += kChunk) {
            const int64_t m = std::min(kChunk, n - j);
            for (int64_t d = 0; d < width; ++d) {
                for (int64_t u = 0; u < m; ++u) dst[d * a.bk + j + u] = x[(j0 + j + u) * ldx + d];
            }
        }
        c.ready[jb] = 1;
    }
    return dst;
}

// C (nq x nk) = A (nq x width) . X[j0 .. j0 + nk)^T, X's rows ldx apart: a key block split
// where it crosses the bk grid of the cache.
void times_transposed(const Args& a, Transposed& c, const float* x, int64_t ldx, int64_t width,
                      int64_t nq, const float* A, int64_t lda, int64_t j0, int64_t nk, float* C,
                      int64_t ldc) {
    if (!transposable(a, width)) {
        mm_nt(nq, nk, width, A, lda, x + j0 * ldx, ldx, 0.0f, C, ldc);
        return;
    }
    for (int64_t j = j0; j < j0 + nk;) {
        const int64_t jb = j / a.bk, end = std::min(j0 + nk, (jb + 1) * a.bk);
        const float* bt = block_t(a, c, x, ldx, width, jb) + (j - jb * a.bk);
        gemm_tiles<true>(nq, end - j, width, A, lda, 1, bt, a.bk, C + (j - j0), ldc);
        j = end;
    }
}

}  // namespace
