// The backward's offset path: the rows of a narrow band (a window, a causal window, the
// windows of interleaved sequences) kTileRows at a time, one query a vector lane and the keys
// addressed by their offset delta = j - i, so that where a tile's rows share their offsets
// (every row of a band away from the sequence's ends) each multiply-add computes kTileRows
// allowed entries, with no horizontal sums and no scatter (issue 36, item 2). With lse from
// the forward and D_i = rowsum(dO' * O) (FlashAttention-2, Dao 2023, Algorithm 2):
//   query lanes, a tile of rows i0 + u:  S[delta][u] = sum_d qT[d][u] kT[d][i0 + u + delta],
//     dP~ likewise from dO'T and vT, P = exp(S - lse), dS = P (dP~ - D_i),
//     dQT[d][u] = sum_delta dS[delta][u] kT[d][i0 + u + delta];
//   key lanes, a tile of keys j0 + l:  dKT[d][l] = sum_delta dS[delta][q] qT[d][q] and
//     dVT[e][l] = sum_delta P[delta][q] dO'T[e][q] at q = j0 + l - delta, the query block's dS
//     and P kept by offset and query (a contiguous run of queries for each offset), so that
//     each key's dK and dV row is summed in registers and added to dk, dv once a block.
// kT, vT are the thread's padded transposed keys and values (offset_path.h's offset_ready), S
// and dP~ offset_path.h's offset_scores; each query tile's qT and dO'T are also copied into the
// block's rows qT, dOT (zero outside the offset tiles), so that a key tile reads whole vectors
// and entries past the block contribute 0.
// Plain scores only (no score functions, dense masks, bias or dropout: `plain_scores`); rows
// whose tile does not share its offsets (a window's clipped ends, a partial tile, a row that
// sees nothing) keep the row path (backward_block.h's offset_rows).
//
// Legend: kBandKeys the widest row of an offset block; offset_env, offset_switch the
// environment's switch; offsets_fit whether a call may take the path; shared_offsets a
// tile's offsets [dlo, dhi); OffsetBlock a block's buffers and layout (pad P, row length L),
// offset_start, offset_zero; pair_dots two query tiles' scores; tile_operands, tile_grads a
// query tile's qT, dO'T and its P, dS; query_tiles one or two query tiles; key_tiles the key
// lanes (offset_sums.h's sums over offsets and key_lanes).

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "args.h"
#include "offset_path.h"
#include "offset_sums.h"
#include "row_path.h"
#include "scratch.h"
#include "score_mods.h"
#include "softmax_row.h"
#include "tile_path.h"
#include "transposed.h"

