// The backward of one query block (FlashAttention-2 Algorithm 2 with dropout): dq of its rows,
// dk and dv of its keys added to dk_acc, dv_acc (the head's rows, or a slot of backward.h's).
// The block path over key blocks with matrix products, the row path (row_path.h), or the
// offset paths (offset_backward.h: bands; offset_runs.h: rows of several runs).
//
// Legend: backward_block one query block; backward_rows up to kRowGroup of its rows on the row
// path, add_dk_dv their dK, dV; prefetch_backward the row path's prefetch; write_dq a
// block's dq; copy_dout_row a row of dO, whatever its strides. dob dO' = dO * inv_keep, dlt
// D_i (less dlse), step the rows between a sequence's positions in dk_acc, dv_acc.

#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "args.h"
#include "blas.h"
#include "dropout.h"
#include "gemm_acc.h"
#include "masks.h"
#include "offset_backward.h"
#include "offset_runs.h"
#include "row_path.h"
#include "scratch.h"
#include "score_mods.h"
#include "simd.h"
#include "softmax_row.h"
#include "tile_backward.h"
#include "transposed.h"

namespace {

using namespace attnkit_simd;

// The backward's prefetch at query i of a block of nq rows: the next block's query, dO, O
// (read by its preamble) and dq (written at its end) rows, the key, value and their dK, dV
// rows hi - 1 + kAhead.
void prefetch_backward(const Args& a, int64_t head, int64_t sq, int64_t i, int64_t nq,
                       const float* kb, int64_t ldk, const float* vb, int64_t ldv, int64_t hi,
                       float* dk_acc, float* dv_acc, int64_t step) {
    if (i + nq < a.N) {
        const int64_t row = qrow(a, head, sq, i + nq);
        prefetch_row(a.q + row * a.D, a.D);
        prefetch_row(dout_row(a, row), a.Dv);
        prefetch_row(a.out + row * a.Dv, a.Dv);
        prefetch_row_w(a.dq + row * a.D, a.D);
    }
    const int64_t j = hi - 1 + kAhead;
    if (hi > 0 && j < a.S) {
        prefetch_row(kb + j * ldk, a.D);
        prefetch_row(vb + j * ldv, a.Dv);
        prefetch_row_w(dk_acc + j * a.D * step, a.D);
        prefetch_row_w(dv_acc + j * a.Dv * step, a.Dv);
    }
}

// dK and dV of the row path's rows u < n over their keys [lo[u], hi[u]) (nk[u] = 0: a row
// that adds nothing): each key's rows of dk_acc and dv_acc are added to once, with dS^T of the
// rows that see it times their (scaled) queries and (P K)^T times their dO' rows (ds, pk: the
// rows' dS and P K, W apart; qs, dob: D and Dv apart).
void add_dk_dv(const Args& a, int64_t n, const int64_t* lo, const int64_t* hi, const int64_t* nk,
               const float* ds, const float* pk, int64_t W, const float* qs, const float* dob,
               float* dk_acc, float* dv_acc, int64_t step) {
    int64_t first = a.S, end = 0;
    for (int64_t u = 0; u < n; ++u) {
        if (nk[u] == 0) continue;
        first = std::min(first, lo[u]);
        end = std::max(end, hi[u]);
    }
    for (int64_t j = first; j < end; ++j) {
        const float* xq[kRowGroup];
        const float* xo[kRowGroup];
        float cs[kRowGroup], cp[kRowGroup];
        int64_t m = 0;
        for (int64_t u = 0; u < n; ++u) {
            if (nk[u] == 0 || j < lo[u] || j >= hi[u]) continue;  // only rows that see key j
            cs[m] = ds[u * W + j - lo[u]];
            cp[m] = pk[u * W + j - lo[u]];
            xq[m] = qs + u * a.D;
            xo[m] = dob + u * a.Dv;
            ++m;
        }
        if (m == 0) continue;
        add_weighted_rows(dk_acc + j * a.D * step, a.D, xq, cs, m);   // dK += dS^T (scale q)
        add_weighted_rows(dv_acc + j * a.Dv * step, a.Dv, xo, cp, m);  // dV += (P K)^T dO'
    }
}

// Backward of queries i..i+n-1 (n <= kRowGroup) of a block of nq rows (pre-scaled rows qs, dO'
// rows dob, D and Dv apart, their lse and D_i), query i + u over keys [lo[u], hi[u]): the
// block path's Algorithm 2, lines 11-13, stage by stage over the rows (kRowGroup). dq (n rows
// of D) is written (dS k), dk_acc and dv_acc added to (add_dk_dv).
void backward_rows(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i, int64_t n,
                   int64_t nq, const float* qs, const float* dob, const float* lse,
                   const float* di, const float* kb, int64_t ldk, const float* vb, int64_t ldv,
                   const int64_t* lo, const int64_t* hi, Scratch& w, float* dq, float* dk_acc,
                   float* dv_acc, int64_t step) {
    constexpr int64_t W = kRowStrideBackward;  // scores a row
    const int64_t D = a.D, Dv = a.Dv, head = b * a.H + h;
    float *s = w.s.data(), *dp = w.dp.data(), *g = w.g.empty() ? nullptr : w.g.data();
    float* dtab = w.dtab.empty() ? nullptr : w.dtab.data();
    int64_t nk[kRowGroup];
    for (int64_t u = 0; u < n; ++u) {
        prefetch_backward(a, head, sq, i + u, nq, kb, ldk, vb, ldv, hi[u], dk_acc, dv_acc, step);
        nk[u] = lse[u] == kNegInf ? 0 : hi[u] - lo[u];  // a row that sees nothing: no gradient
        if (nk[u] == 0) continue;
        float* gu = g ? g + u * W : nullptr;
        dots(qs + u * D, kb + lo[u] * ldk, ldk, D, nk[u], s + u * W);     // S
        dots(dob + u * Dv, vb + lo[u] * ldv, ldv, Dv, nk[u], dp + u * W);  // dP~ = dO' v^T
        score_mod_row_fwd(a, h, i + u, lo[u], nk[u], s + u * W, gu);
        mask_row(a, b, h, i + u, lo[u], nk[u], s + u * W);
    }
    for (int64_t u = 0; u < n; ++u) {
        if (nk[u] == 0) continue;
        if (a.keep_t < kNoDropout) {
            const RowKey key = row_key(a, row_of(a, head, a.N, sq, i + u));
            grad_row<true>(s + u * W, dp + u * W, nk[u], lse[u], di[u], key,
                           static_cast<uint32_t>(a.keep_t), lo[u]);
        } else {
            grad_row<false>(s + u * W, dp + u * W, nk[u], lse[u], di[u], RowKey{}, 0, lo[u]);
        }
        score_mod_row_bwd(a, h, i + u, lo[u], nk[u], dp + u * W, g ? g + u * W : nullptr, dtab);
    }
    for (int64_t u = 0; u < n; ++u) {
        std::fill(dq + u * D, dq + (u + 1) * D, 0.0f);
        if (nk[u] > 0) weighted_sum(dp + u * W, nk[u], kb + lo[u] * ldk, ldk, D, dq + u * D);
    }
    add_dk_dv(a, n, lo, hi, nk, dp, s, W, qs, dob, dk_acc, dv_acc, step);
}

// The rows of an offset-path block: each tile of kTileRows rows whose offsets are the block's
// (those of its first tile that shares them) on the offset path (offset_backward.h), the
// others on the row path, kRowGroup rows at a time; then the key lanes' dK, dV. False, having
// computed nothing, where no tile shares its offsets. Arguments as backward_rows' for the
// whole block (rows i0..i1, lse and D_i of each).
bool offset_rows(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i0, int64_t i1,
                 const float* qs, const float* dob, const float* lse, const float* di,
                 const float* kb, int64_t ldk, const float* vb, int64_t ldv, Scratch& w,
                 float* dq, float* dk_acc, float* dv_acc, int64_t step) {
    const int64_t nq = i1 - i0, D = a.D, Dv = a.Dv;
    int64_t first, end, lo[kTileRows], hi[kTileRows], dlo = 0, dhi = 0, tlo, thi;
    blocks_span(w, first, end);
    auto spans = [&](int64_t t, int64_t n) {
        for (int64_t u = 0; u < n; ++u) row_span(a, w, t + u, i0 + t + u, first, end, lo[u], hi[u]);
    };
    bool any = false;  // the block's offsets: its first tile that shares them
    for (int64_t t = 0; t + kTileRows <= nq && !any; t += kTileRows) {
        spans(t, kTileRows);
        any = shared_offsets(lo, hi, i0 + t, kTileRows, lse + t, dlo, dhi);
    }
    if (!any) return false;  // no band here (documents of 33-64 tokens): the blocks
    OffsetBlock& ob = offset_block();
    offset_start(a, ob, nq, dlo, dhi - dlo);
    const float* kT = offset_ready(a, w.okt, kb, ldk, D, first, end);
    const float* vT = offset_ready(a, w.ovt, vb, ldv, Dv, first, end);
    auto offset = [&](int64_t t, int64_t n, OffsetTile& ot) {  // the block's offsets, one run
        spans(t, n);
        return shared_offsets(lo, hi, i0 + t, n, lse + t, tlo, thi) && tlo == dlo &&
               thi == dhi && offset_tile(lo, hi, kTileRows, 1, i0 + t, n, ot);
    };
    for (int64_t t = 0; t < nq;) {
        const int64_t n = std::min(kTileRows, nq - t);
        OffsetTile ot, next;
        if (offset(t, n, ot)) {  // with the next tile where it is one too
            const bool pair = t + 2 * kTileRows <= nq && offset(t + kTileRows, kTileRows, next);
            w.work += (pair ? 2 : 1) * kTileRows * (dhi - dlo);
            query_tiles(a, ob, ot, t, pair, qs + t * D, dob + t * Dv, kT, vT, offset_ld(a),
                        lse + t, di + t, dq + t * D);
            t += (pair ? 2 : 1) * kTileRows;
            continue;
        }
        offset_zero(a, ob, ob.P + t, ob.P + t + n);  // on the row path: its columns 0
        for (int64_t g = 0; g < n; g += kRowGroup) {
            const int64_t m = std::min(kRowGroup, n - g), r = t + g;
            for (int64_t u = g; u < g + m; ++u) w.work += hi[u] - lo[u];
            backward_rows(a, b, h, sq, i0 + r, m, nq, qs + r * D, dob + r * Dv, lse + r, di + r,
                          kb, ldk, vb, ldv, lo + g, hi + g, w, dq + r * D, dk_acc, dv_acc, step);
        }
        t += n;
    }
    key_tiles(a, ob, i0, first, end, dk_acc, dv_acc, step);
    return true;
}

// Row `row` of dO into dst (Dv floats), whatever its strides (Args::dout_st).
inline void copy_dout_row(const Args& a, int64_t row, float* dst) {
    const float* go = dout_row(a, row);
    const int64_t step = a.dout_st[3];
    if (step == 1) {
        std::copy(go, go + a.Dv, dst);
    } else if (step == 0) {  // one value broadcast (out.sum()'s cotangent): ~20 ns a row less
        std::fill(dst, dst + a.Dv, go[0]);
    } else {
        for (int64_t e = 0; e < a.Dv; ++e) dst[e] = go[e * step];
    }
}

// dq of rows i0..i0+nq-1 of head `head`, sequence sq: the block's sums (nq rows of D) times
// the scale.
inline void write_dq(const Args& a, int64_t head, int64_t sq, int64_t i0, int64_t nq,
                     const float* dq) {
    for (int64_t r = 0; r < nq; ++r) {
        float* dq_out = a.dq + qrow(a, head, sq, i0 + r) * a.D;
#pragma omp simd
        for (int64_t e = 0; e < a.D; ++e) dq_out[e] = dq[r * a.D + e] * a.scale;
    }
}

// One query block of head (b, h), sequence sq; dk, dv (S, D) / (S, Dv) of its kv head are
// accumulated into dk_acc / dv_acc, whose position j is row j * step. FlashAttention-2
// Algorithm 2 with dropout: with keep mask K and dO' = dO * inv_keep, dV += (P*K)^T dO',
// dP~ = dO' V^T, dS = (P*K) * dP~ - P * D_i.
void backward_block(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i0, int64_t i1,
                    Scratch& w, float* dk_acc, float* dv_acc, int64_t step) {
    const int64_t nq = i1 - i0, D = a.D, Dv = a.Dv, kvh = h / (a.H / a.Hkv);
    const int64_t ldk = D * a.groups, ldv = Dv * a.groups;  // key and value rows of sequence sq
    const float* kb = a.k + row_of(a, b * a.Hkv + kvh, a.S, sq, 0) * D;
    const float* vb = a.v + row_of(a, b * a.Hkv + kvh, a.S, sq, 0) * Dv;
    float *s = w.s.data(), *dp = w.dp.data(), *qs = w.qs.data(), *dq = w.acc.data();
    float *dob = w.dob.data(), *dlt = w.dlt.data(), *lse = w.l.data();
    load_q(a, b, h, sq, i0, nq, qs);
    for (int64_t r = 0; r < nq; ++r) {
        const int64_t row = qrow(a, b * a.H + h, sq, i0 + r);
        const float* o = a.out + row * Dv;
        float* dr = dob + r * Dv;
        copy_dout_row(a, row, dr);
        // D_i = rowsum(dO * O) (Algorithm 2, line 4), its lanes summed as a tree (the omp simd
        // reduction it replaces added them one after another: perf, documents of 16 tokens'
        // backward in cache, ~1/4 of the block's set-up)
        const float d = dot(dr, o, Dv);
#pragma omp simd
        for (int64_t e = 0; e < Dv; ++e) dr[e] *= a.inv_keep;
        // a gradient on lse adds P_ij * dlse_i to dS_ij, i.e. subtracts dlse_i from D_i
        dlt[r] = a.dlse ? d - a.dlse[row] : d;
        lse[r] = a.lse[row];
    }
    std::fill(dq, dq + nq * D, 0.0f);
    if (runs_fit(a, nq)) {  // rows of several runs on the offset path (offset_runs.h)
        int64_t first, end;
        const std::vector<OffsetTile>* tiles = offset_path(a, b, i0, i1, first, end);
        if (tiles) {
            offset_runs(a, *tiles, i0, i1, qs, dob, lse, dlt, kb, ldk, vb, ldv, first, end, w, dq,
                        dk_acc, dv_acc, step);
            write_dq(a, b * a.H + h, sq, i0, nq, dq);
            return;
        }
    }
    key_blocks(a, b, h, i0, i1, w.blocks, w.lo.data(), w.hi.data());
    const int64_t G = a.H / a.Hkv;
    if (a.groups > 1 && i1 == a.N && h % G == G - 1 && step == a.groups) {
        int64_t first, end;  // sequence sq's last block in place (not split): sq + 1's next
        blocks_span(w, first, end);
        prefetch_next_sequence(a, b * a.H + h - (G - 1), b * a.Hkv + kvh, sq, nq, first, end,
                               true, true);
    }
    // the tile path (tile_backward.h) computes the block and leaves no key blocks
    backward_tiles(a, b, h, sq, i0, i1, qs, dob, lse, dlt, kb, ldk, vb, ldv, w, dq, dk_acc, dv_acc,
                   step);
    const uint32_t t = static_cast<uint32_t>(a.keep_t < kNoDropout ? a.keep_t : 0);
    const int switched = offset_switch();  // the default -1: bands past the row path's rows
    const bool narrow = row_path(a, w, i0, i1, kRowPathKeysBackward);
    const bool offsets = switched != 0 && (switched == 1 || !narrow) && offsets_fit(a) &&
                         (narrow || row_path(a, w, i0, i1, kBandKeys));
    if (narrow || offsets) {
        const size_t need = kRowGroup * kRowStrideBackward;
        for (std::vector<float>* buf : {&w.s, &w.dp}) {
            if (buf->size() < need) buf->resize(need);
        }
        if (!w.g.empty() && w.g.size() < need) w.g.resize(need);
    }
    if (offsets && offset_rows(a, b, h, sq, i0, i1, qs, dob, lse, dlt, kb, ldk, vb, ldv, w, dq,
                               dk_acc, dv_acc, step)) {
        w.blocks.clear();  // computed: no blocks left
    } else if (narrow) {
        each_row(a, w, i0, i1, [&](int64_t r, int64_t n, const int64_t* lo, const int64_t* hi) {
            backward_rows(a, b, h, sq, i0 + r, n, nq, qs + r * D, dob + r * Dv, lse + r,
                          dlt + r, kb, ldk, vb, ldv, lo, hi, w, dq + r * D, dk_acc, dv_acc, step);
        });
        w.blocks.clear();  // computed: no blocks left
    }
    const bool cache = transposing(a, w.blocks, D, Dv);
    for (const KeyBlock& blk : w.blocks) {
        const int64_t j0 = blk.j0, nk = blk.nk;
        w.work += nq * nk;
        times_keys(a, cache, w.kt, kb, ldk, D, nq, qs, D, j0, nk, s, nk);      // S
        times_keys(a, cache, w.vt, vb, ldv, Dv, nq, dob, Dv, j0, nk, dp, nk);  // dP~ = dO' v^T
        for (int64_t r = 0; r < nq; ++r) {
            float *sr = s + r * nk, *dr = dp + r * nk;
            const int64_t i = i0 + r;
            if (lse[r] == kNegInf) {  // the row sees nothing: P = 0, no gradient
                std::fill(sr, sr + nk, 0.0f);
                std::fill(dr, dr + nk, 0.0f);
                continue;
            }
            float* gr = w.g.empty() ? nullptr : w.g.data() + r * nk;
            score_mod_row_fwd(a, h, i, j0, nk, sr, gr);
            mask_row(a, b, h, i, j0, nk, sr);
            mask_row_structured(a, blk, w.lo.data() + r, w.hi.data() + r, r, sr);
            if (a.keep_t < kNoDropout) {
                const RowKey key = row_key(a, row_of(a, b * a.H + h, a.N, sq, i));
                grad_row<true>(sr, dr, nk, lse[r], dlt[r], key, t, j0);
            } else {
                grad_row<false>(sr, dr, nk, lse[r], dlt[r], RowKey{}, 0, j0);
            }
            score_mod_row_bwd(a, h, i, j0, nk, dr, gr, w.dtab.empty() ? nullptr : w.dtab.data());
        }
        const int64_t ldv_acc = Dv * step, ldk_acc = D * step;
        acc_tn(nk, Dv, nq, s, nk, dob, Dv, dv_acc + j0 * ldv_acc, ldv_acc);  // dV += (PK)^T dO'
        acc_nn(nq, D, nk, dp, nk, kb + j0 * ldk, ldk, dq, D);                 // dQ += dS k
        acc_tn(nk, D, nq, dp, nk, qs, D, dk_acc + j0 * ldk_acc, ldk_acc);     // dK += dS^T (sq)
    }
    write_dq(a, b * a.H + h, sq, i0, nq, dq);
}

}  // namespace
