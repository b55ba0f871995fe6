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
// Legend: kBandKeys the widest row of an offset block; offsets_fit whether a call may take the
// path; shared_offsets a tile's offsets [dlo, dhi); OffsetBlock a block's buffers and layout
// (pad P, row length L); offset_sum a sum over offsets, kTileRows lanes and a few dimensions
// at once; query_tile one query tile; add_key_rows a key tile's sums into dk or dv rows;
// key_tiles the key lanes.

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "args.h"
#include "row_path.h"
#include "scratch.h"
#include "score_mods.h"
#include "softmax_row.h"
#include "tile_path.h"
#include "offset_path.h"
#include "transposed.h"

namespace {

// The widest row of a backward block on the offset path (plain scores); other calls keep the
// row path's kRowPathKeysBackward.
constexpr int64_t kBandKeys = 64;
static_assert(kBandKeys <= kRowStrideBackward, "the row path takes the clipped rows");
static_assert(kBandKeys <= kOffsetRunKeys, "a band's tile is one run of offset_path.h's");

// The path is off unless ATTNKIT_OFFSET_BACKWARD=1 (read at each block: tests switch it within
// a process): as it stands it is slower than the row path and the blocks it replaces.
// Measured (AMD EPYC Zen 4, shared machine, 1 thread, N=4096, H=8, D=64, backward alone, CPU
// time, fastest of 9-15 rounds interleaved with the kernel without the path, /tmp/offab.py of
// the s24-offbwd report): windows of 9, 17, 33, 47 and 63 keys 8.6 -> 15.9, 11.5 -> 19.7,
// 23.9 -> 28.1, 28.7 -> 39.5 and 32.4 -> 53.6 ms. Where the time went (window 33, parts of the
// path switched off): ~8.5 ms outside the products (the block's preamble, the transposition
// of k and v into the thread's caches ~3 ms at a window of 9), ~8 ms the query tiles, ~13 ms
// the key tiles, against ~6 ms for all of the products at 2 FMAs a cycle; perf puts the key
// tiles' time on their loop of 8 FMAs with memory operands (rows of qT L floats apart) and
// on the adds of their sums into dk, dv rows (cache misses).
inline bool offsets_enabled() {
    const char* on = std::getenv("ATTNKIT_OFFSET_BACKWARD");
    return on && on[0] == '1' && on[1] == 0;
}

// Whether a call's backward may take the offset path: switched on (offsets_enabled), plain
// scores, rows of one run (no tiles), and the sequence's keys and values fit padded caches.
inline bool offsets_fit(const Args& a) {
    return offsets_enabled() && plain_scores(a) && !a.table && a.rows_k <= 1 &&
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
// tiles; a tile's qT and dO'T (dims x kTileRows, offset_scores' operands), S, dP~ and dS
// (key-major), and dQT or dKT / dVT (dims x kTileRows).
struct OffsetBlock {
    int64_t dlo = 0, W = 0, P = 0, L = 0, nq = 0;
    std::vector<float> qT, doT, p, ds, tq, tdo, s, dp, dst, acc;
};

inline OffsetBlock& offset_block() {
    thread_local OffsetBlock ob;
    return ob;
}

// Sets up the (zeroed) buffers of a block of nq queries whose offset tiles share [dlo, dlo + W).
inline void offset_start(const Args& a, OffsetBlock& ob, int64_t nq, int64_t dlo, int64_t W) {
    ob.dlo = dlo, ob.W = W, ob.nq = nq;
    ob.P = ceil_div(W, kTileRows) * kTileRows;  // key lanes read W - 1 columns before query 0
    ob.L = 2 * ob.P + ceil_div(nq, kTileRows) * kTileRows + kTileRows;
    const int64_t dims = ceil_div(std::max(a.D, a.Dv), kDimBlock) * kDimBlock;  // transpose_q's
    ob.qT.assign(a.D * ob.L, 0.0f);
    ob.doT.assign(a.Dv * ob.L, 0.0f);
    ob.p.assign(W * ob.L, 0.0f);
    ob.ds.assign(W * ob.L, 0.0f);
    for (std::vector<float>* buf : {&ob.tq, &ob.tdo, &ob.acc}) buf->resize(dims * kTileRows);
    for (std::vector<float>* buf : {&ob.s, &ob.dp, &ob.dst}) buf->resize(W * kTileRows);
}

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
    for (; d + 8 <= dims; d += 8) offset_sum<8>(w, ws, W, y + d * ldy, ldy, ys, out + d * kTileRows);
    if (d + 4 <= dims) offset_sum<4>(w, ws, W, y + d * ldy, ldy, ys, out + d * kTileRows), d += 4;
    for (; d < dims; ++d) offset_sum<1>(w, ws, W, y + d * ldy, ldy, ys, out + d * kTileRows);
}

// The query tile at block row t (rows i0 + t + u, u < kTileRows; pre-scaled rows qs, dO' rows
// dob, D and Dv apart), whose offsets `ot` are the block's: S and dP~ against the padded
// caches kT, vT (key 0's column, rows ldt apart), P and dS lane by lane into the block's rows,
// dQ (unscaled, D floats a row) into dq; its qT and dO'T into the block's rows.
inline void query_tile(const Args& a, OffsetBlock& ob, const OffsetTile& ot, int64_t t,
                       const float* qs, const float* dob, const float* kT, const float* vT,
                       int64_t ldt, const float* lse, const float* di, float* dq) {
    const int64_t W = ob.W, L = ob.L, col = ob.P + t;
    const int64_t dims_q = ceil_div(a.D, kDimBlock), dims_o = ceil_div(a.Dv, kDimBlock);
    float *s = ob.s.data(), *dp = ob.dp.data(), *ds = ob.dst.data();
    float *tq = ob.tq.data(), *tdo = ob.tdo.data();
    transpose_q(qs, kTileRows, a.D, dims_q, tq);
    transpose_q(dob, kTileRows, a.Dv, dims_o, tdo);
    for (int64_t d = 0; d < a.D; ++d) tstore(ob.qT.data() + d * L + col, tload(tq + d * kTileRows));
    for (int64_t e = 0; e < a.Dv; ++e) {
        tstore(ob.doT.data() + e * L + col, tload(tdo + e * kTileRows));
    }
    offset_scores(tq, a.D, kT, ldt, ot, s);    // S = (scale q) k^T
    offset_scores(tdo, a.Dv, vT, ldt, ot, dp);  // dP~ = dO' v^T
    const tvec lv = tload(lse), dv = tload(di);
    for (int64_t c = 0; c < W; ++c) {  // Algorithm 2, lines 11 and 13 (softmax_row.h's grad_row)
        const tvec p = texp(tload(s + c * kTileRows) - lv);
        const tvec g = p * (tload(dp + c * kTileRows) - dv);
        tstore(ob.p.data() + c * L + col, p);
        tstore(ob.ds.data() + c * L + col, g);
        tstore(ds + c * kTileRows, g);
    }
    const float* kt = kT + ot.i + ob.dlo;  // lane 0's key of offset dlo
    offset_sum_all(ds, kTileRows, W, kt, ldt, 1, a.D, ob.acc.data());  // dQT = dS kT
    transpose_keys(ob.acc.data(), kTileRows, a.D, kTileRows, dq, a.D);
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

// Key lanes: for each tile of 8 keys of the block's [i0 + dlo, i0 + nq - 1 + dlo + W), dKT and
// dVT summed over the offsets from the block's dS, P, qT and dOT, transposed back and added to
// the rows of dk_acc, dv_acc (position j at row j * step) of the keys in [first, end) (the
// block's key span: a slot holds no others).
inline void key_tiles(const Args& a, OffsetBlock& ob, int64_t i0, int64_t first, int64_t end,
                      float* dk_acc, float* dv_acc, int64_t step) {
    const int64_t W = ob.W, L = ob.L, keys = ob.nq + W - 1, j_first = i0 + ob.dlo;
    // key c0 + l of the tile meets query c0 + l - c at offset dlo + c: along a diagonal of the
    // block's rows (c * L + col - c) and backwards in qT, dOT
    const struct {
        const float *w, *y;
        int64_t dims;
        float* acc;
    } parts[2] = {{ob.ds.data(), ob.qT.data(), a.D, dk_acc}, {ob.p.data(), ob.doT.data(), a.Dv, dv_acc}};
    for (int64_t c0 = 0; c0 < keys; c0 += kTileRows) {
        const int64_t col = ob.P + c0, j0 = j_first + c0;
        const int64_t lo = std::max(j0, first), hi = std::min({j0 + kTileRows, end, j_first + keys});
        if (lo >= hi) continue;
        for (const auto& part : parts) {
            offset_sum_all(part.w + col, L - 1, W, part.y + col, L, -1, part.dims, ob.acc.data());
            add_key_rows(ob.acc.data(), part.dims, j0, lo, hi, part.acc, part.dims * step);
        }
    }
}

}  // namespace