namespace {

// The widest row of a backward block on the offset path (plain scores); other calls keep the
// row path's kRowPathKeysBackward.
constexpr int64_t kBandKeys = 64;
static_assert(kBandKeys <= kRowStrideBackward, "the row path takes the clipped rows");
static_assert(kBandKeys <= kOffsetRunKeys, "a band's tile is one run of offset_path.h's");

// Measured (AMD EPYC Zen 4, loaded shared machine, 1 thread, N=4096, H=8, D=64, backward
// alone, fastest of 9-11 interleaved rounds, `benchmarks/bench_offset_backward.py --min`, this
// path / the blocks, four runs): windows of 33, 47 and 63 keys 0.90-0.97x, 0.87-0.94x and
// 0.95-1.01x with 128-row query blocks (21.3 / 23.6, 25.3 / 29.0, 30.6 / 32.2 ms; 256-row
// blocks measured 0.92x, 0.88x, 0.91x once: within the noise); windows of 9 and 17 keys
// 1.6-1.8x and 1.4-1.7x the row path's time, so the row path keeps those
// (kRowPathKeysBackward). With the query blocks the forward's cost model chooses for windows
// (16-64 rows) the path was 1.1-2x slower: its key tiles sum (bq + w - 1) / bq of the block's
// share, and the set-up (transposing the block's rows, zeroing its buffers) is paid per block
// (hence 128-row blocks for bands: attnkit/functional/_grid.py's backward_query_block).
// Microbenchmark of the products alone, in cache (W=33, 32 rows): 3.7 FMA/ns the query tiles,
// 4.9 the key tiles, against 7.2 for independent register FMAs (two 256-bit FMAs a cycle).
//
// The AVX2 build (x86-64-v3 on the same machine, kPairDims' note) took 1.03-1.30x the blocks'
// time at windows of 33-63 keys: there the path is off unless asked for.
//
// ATTNKIT_OFFSET_BACKWARD: unset, the default routing (AVX-512 builds: bands wider than the row
// path's rows; others: none); "1" every block that fits (narrow windows too: the tests' way to
// reach the path at small sizes), "0" none, and the query blocks as before
// (attnkit/functional/_grid.py's offset_bands). Read at each block: a benchmark may switch it
// between calls.
#if defined(__AVX512F__)
constexpr int kOffsetDefault = -1;
#else
constexpr int kOffsetDefault = 0;
#endif

// The switch as set: 1, 0, or -1 (unset, or another value).
inline int offset_env() {
    const char* on = std::getenv("ATTNKIT_OFFSET_BACKWARD");
    if (!on || !on[0] || on[1]) return -1;
    return on[0] == '1' ? 1 : on[0] == '0' ? 0 : -1;
}

inline int offset_switch() {
    const int on = offset_env();
    return on == -1 ? kOffsetDefault : on;
}

// Whether a call's backward may take the offset path: plain scores, rows of one run (no
// tiles), and the sequence's keys and values fit padded caches.
inline bool offsets_fit(const Args& a) {
    return plain_scores(a) && !a.table && a.rows_k <= 1 &&
           offset_cacheable(a, std::max(a.D, a.Dv));
}

// The offsets [dlo, dhi) that rows i..i+7 share (row u's keys [lo[u], hi[u]) = i + u + [dlo,
// dhi)); false where the tile has fewer rows, the rows' offsets differ or are empty, or a row
// saw nothing in the forward (lse -inf).
inline bool shared_offsets(const int64_t* lo, const int64_t* hi, int64_t i, int64_t n,
                           const float* lse, int64_t& dlo, int64_t& dhi) {
    if (n < kTileRows) return false;
    dlo = lo[0] - i, dhi = hi[0] - i;
    if (dlo >= dhi) return false;
    for (int64_t u = 0; u < kTileRows; ++u) {
        if (lo[u] - i - u != dlo || hi[u] - i - u != dhi || lse[u] == kNegInf) return false;
    }
    return true;
}

// One query block's offset-path buffers, column P + t for query i0 + t, L floats a row:
// qT (D rows), dOT (Dv rows), P and dS (a row per offset dlo + c), zero outside the offset
// tiles; two tiles' qT and dO'T (dims x kTileRows, the products' operands), S, dP~ and dS
// (key-major), and dQT or dKT / dVT (dims x kTileRows).
struct OffsetBlock {
    int64_t dlo = 0, W = 0, P = 0, L = 0, nq = 0;
    std::vector<float> qT, doT, p, ds, tq, tdo, s, dp, dst, acc;
};

inline OffsetBlock& offset_block() {
    thread_local OffsetBlock ob;
    return ob;
}

// Columns [c0, c1) of the block's rows (qT, dOT, P, dS) to 0.
inline void offset_zero(const Args& a, OffsetBlock& ob, int64_t c0, int64_t c1) {
    for (std::vector<float>* buf : {&ob.qT, &ob.doT, &ob.p, &ob.ds}) {
        const int64_t rows = buf == &ob.qT ? a.D : buf == &ob.doT ? a.Dv : ob.W;
        float* row = buf->data();
        for (int64_t r = 0; r < rows; ++r, row += ob.L) std::fill(row + c0, row + c1, 0.0f);
    }
}

// Sets up the buffers of a block of nq queries whose offset tiles share [dlo, dlo + W): the
// columns outside the queries zeroed (each tile writes its own, or offset_zero: zeroing the
// whole rows was ~270 KB of stores a 128-row block at W = 63).
inline void offset_start(const Args& a, OffsetBlock& ob, int64_t nq, int64_t dlo, int64_t W) {
    ob.dlo = dlo, ob.W = W, ob.nq = nq;
    ob.P = ceil_div(W, kTileRows) * kTileRows;  // key lanes read W - 1 columns before query 0
    ob.L = 2 * ob.P + ceil_div(nq, kTileRows) * kTileRows + kTileRows;
    const int64_t dims = ceil_div(std::max(a.D, a.Dv), kDimBlock) * kDimBlock;  // transpose_q's
    ob.qT.resize(a.D * ob.L);
    ob.doT.resize(a.Dv * ob.L);
    ob.p.resize(W * ob.L);
    ob.ds.resize(W * ob.L);
    offset_zero(a, ob, 0, ob.P);
    offset_zero(a, ob, ob.P + nq, ob.L);
    for (std::vector<float>* buf : {&ob.tq, &ob.tdo, &ob.acc}) buf->resize(2 * dims * kTileRows);
    for (std::vector<float>* buf : {&ob.s, &ob.dp, &ob.dst}) buf->resize(2 * W * kTileRows);
}

// The widest chunk of offsets pair_dots keeps in registers for each of its two tiles (with
// the two x vectors and a load: 19 of AVX-512's 32 vector registers, 11 of AVX2's 16).
#if defined(__AVX512F__)
constexpr int kPairChunk = 8;
#else
constexpr int kPairChunk = 4;
#endif

// Scores of two query tiles side by side (rows t..t+7 and t+8..t+15: x_a, x_b their x^T,
// dims x kTileRows) against the padded cache y (tile a's key of offset 0, rows ldt apart),
// offsets m0..m0+C of y: tile a's offset m, tile b's m - 8, so that each load of y feeds both
// (offset_path.h's offset_scores, one tile: a load a multiply-add, unaligned). Into s_a, s_b
// (key-major, W offsets each) where in range.
template <int C>
inline void pair_dots(const float* x_a, const float* x_b, int64_t dims, const float* y,
                      int64_t ldt, int64_t m0, int64_t W, float* s_a, float* s_b) {
    tvec aa[C], ab[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) aa[c] = ab[c] = tvec{};
    for (int64_t d = 0; d < dims; ++d) {
        const tvec xa = tload(x_a + d * kTileRows), xb = tload(x_b + d * kTileRows);
        const float* yd = y + d * ldt + m0;
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
            tvec yv = tload(yd + c);
            asm("" : "+v"(yv));  // one load for both (gcc folds it into each multiply-add)
            aa[c] += xa * yv;
            ab[c] += xb * yv;
        }
    }
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
        const int64_t m = m0 + c;
        if (m < W) tstore(s_a + m * kTileRows, aa[c]);
        if (m >= kTileRows && m < W + kTileRows) tstore(s_b + (m - kTileRows) * kTileRows, ab[c]);
    }
}

