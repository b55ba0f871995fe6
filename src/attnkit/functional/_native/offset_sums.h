// The offset paths' sums over offsets (offset_backward.h: bands; offset_runs.h: rows of several
// runs), kTileRows lanes at once: a query tile's dQT over its offsets, and the key lanes'
// dKT, dVT over the offsets of the queries that see them, from P and dS kept by offset and
// query (a contiguous run of queries for each offset, so that key lane l's query at offset
// dlo + c lies c columns before its own: a diagonal of the rows, ys = -1).
//
// Legend: offset_sum a sum over offsets, kTileRows lanes and a few dimensions at once,
// offset_sum_all every dimension; offset_sum_pair two tiles' at once, offset_sum_pair_all;
// add_key_rows a key tile's sums into dk or dv rows; KeyRows one run of offsets' P and dS
// rows and the queries' qT, dOT rows; key_lanes their key tiles.

#pragma once

#include <algorithm>
#include <cstdint>

#include "args.h"
#include "simd.h"
#include "tile_path.h"

namespace {

using namespace attnkit_simd;

// out[d * kTileRows + u] = sum over c < W of w[c * ws + u] y[d * ldy + c * ys + u], d < Dc:
// Dc dimensions' sums over the offsets in registers (dQT over a query tile's offsets; dKT,
// dVT over a key tile's, whose queries run backwards: ys = -1).
template <int Dc>
inline void offset_sum(const float* w, int64_t ws, int64_t W, const float* y, int64_t ldy,
                       int64_t ys, float* out) {
    tvec acc[Dc];
#pragma GCC unroll 16
    for (int d = 0; d < Dc; ++d) acc[d] = tvec{};
    for (int64_t c = 0; c < W; ++c) {
        const tvec s = tload(w + c * ws);
        const float* yc = y + c * ys;
#pragma GCC unroll 16
        for (int d = 0; d < Dc; ++d) acc[d] += s * tload(yc + d * ldy);
    }
#pragma GCC unroll 16
    for (int d = 0; d < Dc; ++d) tstore(out + d * kTileRows, acc[d]);
}

// offset_sum over every dimension d < dims, in chunks of 8, 4 and 1: each of a chunk's rows of
// y is one more address register in the loop, and 16 of them spilled the loop's pointers to
// the stack (perf: the loop waiting on their reloads).
inline void offset_sum_all(const float* w, int64_t ws, int64_t W, const float* y, int64_t ldy,
                           int64_t ys, int64_t dims, float* out) {
    int64_t d = 0;
    for (; d + 8 <= dims; d += 8) {
        offset_sum<8>(w, ws, W, y + d * ldy, ldy, ys, out + d * kTileRows);
    }
    if (d + 4 <= dims) offset_sum<4>(w, ws, W, y + d * ldy, ldy, ys, out + d * kTileRows), d += 4;
    for (; d < dims; ++d) offset_sum<1>(w, ws, W, y + d * ldy, ldy, ys, out + d * kTileRows);
}

// The offsets [lo, hi) of a tile's sum that may add anything (the others' weights are 0).
struct Offsets {
    int64_t lo, hi;
};

// Two tiles' offset_sum at once, where one's operand rows run kTileRows floats behind the
// other's: y + m * ys is the early tile's offset m (in e) and the late tile's offset
// m - kTileRows (in l; e.lo <= l.lo + kTileRows, e.hi <= l.hi + kTileRows) (two key tiles
// side by side; two query tiles), so that each load of y feeds two multiply-adds
// (offset_sum: one; its loads, unaligned and half of them across two cache lines, held it to
// ~1 FMA a cycle in cache, AMD EPYC Zen 4).
template <int Dc>
inline void offset_sum_pair(const float* w_early, const float* w_late, int64_t ws, Offsets e,
                            Offsets l, const float* y, int64_t ldy, int64_t ys, float* out_early,
                            float* out_late) {
    tvec ae[Dc], al[Dc];
#pragma GCC unroll 16
    for (int d = 0; d < Dc; ++d) ae[d] = al[d] = tvec{};
    const int64_t both = std::min(e.hi, l.lo + kTileRows);
    for (int64_t m = e.lo; m < both; ++m) {  // the early tile alone
        const tvec s = tload(w_early + m * ws);
        const float* ym = y + m * ys;
#pragma GCC unroll 16
        for (int d = 0; d < Dc; ++d) ae[d] += s * tload(ym + d * ldy);
    }
    for (int64_t m = std::max(e.lo, l.lo + kTileRows); m < e.hi; ++m) {  // both
        const tvec se = tload(w_early + m * ws), sl = tload(w_late + (m - kTileRows) * ws);
        const float* ym = y + m * ys;
#pragma GCC unroll 16
        for (int d = 0; d < Dc; ++d) {
            tvec yv = tload(ym + d * ldy);
            // in a register: gcc otherwise folds the load into both multiply-adds (two loads)
            asm("" : "+v"(yv));
            ae[d] += se * yv;
            al[d] += sl * yv;
        }
    }
    for (int64_t m = std::max(e.hi, l.lo + kTileRows); m < l.hi + kTileRows; ++m) {  // late
        const tvec s = tload(w_late + (m - kTileRows) * ws);
        const float* ym = y + m * ys;
#pragma GCC unroll 16
        for (int d = 0; d < Dc; ++d) al[d] += s * tload(ym + d * ldy);
    }
#pragma GCC unroll 16
    for (int d = 0; d < Dc; ++d) {
        tstore(out_early + d * kTileRows, ae[d]);
        tstore(out_late + d * kTileRows, al[d]);
    }
}

// The dimensions offset_sum_pair sums at once: two tiles' accumulators, two weights and a load
// are 19 vector registers, within AVX-512's 32; on AVX2's 16 some spill, yet 4 dimensions a
// chunk (11 registers) measured no faster (windows of 33-63 keys, 1.05-1.30x the blocks' time
// against 1.03-1.19x with 8).
constexpr int kPairDims = 8;

// offset_sum_pair over every dimension d < dims (chunks of kPairDims, 4, 1).
inline void offset_sum_pair_all(const float* w_early, const float* w_late, int64_t ws,
                                Offsets e, Offsets l, const float* y, int64_t ldy, int64_t ys,
                                int64_t dims, float* out_early, float* out_late) {
    int64_t d = 0;
    auto at = [&](int64_t d0) { return d0 * kTileRows; };
    for (; d + kPairDims <= dims; d += kPairDims) {
        offset_sum_pair<kPairDims>(w_early, w_late, ws, e, l, y + d * ldy, ldy, ys,
                                   out_early + at(d), out_late + at(d));
    }
    if (kPairDims > 4 && d + 4 <= dims) {
        offset_sum_pair<4>(w_early, w_late, ws, e, l, y + d * ldy, ldy, ys, out_early + at(d),
                           out_late + at(d));
        d += 4;
    }
    for (; d < dims; ++d) {
        offset_sum_pair<1>(w_early, w_late, ws, e, l, y + d * ldy, ldy, ys, out_early + at(d),
                           out_late + at(d));
    }
}


// Adds keys [lo, hi) of the key tile j0 (acc: dims x kTileRows, lane l key j0 + l) to their
// rows of dk or dv (position j at acc_out + j * ld), transposed in registers where the whole
// tile is added (a transposition into a buffer and a reload, 512-bit loads of 256-bit stores,
// waits on store forwarding).
inline void add_key_rows(const float* acc, int64_t dims, int64_t j0, int64_t lo, int64_t hi,
                         float* acc_out, int64_t ld) {
    int64_t d = 0;
#if defined(__AVX__)
    if (lo == j0 && hi == j0 + kTileRows) {
        for (; d + 8 <= dims; d += 8) {
            transpose8<true>(acc + d * kTileRows, kTileRows, acc_out + j0 * ld + d, ld);
        }
    }
#endif
    for (int64_t j = lo; j < hi; ++j) {
        float* dst = acc_out + j * ld;
        for (int64_t e = d; e < dims; ++e) dst[e] += acc[e * kTileRows + (j - j0)];
    }
}

// One run of offsets [dlo, dlo + W) of consecutive queries, laid out for the key lanes: P and dS
// rows (row c: offset dlo + c, ld floats apart) and the queries' qT, dOT rows (ldy apart),
// each pointer at the column of the first query, its query c at column c, zero at columns
// of queries that do not see the run (W - 1 before the first at least, and 16 past the
// last of key tile keys - 1); keys j_first .. j_first + keys see it.
struct KeyRows {
    const float *ds, *p, *qT, *doT;
    int64_t ld, ldy, W, j_first, keys;
};

// Key lanes: for each tile of 8 keys of r's [j_first, j_first + keys), dKT and dVT summed over
// the offsets from r's dS, P, qT and dOT, transposed back and added to the rows of dk_acc,
// dv_acc (position j at row j * step) of the keys in [first, end) (the block's key span: a
// slot holds no others). acc, acc2: two tiles' sums (max(D, Dv) x kTileRows each).
inline void key_lanes(const Args& a, const KeyRows& r, int64_t first, int64_t end, float* acc,
                      float* acc2, float* dk_acc, float* dv_acc, int64_t step) {
    const int64_t W = r.W, keys = r.keys, j_first = r.j_first;
    // key c0 + l of the tile meets query c0 + l - c at offset dlo + c: along a diagonal of the
    // P, dS rows (c * ld + col - c) and backwards in qT, dOT
    const struct {
        const float *w, *y;
        int64_t dims;
        float* acc;
    } parts[2] = {{r.ds, r.qT, a.D, dk_acc}, {r.p, r.doT, a.Dv, dv_acc}};
    auto span = [&](int64_t c0, int64_t& lo, int64_t& hi) {  // the tile's keys to add
        lo = std::max(j_first + c0, first);
        hi = std::min({j_first + c0 + kTileRows, end, j_first + keys});
        return lo < hi;
    };
    // the offsets at which key tile c0 meets a query of the run (c0 + l - m in [0, queries)):
    // a run's first and last W - 1 keys meet fewer (15 x 15 on 64 x 64: 103 offsets of 120)
    const int64_t queries = keys - W + 1;
    auto offsets = [&](int64_t c0) {
        return Offsets{std::max<int64_t>(0, c0 - queries + 1), std::min(W, c0 + kTileRows)};
    };
    for (int64_t c0 = 0; c0 < keys; c0 += 2 * kTileRows) {  // two key tiles at once
        int64_t lo, hi, lo2, hi2;
        const bool one = span(c0, lo, hi);
        const bool two = c0 + kTileRows < keys && span(c0 + kTileRows, lo2, hi2);
        for (const auto& part : parts) {
            if (two) {  // early: the second tile (offset m at column c0 + 8 - m)
                offset_sum_pair_all(part.w + c0 + kTileRows, part.w + c0, r.ld - 1,
                                    offsets(c0 + kTileRows), offsets(c0),
                                    part.y + c0 + kTileRows, r.ldy, -1, part.dims, acc2, acc);
                add_key_rows(acc2, part.dims, j_first + c0 + kTileRows, lo2, hi2, part.acc,
                             part.dims * step);
            } else {
                const Offsets o = offsets(c0);  // from offset o.lo on
                offset_sum_all(part.w + c0 + o.lo * (r.ld - 1), r.ld - 1, o.hi - o.lo,
                               part.y + c0 - o.lo, r.ldy, -1, part.dims, acc);
            }
            if (one) add_key_rows(acc, part.dims, j_first + c0, lo, hi, part.acc, part.dims * step);
        }
    }
}

}  // namespace
