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
// kT, vT are the thread's transposed keys and values (transposed.h); the block's queries and
// dO' rows are transposed once into qT and dOT, zero outside the block's offset tiles, so that
// a key tile reads whole vectors and entries past the block contribute 0.
// Plain scores only (no score functions, dense masks, bias or dropout: `plain_scores`); rows
// whose tile does not share its offsets (a window's clipped ends, a partial tile, a row that
// sees nothing) keep the row path (backward_block.h's offset_rows).
//
// Legend: kOffsetKeys the widest row of an offset block; offsets_fit whether a call may take
// the path; shared_offsets a tile's offsets [dlo, dhi); OffsetBlock a block's buffers and
// layout (pad P, row length L); offset_dots C offsets' scores of a tile; offset_sum a sum over
// offsets, kTileRows lanes and a few dimensions at once; offset_tile one query tile;
// offset_keys the key lanes and the adds into dk, dv.

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
#include "transposed.h"

namespace {

// The widest row of a backward block on the offset path (plain scores); other calls keep the
// row path's kRowPathKeysBackward.
constexpr int64_t kOffsetKeys = 64;

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
static_assert(kOffsetKeys <= kRowStrideBackward, "the row path takes the clipped rows");

// Whether a call's backward may take the offset path: plain scores, rows of one run (no
// tiles), and the sequence's keys and values fit the thread's transposed caches.
inline bool offsets_fit(const Args& a) {
    return offsets_enabled() && plain_scores(a) && !a.table && a.rows_k <= 1 &&
           transposed_ld(a) * std::max(a.D, a.Dv) <= kMaxTransposed;
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
// tiles; and a tile's S, dP~ and dS (key-major), dQT or dKT / dVT (dims x kTileRows).
struct OffsetBlock {
    int64_t dlo = 0, W = 0, P = 0, L = 0, nq = 0;
    std::vector<float> qT, doT, p, ds, s, dp, dst, acc;
};

inline OffsetBlock& offset_block() {
    thread_local OffsetBlock ob;
    return ob;
}

// Sets up the buffers of a block of nq queries (pre-scaled rows qs, dO' rows dob) whose
// offset tiles share [dlo, dlo + W): the queries and dO' rows transposed.
inline void offset_start(const Args& a, OffsetBlock& ob, int64_t nq, int64_t dlo, int64_t W,
                         const float* qs, const float* dob) {
    ob.dlo = dlo, ob.W = W, ob.nq = nq;
    ob.P = ceil_div(W, kTileRows) * kTileRows;  // key lanes read W - 1 columns before query 0
    ob.L = 2 * ob.P + ceil_div(nq, kTileRows) * kTileRows + kTileRows;
    const size_t cols = static_cast<size_t>(ob.L), dims = static_cast<size_t>(std::max(a.D, a.Dv));
    for (std::vector<float>* buf : {&ob.qT, &ob.doT, &ob.p, &ob.ds}) {
        const int64_t rows = buf == &ob.qT ? a.D : buf == &ob.doT ? a.Dv : W;
        buf->resize(rows * cols);
        for (int64_t d = 0; d < rows; ++d) {  // the pads (qT, dOT: the rows come next)
            float* row = buf->data() + d * ob.L;
            const bool whole = buf == &ob.p || buf == &ob.ds;
            std::fill(row, row + (whole ? ob.L : ob.P), 0.0f);
            if (!whole) std::fill(row + ob.P + nq, row + ob.L, 0.0f);
        }
    }
    for (std::vector<float>* buf : {&ob.s, &ob.dp, &ob.dst}) buf->resize(W * kTileRows);
    ob.acc.resize(dims * kTileRows);
    transpose_keys(qs, a.D, nq, a.D, ob.qT.data() + ob.P, ob.L);
    transpose_keys(dob, a.Dv, nq, a.Dv, ob.doT.data() + ob.P, ob.L);
}

// Columns t..t+n of qT and dOT back to 0: rows the row path computes add nothing here.
inline void offset_skip(const Args& a, OffsetBlock& ob, int64_t t, int64_t n) {
    for (int64_t d = 0; d < a.D; ++d) std::fill_n(ob.qT.data() + d * ob.L + ob.P + t, n, 0.0f);
    for (int64_t e = 0; e < a.Dv; ++e) std::fill_n(ob.doT.data() + e * ob.L + ob.P + t, n, 0.0f);
}

// out[c] (lane u) = sum over d < dims of xT[d * xs + u] yT[d * ldy + c + u], c < C: C
// offsets' dot products, R partial sums over the dimensions so that at least 8 independent
// chains of multiply-adds run (a lone offset's 64 dimensions were one chain of 64).
template <int C, int R>
inline void offset_dots(const float* xT, int64_t xs, const float* yT, int64_t ldy, int64_t dims,
                        float* out) {
    tvec acc[R][C];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[r][c] = tvec{};
    }
    int64_t d = 0;
    for (; d + R <= dims; d += R) {
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const tvec x = tload(xT + (d + r) * xs);
            const float* y = yT + (d + r) * ldy;
#pragma GCC unroll 16
            for (int c = 0; c < C; ++c) acc[r][c] += x * tload(y + c);
        }
    }
    for (; d < dims; ++d) {
        const tvec x = tload(xT + d * xs);
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[0][c] += x * tload(yT + d * ldy + c);
    }
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
        tvec sum = acc[0][c];
#pragma GCC unroll 16
        for (int r = 1; r < R; ++r) sum += acc[r][c];
        tstore(out + c * kTileRows, sum);
    }
}

