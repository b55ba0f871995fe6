// The tile path (forward): a query block whose rows, kTileRows at a time, span a few keys
// each (documents of 8-32 tokens, a strided mask's short interleaved sequences, calls of at
// most 32 keys) is computed a tile of kTileRows rows at a time, the tile's scores S (rows x
// the union of their keys) as a small matrix product held in registers: one query row a
// vector lane (q transposed once), one key at a time broadcast against every row, no
// horizontal sums. forward.h's forward_tile takes it from there. Measured (AMD EPYC Zen 4,
// 1 thread, N=4096, H=8, D=64, forward, fastest of 15 interleaved rounds, two runs, block path
// -> tiles): documents of 16 tokens 7.4-7.5 -> 3.8-3.9 ms, strided 1/256 (sequences of 16)
// 5.6-6.0 -> 4.3-4.7 ms; the AVX2 build 7.6-7.7 -> 3.9-4.1 and 5.5-6.2 -> 4.9-5.4 ms. Narrow
// windows keep the row path (tile_path's note). The backward takes the same blocks as tiles
// (tile_backward.h).
//
// Where a row's time goes (documents of 16 tokens, forward kernel alone, perf in cache and
// timing experiments, AMD EPYC Zen 4): ~95-100 ns a row in cache (N=512, H=1) and with every
// tensor in L3 (N=4096, H=1), ~115-135 ns at H=8 (32 MiB); in cache the products'
// multiply-adds are about half (scores ~28 ns, weighted sums ~20 ns, each near the FMA peak),
// the rest the block's set-up (key_blocks' stretches, row_path, tile_path's scans, load_q),
// transposes, packing, exponentials and the prefetch. Strided 1/256 costs the same in L3 and
// ~150 ns at H=8: its rows 64 KiB apart come from DRAM 256 bytes at a time. Tried and not
// kept: fetching the next 16 sequences' rows as contiguous 4 KiB runs (one position of 16
// neighbours) instead of the next sequence's rows (5.08 vs 5.11 and 5.51 vs 5.45 ms); fetching
// 2, 4 or 8 sequences ahead (1.1-1.2x slower); in a standalone model of these reads, gathering
// 16 neighbouring sequences' runs before computing them took 7.3-7.5 ms against 7.1-7.3 for
// one sequence at a time with the next one fetched (contiguous sequences 5.2-5.3), and 2 MiB
// pages made the strided reads slower (7.9-9.2); streaming stores of out (no change). Also
// tried: each row's weighted sum scaled straight into out, up to 4 rows that see the same keys
// sharing each value row's loads, the queries transposed and scaled from q's rows without
// load_q's copy, and stretches merged as read (bit for bit the same): documents of 16 forward
// 0.88-0.96x against the kernel they were written on, ~1.0x after rebasing onto the narrow
// path's kernel, and strided 1/256, whose code they left alone, 1.07-1.12x in those builds.
// Over three layouts each (an unused function of three sizes added), documents of 16 took
// 3.30-3.50 ms against main's 3.55-3.58 and strided 1/256 5.5-5.9 against 4.9-5.5, and with
// the new path kept out of line (noinline) 4.41-4.55 against 4.61-4.70 and 5.3-5.7 against
// 4.7-4.9 (another run): the strided slowdown is systematic, its cause not found (its source
// path was main's but for a scale argument of 1). These forwards also move by 3-10% with code
// layout alone: compare builds in alternating order, several runs and layouts, before
// believing a few per cent.
//
// Legend: kTileRows rows of a tile (the lanes of tvec), kTileKeys the widest span a tile takes,
// kDimBlock the dimensions packed together; tile_keys a tile's span [jlo, jhi); tile_path
// whether a block takes the path; transpose_q qT (D' x kTileRows, D' = D rounded up to
// kDimBlock); pack_keys the span's keys in kDimBlock-dimension slices; tile_scores the score
// tile sT (key-major: span x kTileRows), masked to each row's [lo, hi), and the rows' maxima;
// tile_product the whole tile; tile_softmax its exponentials; packed_values a contiguous copy
// of interleaved value rows; prefetch_tile_row the path's prefetch; tile_gemm the small
// products of both passes' tiles (gemm_acc.h's register tiles, kTileGemmRows x
// kTileGemmVectors).

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "args.h"
#include "gemm_acc.h"
#include "row_path.h"
#include "scratch.h"
#include "simd.h"
#include "softmax_row.h"

