// The backward's matrix products as register-tiled loops that read their operands in place,
// instead of MKL's sgemm_: dV += P^T dO', dQ += dS k, dK += dS^T q here (acc_nn, acc_tn), and
// S, dP~ over transposed keys (transposed.h).
//
// Why: at the backward's block shapes MKL copies (packs) both operands on every call, and P and
// dS are fresh for every call: perf of a causal N=4096 backward (1 thread, AMD EPYC Zen 4) had
// 12.6% of it in mkl_blas_def_sgemm_scopy_* and 2% in mscale against 78% in the FMA kernel.
// MKL's packed API (cblas_sgemm_pack / _compute, with the query side or both sides packed once)
// ran 0-7% SLOWER than plain sgemm_ at 128 x 256 blocks, D = 64 and 128. These products need no
// packing: each has one operand whose rows are contiguous D-vectors (k, q, dO') and one read a
// scalar at a time (P, dS), so C += A B is a rank-1 update per step of k: MR rows of C in
// registers, a row of B loaded, an entry of A broadcast. Measured alone at 128 x 256 blocks over
// 16 key blocks (1 thread, AMD EPYC Zen 4, AVX-512, interleaved with sgemm_, best of 9):
// D = 64 dV 75-89 -> 107 GFLOP/s, dQ 96 -> 111, dK 89 -> 108; D = 128 94 -> 100, 93 -> 109,
// 94 -> 101. Built for AVX2 the same loops ran at 45-104 GFLOP/s against MKL's 83-97 depending
// on the tile (2 x 6 best, noisy): AVX2 builds keep sgemm_ (kGemmTiles).
//
// Legend: gemm_tile MR rows x NV vectors of C; gemm_rows all rows of one panel of NV vectors;
// gemm_last_panel the narrower panel at C's right edge; gemm_tiles C (M x N) = or +=
// A (M x K) . B (K x N), with A(m, k) = a[m * sam + k * sak] (so A or A^T of a row-major
// matrix), B's row k at b + k * ldb, C's row m at c + m * ldc; acc_nn, acc_tn the kernel's
// C += A B and C += A^T B, on the tiles where the build has them (kGemmTiles), else sgemm_.

#pragma once

#include <cstdint>

#include "blas.h"
#include "simd.h"