// The widest chunk of offsets and of dimensions summed in registers: within AVX-512's 32
// vector registers (ymm16-31 with AVX512VL) or AVX2's 16.
#if defined(__AVX512F__)
constexpr int kOffsetChunk = 16;
#else
constexpr int kOffsetChunk = 8;
#endif

// out[c] for every c < W (offset_dots in chunks of kOffsetChunk, 8, 4, 2, 1).
inline void offset_dots_all(const float* xT, int64_t xs, const float* yT, int64_t ldy,
                            int64_t dims, int64_t W, float* out) {
    int64_t c = 0;
    for (; c + kOffsetChunk <= W; c += kOffsetChunk) {
        offset_dots<kOffsetChunk, 1>(xT, xs, yT + c, ldy, dims, out + c * kTileRows);
    }
    if (kOffsetChunk > 8 && c + 8 <= W) {
        offset_dots<8, 1>(xT, xs, yT + c, ldy, dims, out + c * kTileRows);
        c += 8;
    }
    if (c + 4 <= W) offset_dots<4, 2>(xT, xs, yT + c, ldy, dims, out + c * kTileRows), c += 4;
    if (c + 2 <= W) offset_dots<2, 4>(xT, xs, yT + c, ldy, dims, out + c * kTileRows), c += 2;
    if (c < W) offset_dots<1, 8>(xT, xs, yT + c, ldy, dims, out + c * kTileRows);
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
// y is one more address register in the loop, and 16 of them (AVX-512's chunk) spilled the
// loop's pointers to the stack (perf: the loop waiting on their reloads).
inline void offset_sum_all(const float* w, int64_t ws, int64_t W, const float* y, int64_t ldy,
                           int64_t ys, int64_t dims, float* out) {
    int64_t d = 0;
    for (; d + 8 <= dims; d += 8) offset_sum<8>(w, ws, W, y + d * ldy, ldy, ys, out + d * kTileRows);
    if (d + 4 <= dims) offset_sum<4>(w, ws, W, y + d * ldy, ldy, ys, out + d * kTileRows), d += 4;
    for (; d < dims; ++d) offset_sum<1>(w, ws, W, y + d * ldy, ldy, ys, out + d * kTileRows);
}

// The query tile at block row t (rows i0 + t + u, u < kTileRows, keys i0 + t + u + dlo + c,
// c < W): S and dP~ against the transposed keys kT and values vT (rows ldt apart), P and dS
// lane by lane into the block's rows, dQ (unscaled, D floats a row) into dq.
inline void offset_tile(const Args& a, OffsetBlock& ob, int64_t i0, int64_t t,
                        const float* kT, const float* vT, int64_t ldt, const float* lse,
                        const float* di, float* dq) {
    const int64_t W = ob.W, L = ob.L, col = ob.P + t;
    const float* kt = kT + i0 + t + ob.dlo;  // lane 0's key of offset dlo
    const float* vt = vT + i0 + t + ob.dlo;
    float *s = ob.s.data(), *dp = ob.dp.data(), *ds = ob.dst.data();
    offset_dots_all(ob.qT.data() + col, L, kt, ldt, a.D, W, s);     // S = (scale q) k^T
    offset_dots_all(ob.doT.data() + col, L, vt, ldt, a.Dv, W, dp);  // dP~ = dO' v^T
    const tvec lv = tload(lse), dv = tload(di);
    for (int64_t c = 0; c < W; ++c) {  // Algorithm 2, lines 11 and 13 (softmax_row.h's grad_row)
        const tvec p = texp(tload(s + c * kTileRows) - lv);
        const tvec g = p * (tload(dp + c * kTileRows) - dv);
        tstore(ob.p.data() + c * L + col, p);
        tstore(ob.ds.data() + c * L + col, g);
        tstore(ds + c * kTileRows, g);
    }
    offset_sum_all(ds, kTileRows, W, kt, ldt, 1, a.D, ob.acc.data());  // dQT = dS kT
    transpose_keys(ob.acc.data(), kTileRows, a.D, kTileRows, dq, a.D);
}

// Adds keys [lo, hi) of the key tile j0 (acc: dims x kTileRows, lane l key j0 + l) to their
// rows of dk or dv (position j at acc_out + j * ld), transposed in registers where the whole
// tile is added (a transposition into a buffer and a reload, 512-bit loads of 256-bit stores,
// stalled on store forwarding: perf put a quarter of the path's time on those adds).
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
inline void offset_keys(const Args& a, OffsetBlock& ob, int64_t i0, int64_t first, int64_t end,
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