// pair_dots over offsets 0..W+8 of y, in chunks of kPairChunk (the last one overlapping the
// one before: the same sums again, not a narrower chunk's longer chains).
inline void pair_dots_all(const float* x_a, const float* x_b, int64_t dims, const float* y,
                          int64_t ldt, int64_t W, float* s_a, float* s_b) {
    const int64_t M = W + kTileRows;  // >= kPairChunk
    for (int64_t m0 = 0; m0 < M; m0 += kPairChunk) {
        pair_dots<kPairChunk>(x_a, x_b, dims, y, ldt, std::min(m0, M - kPairChunk), W, s_a, s_b);
    }
}

// Tile t's qT and dO'T (n rows qs, dob, D and Dv apart; lanes from n on 0) into tq, tdo and
// the block's rows.
inline void tile_operands(const Args& a, OffsetBlock& ob, int64_t t, const float* qs,
                          const float* dob, float* tq, float* tdo, int64_t n = kTileRows) {
    const int64_t L = ob.L, col = ob.P + t;
    transpose_q(qs, n, a.D, ceil_div(a.D, kDimBlock), tq);
    transpose_q(dob, n, a.Dv, ceil_div(a.Dv, kDimBlock), tdo);
    for (int64_t d = 0; d < a.D; ++d) tstore(ob.qT.data() + d * L + col, tload(tq + d * kTileRows));
    for (int64_t e = 0; e < a.Dv; ++e) {
        tstore(ob.doT.data() + e * L + col, tload(tdo + e * kTileRows));
    }
}