namespace {

using attnkit_simd::kLanes;
using attnkit_simd::vfloat;

#if ATTNKIT_VBYTES == 64
constexpr bool kGemmTiles = true;
constexpr int kGemmRows = 6, kGemmVectors = 4;  // 24 accumulators of 32 zmm; D = 64: one panel
#else
constexpr bool kGemmTiles = false;
constexpr int kGemmRows = 1, kGemmVectors = 1;
#endif

// v kept in a register: gcc 12 otherwise folded each load of B's row into every FMA that uses
// it (MR loads of a vector instead of one). Measured on the tile backward's 4 x 4 tiles
// (documents of 16 tokens, in cache, AMD EPYC Zen 4): 281 -> 261 ns a row; the blocks' 6 x 4
// tiles keep the folded loads (a dense backward was not faster, within the noise).
inline void hold(attnkit_simd::vfloat& v) {
#if defined(__AVX512F__)
    asm volatile("" : "+v"(v));
#elif defined(__SSE__)
    asm volatile("" : "+x"(v));
#else
    (void)v;
#endif
}

// MR rows x NV vectors of C (Set: C = A B, else C += A B); the last vector holds `last`
// columns (Part: fewer than kLanes, read and written through masks).
template <int MR, int NV, bool Set, bool Part>
inline void gemm_tile(int64_t K, const float* a, int64_t sam, int64_t sak, const float* b,
                      int64_t ldb, float* c, int64_t ldc, int64_t last) {
    using namespace attnkit_simd;
    auto ld = [&](const float* p, int v) {
        return Part && v == NV - 1 ? load_part(p, last, 0.0f) : load(p);
    };
    vfloat acc[MR][NV];
    for (int m = 0; m < MR; ++m) {
        for (int v = 0; v < NV; ++v) acc[m][v] = Set ? vfloat{} : ld(c + m * ldc + v * kLanes, v);
    }
    for (int64_t k = 0; k < K; ++k) {
        vfloat bv[NV];
        for (int v = 0; v < NV; ++v) {
            bv[v] = ld(b + k * ldb + v * kLanes, v);
            if constexpr (MR * NV <= 16) hold(bv[v]);  // the tile path's tiles (the blocks': kept)
        }
        const float* ak = a + k * sak;
        for (int m = 0; m < MR; ++m) {
            const vfloat am = splat(ak[m * sam]);
            for (int v = 0; v < NV; ++v) acc[m][v] += am * bv[v];
        }
    }
    for (int m = 0; m < MR; ++m) {
        for (int v = 0; v < NV; ++v) {
            float* p = c + m * ldc + v * kLanes;
            if (Part && v == NV - 1) {
                store_part(p, acc[m][v], last);
            } else {
                store(p, acc[m][v]);
            }
        }
    }
}

// Rows [m0, M) of one panel in tiles of MR, then the rest in one smaller tile.
template <int MR, int NV, bool Set, bool Part>
inline void gemm_rows(int64_t m0, int64_t M, int64_t K, const float* a, int64_t sam,
                      int64_t sak, const float* b, int64_t ldb, float* c, int64_t ldc,
                      int64_t last) {
    if constexpr (MR > 0) {
        int64_t m = m0;
        for (; m + MR <= M; m += MR) {
            gemm_tile<MR, NV, Set, Part>(K, a + m * sam, sam, sak, b, ldb, c + m * ldc, ldc,
                                         last);
        }
        if (m < M) {
            gemm_rows<MR - 1, NV, Set, Part>(m, M, K, a, sam, sak, b, ldb, c, ldc, last);
        }
    }
}

// The last panel: nv vectors, the last of them `last` columns (tiles of MR rows).
template <int NV, bool Set, int MR = kGemmRows>
inline void gemm_last_panel(int64_t nv, int64_t last, int64_t M, int64_t K, const float* a,
                            int64_t sam, int64_t sak, const float* b, int64_t ldb, float* c,
                            int64_t ldc) {
    if constexpr (NV > 0) {
        if (nv < NV) {
            return gemm_last_panel<NV - 1, Set, MR>(nv, last, M, K, a, sam, sak, b, ldb, c, ldc);
        }
        if (last < kLanes) {
            gemm_rows<MR, NV, Set, true>(0, M, K, a, sam, sak, b, ldb, c, ldc, last);
        } else {
            gemm_rows<MR, NV, Set, false>(0, M, K, a, sam, sak, b, ldb, c, ldc, last);
        }
    }
}

// C (M x N) [+]= A (M x K) . B (K x N): panels of NV vectors, the last one narrower, in tiles
// of MR rows (the block products' kGemmRows x kGemmVectors, or the tile path's own).
template <bool Set, int MR = kGemmRows, int NV = kGemmVectors>
inline void gemm_tiles(int64_t M, int64_t N, int64_t K, const float* a, int64_t sam, int64_t sak,
                       const float* b, int64_t ldb, float* c, int64_t ldc) {
    constexpr int64_t W = NV * kLanes;
    int64_t n = 0;
    for (; n + W <= N; n += W) {
        gemm_rows<MR, NV, Set, false>(0, M, K, a, sam, sak, b + n, ldb, c + n, ldc, kLanes);
    }
    if (n == N) return;
    const int64_t nv = (N - n + kLanes - 1) / kLanes, last = N - n - (nv - 1) * kLanes;
    gemm_last_panel<NV, Set, MR>(nv, last, M, K, a, sam, sak, b + n, ldb, c + n, ldc);
}

// C (r x c) += A (r x k) . B (k x c), row-major (blas.h's mm_nn with beta = 1).
inline void acc_nn(int r, int c, int k, const float* A, int lda, const float* B, int ldb, float* C,
                   int ldc) {
    if (kGemmTiles) {
        gemm_tiles<false>(r, c, k, A, lda, 1, B, ldb, C, ldc);
    } else {
        mm_nn(r, c, k, A, lda, B, ldb, 1.0f, C, ldc);
    }
}

// C (r x c) += A (k x r)^T . B (k x c), row-major (blas.h's mm_tn with beta = 1).
inline void acc_tn(int r, int c, int k, const float* A, int lda, const float* B, int ldb, float* C,
                   int ldc) {
    if (kGemmTiles) {
        gemm_tiles<false>(r, c, k, A, 1, lda, B, ldb, C, ldc);
    } else {
        mm_tn(r, c, k, A, lda, B, ldb, 1.0f, C, ldc);
    }
}

}  // namespace