namespace {

using namespace attnkit_simd;

// Rows a tile: 8 lanes of 32-byte vectors on every ISA (ymm on AVX-512 and AVX2, two xmm
// elsewhere), not simd.h's kLanes: AMD Zen 4 runs a 512-bit FMA as two 256-bit halves, so 16
// rows a zmm do the same FMAs a cycle as 8 a ymm, while a tile of 16 rows spans 8 keys more
// (a window of 9 keys: 24 keys x 16 rows against 16 x 8, 2.67 against 1.78 computed entries
// an allowed one), and the count of computed entries stays the same on every ISA.
constexpr int64_t kTileRows = 8;
// The widest span a tile takes (at most kRowPathKeys, the score rows finish_rows reads). 32:
// strided 1/64 (sequences of 64 tokens) on tiles of 64 keys took 12.5 ms against the blocks'
// 10.8 (N=4096, H=8, forward).
constexpr int64_t kTileKeys = 32;
constexpr int64_t kDimBlock = 16;
// The tile path's prefetch distance (prefetch_tile_row, called a row at a time as each row's
// weighted sum starts), in rows: 3 tiles. Measured (N=4096, H=8, D=64, forward, fastest of 15-21
// interleaved rounds, AMD EPYC Zen 4): the keys and values of query i + 24 rather than
// prefetch_forward's hi - 1 + 24 (the same row for every query of a document): documents of
// 16 tokens 4.85 -> 4.02 ms, strided 1/256 5.02 -> 4.82; prefetching instead the next tile's
// whole key span at once, into L2 or L1, was 7-10% slower, and fetching the next interleaved
// sequence's out rows for writing (prefetchw in prefetch_next_sequence) rather than into L2
// slower too (strided 1/256 5.24 -> 5.83 ms, 1/64 10.2 -> 10.8).
constexpr int64_t kTileAhead = 24;

typedef float tvec __attribute__((vector_size(kTileRows * 4)));
typedef int32_t tint __attribute__((vector_size(kTileRows * 4)));

#if defined(__AVX__)
inline tvec tsplat(float x) { return _mm256_set1_ps(x); }
inline tvec tmax(tvec a, tvec b) { return _mm256_max_ps(a, b); }  // NaN in a: b (maxps)
inline tvec tmin(tvec a, tvec b) { return _mm256_min_ps(a, b); }
#else
inline tvec tsplat(float x) { return tvec{} + x; }
inline tvec tmax(tvec a, tvec b) { return a > b ? a : b; }
inline tvec tmin(tvec a, tvec b) { return a < b ? a : b; }
#endif

inline tvec tload(const float* p) {
    tvec v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline void tstore(float* p, tvec v) { std::memcpy(p, &v, sizeof v); }

// exp lane by lane: exp_v's body (simd.h, exp_clamped) on a tile vector.
inline tvec texp(tvec x) {
    return exp_clamped<tvec, tint>(tmin(tsplat(88.0f), tmax(tsplat(kExpLo), x)));
}

// The small products' register tiles: MR rows x NV vectors of C (16 accumulators of AVX-512's
// 32 zmm; 8 of AVX2's 16 ymm, with the B row's vectors and a broadcast).
#if ATTNKIT_VBYTES == 64
constexpr int kTileGemmRows = 4, kTileGemmVectors = 4;
#else
constexpr int kTileGemmRows = 4, kTileGemmVectors = 2;
#endif

// C (M x N) [+]= A (M x K) . B (K x N), A(m, k) = a[m * sam + k * sak], B's rows ldb apart.
template <bool Set>
inline void tile_gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t sam, int64_t sak,
                      const float* b, int64_t ldb, float* c, int64_t ldc) {
    gemm_tiles<Set, kTileGemmRows, kTileGemmVectors>(M, N, K, a, sam, sak, b, ldb, c, ldc);
}

// The keys [jlo, jhi) of a tile's rows u < n: the union of their keys (rows that see nothing
// add nothing; [0, 0) when none sees any).
inline void tile_keys(const int64_t* lo, const int64_t* hi, int64_t n, int64_t& jlo,
                      int64_t& jhi) {
    jlo = INT64_MAX, jhi = 0;
    for (int64_t u = 0; u < n; ++u) {
        if (lo[u] < hi[u]) jlo = std::min(jlo, lo[u]), jhi = std::max(jhi, hi[u]);
    }
    if (jlo >= jhi) jlo = jhi = 0;
}

// Calls tile(r, n, lo, hi) for tiles of rows r..r+n-1 (n <= kTileRows) of rows i0..i1.
template <typename F>
void each_tile(const Args& a, const Scratch& w, int64_t i0, int64_t i1, F&& tile) {
    int64_t first, end;
    blocks_span(w, first, end);
    for (int64_t r = 0; r < i1 - i0; r += kTileRows) {
        const int64_t n = std::min(kTileRows, i1 - i0 - r);
        int64_t lo[kTileRows], hi[kTileRows];
        for (int64_t u = 0; u < n; ++u) row_span(a, w, r + u, i0 + r + u, first, end, lo[u], hi[u]);
        tile(r, n, lo, hi);
    }
}

// Whether rows i0..i1 take the tile path: at least kTileRows of them, each one run of keys (no
// tiles of a table), every tile's span at most kTileKeys, and, where the row path would take
// them too (`on_row_path`), every tile computing at most 5/4 of the entries its rows see
// (checked tile by tile, so that a window's block is turned down at its first tile: walking
// all its rows a second time cost the row path's windows of 9 keys 3-5% in cache).
// Fewer rows leave lanes of the product empty: a decoding step (N=1, S=32, H=8, D=64) took ~2%
// longer on one tile than on the block path. Against the row path (AMD EPYC Zen 4, N=4096, H=8,
// D=64, forward, fastest of 11-15 interleaved rounds, row path -> tiles): windows of 9 and 17
// keys (tiles computing 1.78 and 1.41 x their entries) 3.30 -> 4.22 and 4.34 -> 4.90 ms, of 33
// (1.21 x) 6.48 -> 6.62 (AVX2 build: 3.88 -> 4.17, 4.63 -> 5.01, 7.08 -> 6.96): a 512-bit FMA
// is two 256-bit ones there, and the row path's 16-lane dot products do no more FMAs than the
// tile's 8-lane product where the tile computes twice the entries; the tile's gain is in rows
// that see all of its span (documents, interleaved sequences).
bool tile_path(const Args& a, const Scratch& w, int64_t i0, int64_t i1, bool on_row_path) {
    if (a.table || a.rows_k > 1 || i1 - i0 < kTileRows) return false;
    int64_t first, end;
    blocks_span(w, first, end);
    for (int64_t r = 0; r < i1 - i0; r += kTileRows) {
        const int64_t n = std::min(kTileRows, i1 - i0 - r);
        int64_t lo[kTileRows], hi[kTileRows], seen = 0, jlo, jhi;
        for (int64_t u = 0; u < n; ++u) {
            row_span(a, w, r + u, i0 + r + u, first, end, lo[u], hi[u]);
            seen += hi[u] - lo[u];
        }
        tile_keys(lo, hi, n, jlo, jhi);
        if (jhi - jlo > kTileKeys || (on_row_path && 4 * n * (jhi - jlo) > 5 * seen)) return false;
    }
    return true;
}

// The thread's buffers for the tile path: qT, the packed keys, the score tile, the values'
// copy, the row path's rows of scores. (The output rows, w.acc, hold the block's bq >=
// kTileRows rows already.)
inline void tile_buffers(const Args& a, Scratch& w) {
    const size_t dims = static_cast<size_t>(ceil_div(std::max(a.D, a.Dv), kDimBlock) * kDimBlock);
    auto at_least = [](std::vector<float>& buf, size_t n) {
        if (buf.size() < n) buf.resize(n);
    };
    at_least(w.tq, dims * kTileRows);
    at_least(w.tk, dims * kTileKeys);
    at_least(w.ts, kTileKeys * kTileRows);
    at_least(w.tv, dims * kTileKeys);
    at_least(w.s, kRowGroup * kRowPathKeys);
}

// qT[d * kTileRows + u] = qs[u * D + d] for rows u < n, 0 in the other lanes and in the
// dimensions D..D' (D' = dblocks * kDimBlock). With AVX, 8 x 8 blocks transposed in registers
// (simd.h's transpose8): the scalar copy it replaces was
// ~20% of a window of 9 keys' forward (perf, in cache, H=1: 512 single-float stores a tile).
inline void transpose_q(const float* qs, int64_t n, int64_t D, int64_t dblocks, float* qT) {
    int64_t d0 = 0;
#if defined(__AVX__)
    static_assert(kTileRows == 8, "an 8 x 8 transpose");
    for (; d0 + 8 <= D; d0 += 8) transpose8(qs + d0, D, qT + d0 * kTileRows, kTileRows, n);
#endif
    std::fill(qT + d0 * kTileRows, qT + dblocks * kDimBlock * kTileRows, 0.0f);
    for (int64_t u = 0; u < n; ++u) {
        for (int64_t d = d0; d < D; ++d) qT[d * kTileRows + u] = qs[u * D + d];
    }
}

// Keys c < nk of k (rows ldk apart) into kp, dimension slices of kDimBlock: key c's dimensions
// [g * kDimBlock, (g + 1) * kDimBlock) at kp + (g * np + c) * kDimBlock, np >= nk keys a slice
// (keys nk..np and dimensions past D zero), so that the score loop reads every key of a slice
// at a fixed offset from one pointer.
inline void pack_keys(const float* k, int64_t ldk, int64_t nk, int64_t np, int64_t D,
                      int64_t dblocks, float* kp) {
    for (int64_t g = 0; g < dblocks; ++g) {
        float* slice = kp + g * np * kDimBlock;
        const int64_t d0 = g * kDimBlock, m = std::min(kDimBlock, D - d0);
        for (int64_t c = 0; c < nk; ++c) {
            const float* src = k + c * ldk + d0;
            float* dst = slice + c * kDimBlock;
            for (int64_t e = 0; e < kDimBlock; e += kLanes) {
                store(dst + e, e + kLanes <= m ? load(src + e)
                                               : load_part(src + e, std::max<int64_t>(m - e, 0), 0.0f));
            }
        }
        std::fill(slice + nk * kDimBlock, slice + np * kDimBlock, 0.0f);
    }
}

// Scores of keys c0..c0+C of the packed span (np keys a slice) against the tile's rows: for
// each dimension, one vector of the rows' query components and C keys' components broadcast,
// C accumulators in registers (C independent FMA chains). Masked to each lane's [vlo, vhi)
// (key numbers relative to the span's first) into sT (key-major), their maximum into m.
template <int C>
inline void tile_scores(const float* qT, const float* kp, int64_t np, int64_t dblocks,
                        int64_t c0, tint vlo, tint vhi, float* sT, tvec& m) {
    tvec acc[C];
#pragma GCC unroll 32
    for (int c = 0; c < C; ++c) acc[c] = tvec{};
    for (int64_t g = 0; g < dblocks; ++g) {
        const float* kd = kp + (g * np + c0) * kDimBlock;
        const float* qd = qT + g * kDimBlock * kTileRows;
#pragma GCC unroll 16
        for (int dd = 0; dd < kDimBlock; ++dd) {
            const tvec qv = tload(qd + dd * kTileRows);
#pragma GCC unroll 32
            for (int c = 0; c < C; ++c) acc[c] += tsplat(kd[c * kDimBlock + dd]) * qv;
        }
    }
    const tvec ninf = tsplat(kNegInf);
#pragma GCC unroll 32
    for (int c = 0; c < C; ++c) {
        const tint j = tint{} + static_cast<int32_t>(c0 + c);
        const tvec s = (vlo <= j) & (j < vhi) ? acc[c] : ninf;
        m = tmax(s, m);  // a NaN score passed over (the exponentials carry it on)
        tstore(sT + (c0 + c) * kTileRows, s);
    }
}

// The score chunks' widths: kTileChunk keys (accumulators, with the query vector and a
// broadcast, within the 32 vector registers of AVX-512 or the 16 of AVX2), then 16 and 8.
#if defined(__AVX512F__)
constexpr int kTileChunk = 24;
#else
constexpr int kTileChunk = 8;
#endif

// The whole score tile: np (a multiple of 8) packed keys in chunks.
inline void tile_scores_all(const float* qT, const float* kp, int64_t np, int64_t dblocks,
                            tint vlo, tint vhi, float* sT, tvec& m) {
    int64_t c = 0;
    for (; np - c >= kTileChunk; c += kTileChunk) {
        tile_scores<kTileChunk>(qT, kp, np, dblocks, c, vlo, vhi, sT, m);
    }
#if defined(__AVX512F__)
    if (np - c >= 16) {
        tile_scores<16>(qT, kp, np, dblocks, c, vlo, vhi, sT, m);
        c += 16;
    }
#endif
    for (; c < np; c += 8) tile_scores<8>(qT, kp, np, dblocks, c, vlo, vhi, sT, m);
}

// The product tile of rows u < n of x (dims wide, dims apart) with keys [jlo, jlo + span) of
// y (rows ldy apart), each row masked to its own [lo[u], hi[u]), into out (key-major); returns
// the rows' maxima (-inf where a row sees nothing). y's packed copy in `packed` (its first row
// and count in packed_y, packed_n) is kept for the next tile when it spans the same keys (the
// tiles of a short sequence: a strided mask). S = (scale q) k^T in the forward, S and
// dP~ = dO' v^T in the backward (tile_backward.h; a first backward of tiles that took the row
// path's stages after these two products, dS k and the dK, dV rows a row at a time, 64 KiB
// apart on strided 1/256, was slower there: 19.2-19.8 -> 21.4-21.8 ms forward + backward).
inline tvec tile_product(const float* x, int64_t n, int64_t dims, const float* y, int64_t ldy,
                         int64_t jlo, int64_t span, const int64_t* lo, const int64_t* hi,
                         float* xT, float* packed, const float*& packed_y, int64_t& packed_n,
                         float* out) {
    tvec m = tsplat(kNegInf);
    if (span == 0) return m;
    const int64_t dblocks = ceil_div(dims, kDimBlock), np = ceil_div(span, 8) * 8;
    tint vlo{}, vhi{};  // each lane's keys, numbered from jlo; lanes past n see none
    for (int64_t u = 0; u < n; ++u) {
        vlo[u] = static_cast<int32_t>(lo[u] - jlo);
        vhi[u] = static_cast<int32_t>(hi[u] - jlo);
    }
    transpose_q(x, n, dims, dblocks, xT);
    if (packed_y != y || packed_n != span) {
        pack_keys(y, ldy, span, np, dims, dblocks, packed);
        packed_y = y, packed_n = span;
    }
    tile_scores_all(xT, packed, np, dblocks, vlo, vhi, out, m);
    return m;
}

// The forward's score tile: rows u < n of the pre-scaled queries qs (D apart) against the keys
// [jlo, jlo + span) at k (rows ldk apart), into w.ts.
inline tvec tile_scores_masked(const Args& a, Scratch& w, const float* qs, int64_t n,
                               const float* k, int64_t ldk, int64_t jlo, int64_t span,
                               const int64_t* lo, const int64_t* hi) {
    return tile_product(qs, n, a.D, k, ldk, jlo, span, lo, hi, w.tq.data(), w.tk.data(),
                        w.packed_k, w.packed_k_n, w.ts.data());
}

// The forward's softmax numerators on the key-major tile sT (span keys), in place: exp(s - m)
// lane by lane, a row a lane; returns their sums (rows that see nothing: m = -inf, sum 0).
inline tvec tile_softmax(float* sT, int64_t span, tvec m) {
    const tvec m_safe = m == tsplat(kNegInf) ? tvec{} : m;  // nothing seen: exp -> 0
    tvec l{};
    for (int64_t c = 0; c < span; ++c) {
        const tvec p = texp(tload(sT + c * kTileRows) - m_safe);
        l += p;
        tstore(sT + c * kTileRows, p);
    }
    return l;
}

// Value rows c < nk of v (rows ldv apart) copied to w.tv, Dv apart (kept for the next tile
// when it reads the same rows).
inline const float* packed_values(Scratch& w, const float* v, int64_t ldv, int64_t nk,
                                  int64_t Dv) {
    if (w.packed_v != v || w.packed_v_n != nk) {
        for (int64_t c = 0; c < nk; ++c) std::copy(v + c * ldv, v + c * ldv + Dv, w.tv.data() + c * Dv);
        w.packed_v = v, w.packed_v_n = nk;
    }
    return w.tv.data();
}

// The tile path's prefetch at query i of a block of nq rows: the next block's query i + nq,
// out of query i + kTileAhead and the key and value i + kTileAhead (bottom-right aligned:
// i + S - N + kTileAhead), where the keys of short documents and sequences follow the queries.
void prefetch_tile_row(const Args& a, int64_t head, int64_t sq, int64_t i, int64_t nq,
                       const float* kb, int64_t ldk, const float* vb, int64_t ldv) {
    if (i + nq < a.N) prefetch_row_l2(a.q + qrow(a, head, sq, i + nq) * a.D, a.D);
    const int64_t ahead = i + kTileAhead, j = ahead + a.S - a.N;
    if (ahead < a.N) prefetch_row_w(a.out + qrow(a, head, sq, ahead) * a.Dv, a.Dv);
    if (j >= 0 && j < a.S) {
        prefetch_row_l2(kb + j * ldk, a.D);
        prefetch_row_l2(vb + j * ldv, a.Dv);
    }
}

}  // namespace