// Tile t's P = exp(S - lse) and dS = P (dP~ - D_i) lane by lane (Algorithm 2, lines 11 and 13:
// softmax_row.h's grad_row) from its S and dP~ (key-major), into the block's rows and ds.
inline void tile_grads(OffsetBlock& ob, int64_t t, const float* s, const float* dp,
                       const float* lse, const float* di, float* ds) {
    const int64_t L = ob.L, col = ob.P + t;
    const tvec lv = tload(lse), dv = tload(di);
    for (int64_t c = 0; c < ob.W; ++c) {
        const tvec p = texp(tload(s + c * kTileRows) - lv);
        const tvec g = p * (tload(dp + c * kTileRows) - dv);
        tstore(ob.p.data() + c * L + col, p);
        tstore(ob.ds.data() + c * L + col, g);
        tstore(ds + c * kTileRows, g);
    }
}

// The query tiles at block rows t.. (one, or two side by side: `pair`; pre-scaled rows qs, dO'
// rows dob, D and Dv apart), whose offsets are the block's (`ot`: the first tile's): S and dP~
// against the padded caches kT, vT (key 0's column, rows ldt apart), P and dS into the block's
// rows, dQ (unscaled, D floats a row) into dq.
inline void query_tiles(const Args& a, OffsetBlock& ob, const OffsetTile& ot, int64_t t,
                        bool pair, const float* qs, const float* dob, const float* kT,
                        const float* vT, int64_t ldt, const float* lse, const float* di,
                        float* dq) {
    const int64_t W = ob.W, D = a.D, Dv = a.Dv, n = pair ? 2 : 1;
    const int64_t dims = ceil_div(std::max(D, Dv), kDimBlock) * kDimBlock;
    float *s = ob.s.data(), *dp = ob.dp.data(), *ds = ob.dst.data();
    float *tq = ob.tq.data(), *tdo = ob.tdo.data(), *acc = ob.acc.data();
    for (int64_t k = 0; k < n; ++k) {
        tile_operands(a, ob, t + k * kTileRows, qs + k * kTileRows * D, dob + k * kTileRows * Dv,
                      tq + k * dims * kTileRows, tdo + k * dims * kTileRows);
    }
    const float* kt = kT + ot.i + ob.dlo;  // lane 0's key of offset dlo (tile t)
    const float* vt = vT + ot.i + ob.dlo;
    const int64_t tile = W * kTileRows, second = dims * kTileRows;
    if (pair) {
        pair_dots_all(tq, tq + second, D, kt, ldt, W, s, s + tile);     // S = (scale q) k^T
        pair_dots_all(tdo, tdo + second, Dv, vt, ldt, W, dp, dp + tile);  // dP~ = dO' v^T
    } else {
        offset_scores(tq, D, kT, ldt, ot, s);
        offset_scores(tdo, Dv, vT, ldt, ot, dp);
    }
    for (int64_t k = 0; k < n; ++k) {
        tile_grads(ob, t + k * kTileRows, s + k * tile, dp + k * tile, lse + k * kTileRows,
                   di + k * kTileRows, ds + k * tile);
    }
    if (pair) {  // dQT = dS kT: tile t + 8's offset m is tile t's m + 8
        offset_sum_pair_all(ds, ds + tile, kTileRows, {0, W}, {0, W}, kt, ldt, 1, D, acc,
                            acc + second);
    } else {
        offset_sum_all(ds, kTileRows, W, kt, ldt, 1, D, acc);
    }
    for (int64_t k = 0; k < n; ++k) {
        transpose_keys(acc + k * second, kTileRows, D, kTileRows, dq + k * kTileRows * D, D);
    }
}

// The key lanes of the block's one run of offsets (offset_sums.h's key_lanes): keys [i0 + dlo,
// i0 + nq - 1 + dlo + W) from the block's dS, P, qT and dOT rows.
inline void key_tiles(const Args& a, OffsetBlock& ob, int64_t i0, int64_t first, int64_t end,
                      float* dk_acc, float* dv_acc, int64_t step) {
    const int64_t P = ob.P;
    const KeyRows r{ob.ds.data() + P, ob.p.data() + P, ob.qT.data() + P, ob.doT.data() + P,
                    ob.L, ob.L, ob.W, i0 + ob.dlo, ob.nq + ob.W - 1};
    float* acc = ob.acc.data();
    key_lanes(a, r, first, end, acc, acc + std::max(a.D, a.Dv) * kTileRows, dk_acc, dv_acc, step);
}

}  // namespace
