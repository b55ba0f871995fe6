// The tile path's backward: a query block whose tiles of kTileRows rows each span at most
// kTileKeys keys (tile_path.h's `tile_path`: short documents, a strided mask's interleaved
// sequences, calls of at most 32 keys) is computed a tile at a time, the five products of
// FlashAttention-2's Algorithm 2 (Dao 2023) as small register-tiled products over the tile's
// rows and the union of their keys: S = (scale q) k^T and dP~ = dO' v^T as tile_path.h's
// tile_product (one row a vector lane, key-major), P and dS lane by lane, then dQ = dS k
// (rows x D), and dK += dS^T (scale q), dV += P^T dO' (keys x D) into a contiguous buffer of
// the block's keys, added to the head's dk, dv rows once per block (a key's rows of a strided
// mask lie D * groups floats apart: 64 KiB at 1/256, rows that share first-level cache sets).
//
// Why: these blocks (16 rows x 16 keys for documents of 16 tokens and for strided 1/256) went
// the block path, whose products (sgemm_ for S and dP~, packing both operands on every call)
// cost more than their 16 x 16 x 64 entries. A first backward of tiles (S and dP~ as tiles,
// the row path's stages and dK, dV a key row at a time after them; tile_product's note) was
// slower on strided masks. Measured (backward kernel alone, `_backward_into`, N=4096, H=8,
// D=64, 1 thread, AMD EPYC Zen 4 shared with other jobs, CPU time, fastest of 30 interleaved
// with the previous build): documents of 16 tokens 14.6 -> 11.6 ms, strided 1/256 11.8 ->
// 10.5 ms; in cache (N=1024, H=1) documents of 16 273 -> 231-250 ns a row. Where the rest
// goes (perf): at N=4096 mostly waiting for rows (the keys' and values' first reads, out for
// D_i, the prefetches themselves), in cache the five products (~90 ns a row at this CPU's
// peak) and each tile's transposes, packing and exponentials. Tried and no faster: the next
// block's rows fetched two blocks ahead (1-2 %), zeroing dk, dv lazily instead of
// backward.h's pass first (an upper bound, the pass skipped: no change), 8 x 2, 2 x 4 and
// 6 x 4 register tiles (within 5 %).
//
// Legend: backward_tiles one query block on the path (false: not on it); backward_tile one
// tile; tile_grads P and dS of a tile lane by lane; tile_grads_rows the same through the row
// path's stages (score functions, dense masks, bias, dropout); ready_key_rows the block's
// buffer rows a tile adds to; add_key_rows the buffer into dk_acc, dv_acc;
// prefetch_next_block the next block's rows.

#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "args.h"
#include "dropout.h"
#include "gemm_acc.h"
#include "masks.h"
#include "row_path.h"
#include "scratch.h"
#include "score_mods.h"
#include "simd.h"
#include "softmax_row.h"
#include "tile_path.h"

namespace {

using namespace attnkit_simd;

// P and dS of a tile (key-major, span keys x kTileRows lanes, in place: sT holds S and becomes
// P, dT holds dP~ and becomes dS) lane by lane: P = exp(S - lse), dS = P (dP~ - D_i) where the
// lane sees the key (vlo <= c < vhi), 0 elsewhere (a key's dP~ is computed for every lane of
// the tile: an inf in a value row another row does not see stays out of this row's dS).
inline void tile_grads(float* sT, float* dT, int64_t span, tint vlo, tint vhi, tvec lse,
                       tvec di) {
    for (int64_t c = 0; c < span; ++c) {
        const tint j = tint{} + static_cast<int32_t>(c);
        const tint inside = (vlo <= j) & (j < vhi);
        const tvec p = texp(tload(sT + c * kTileRows) - lse);
        tstore(sT + c * kTileRows, inside ? p : tvec{});
        tstore(dT + c * kTileRows, inside ? p * (tload(dT + c * kTileRows) - di) : tvec{});
    }
}

// tile_grads through the row path's stages, for calls whose scores need more than the
// product (score functions, dense masks, bias, dropout: `plain_scores`): each lane's keys
// [lo[u], hi[u]) copied to a row, score functions, masks and grad_row as backward_rows does
// them, and P * K, dS back into the lane (0 at the keys it does not see). Rows with nk[u] = 0
// (nothing seen, or lse = -inf) get zeros.
void tile_grads_rows(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i, int64_t n,
                     const int64_t* lo, const int64_t* nk, int64_t jlo, int64_t span,
                     const float* lse, const float* di, Scratch& w, float* sT, float* dT) {
    const int64_t head = b * a.H + h;
    float s[kTileKeys], dp[kTileKeys], g[kTileKeys];
    float* gu = a.softcap > 0.0f ? g : nullptr;
    float* dtab = w.dtab.empty() ? nullptr : w.dtab.data();
    for (int64_t u = 0; u < kTileRows; ++u) {
        const int64_t m = u < n ? nk[u] : 0, c0 = u < n ? lo[u] - jlo : 0;
        for (int64_t c = 0; c < m; ++c) {
            s[c] = sT[(c0 + c) * kTileRows + u];
            dp[c] = dT[(c0 + c) * kTileRows + u];
        }
        if (m > 0) {
            score_mod_row_fwd(a, h, i + u, lo[u], m, s, gu);
            mask_row(a, b, h, i + u, lo[u], m, s);
            if (a.keep_t < kNoDropout) {
                const RowKey key = row_key(a, row_of(a, head, a.N, sq, i + u));
                grad_row<true>(s, dp, m, lse[u], di[u], key, static_cast<uint32_t>(a.keep_t),
                               lo[u]);
            } else {
                grad_row<false>(s, dp, m, lse[u], di[u], RowKey{}, 0, lo[u]);
            }
            score_mod_row_bwd(a, h, i + u, lo[u], m, dp, gu, dtab);
        }
        for (int64_t c = 0; c < span; ++c) {
            const bool in = c >= c0 && c < c0 + m;
            sT[c * kTileRows + u] = in ? s[c - c0] : 0.0f;
            dT[c * kTileRows + u] = in ? dp[c - c0] : 0.0f;
        }
    }
}

// Makes the block's buffers' rows [jlo, jhi) ready for a tile that adds to them, rows
// [lo, hi) being the ones written so far (empty: none; the first tile writes its rows instead
// of adding, `fresh`): the rows between them and the new ones zeroed, [lo, hi) their hull.
inline bool ready_key_rows(const Args& a, float* dkb, float* dvb, int64_t first, int64_t jlo,
                           int64_t jhi, int64_t& lo, int64_t& hi) {
    if (lo >= hi) {
        lo = jlo, hi = jhi;
        return true;
    }
    auto zero = [&](int64_t j0, int64_t j1) {
        if (j0 >= j1) return;
        std::fill(dkb + (j0 - first) * a.D, dkb + (j1 - first) * a.D, 0.0f);
        std::fill(dvb + (j0 - first) * a.Dv, dvb + (j1 - first) * a.Dv, 0.0f);
    };
    zero(std::min(jlo, lo), lo);
    zero(hi, std::max(jhi, hi));
    lo = std::min(lo, jlo), hi = std::max(hi, jhi);
    return false;
}

// Backward of the tile of queries i..i+n-1 (n <= kTileRows; pre-scaled rows qs and dO' rows
// dob, D and Dv apart, their lse and D_i), query i + u over keys [lo[u], hi[u]): dq (n rows of
// D, before the scale) written, dK and dV added to the block's buffers dkb, dvb (rows D and Dv
// apart, row 0 the key `first`).
void backward_tile(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i, int64_t n,
                   const float* qs, const float* dob, const float* lse, const float* di,
                   const float* kb, int64_t ldk, const float* vb, int64_t ldv, const int64_t* lo,
                   const int64_t* hi, Scratch& w, float* dq, float* dkb, float* dvb,
                   int64_t first, int64_t& klo, int64_t& khi) {
    const int64_t D = a.D, Dv = a.Dv;
    int64_t jlo, jhi, slo[kTileRows], shi[kTileRows], nk[kTileRows];
    tile_keys(lo, hi, n, jlo, jhi);
    const int64_t span = jhi - jlo;
    w.work += n * span;
    tint vlo{}, vhi{};  // each lane's keys from jlo; none for rows that see nothing
    tvec lv{}, dlv{};
    bool any = false;
    for (int64_t u = 0; u < n; ++u) {
        const bool seen = lse[u] != kNegInf && lo[u] < hi[u];
        slo[u] = lo[u], shi[u] = seen ? hi[u] : lo[u], nk[u] = shi[u] - slo[u];
        vlo[u] = static_cast<int32_t>(slo[u] - jlo), vhi[u] = static_cast<int32_t>(shi[u] - jlo);
        lv[u] = seen ? lse[u] : 0.0f, dlv[u] = di[u];
        any = any || seen;
    }
    if (!any) {
        std::fill(dq, dq + n * D, 0.0f);
        return;
    }
    const bool fresh = ready_key_rows(a, dkb, dvb, first, jlo, jhi, klo, khi);
    float *sT = w.ts.data(), *dT = w.dp.data();
    tile_product(qs, n, D, kb + jlo * ldk, ldk, jlo, span, slo, shi, w.tq.data(), w.tk.data(),
                 w.packed_k, w.packed_k_n, sT);  // S, masked to each row's keys
    // dP~ = dO' v^T (the values packed into w.tv, which the forward's packed_values uses)
    tile_product(dob, n, Dv, vb + jlo * ldv, ldv, jlo, span, slo, shi, w.tq.data(),
                 w.tv.data(), w.packed_v, w.packed_v_n, dT);
    if (plain_scores(a)) {
        tile_grads(sT, dT, span, vlo, vhi, lv, dlv);
    } else {
        tile_grads_rows(a, b, h, sq, i, n, slo, nk, jlo, span, lse, di, w, sT, dT);
    }
    // dQ = dS k: A(u, c) = dT[c * kTileRows + u]
    tile_gemm<true>(n, D, span, dT, 1, kTileRows, kb + jlo * ldk, ldk, dq, D);
    // dK += dS^T (scale q), dV += (P K)^T dO': A(c, u) = dT, sT[c * kTileRows + u]; the
    // buffers' rows first written (`fresh`) by the block's first tile
    float *dk = dkb + (jlo - first) * D, *dv = dvb + (jlo - first) * Dv;
    if (fresh) {
        tile_gemm<true>(span, D, n, dT, kTileRows, 1, qs, D, dk, D);
        tile_gemm<true>(span, Dv, n, sT, kTileRows, 1, dob, Dv, dv, Dv);
    } else {
        tile_gemm<false>(span, D, n, dT, kTileRows, 1, qs, D, dk, D);
        tile_gemm<false>(span, Dv, n, sT, kTileRows, 1, dob, Dv, dv, Dv);
    }
}

// Rows [j0, j1) of the block's buffers (row 0 the key `first`) added to dk_acc, dv_acc (key j
// at row j * step).
void add_key_rows(const Args& a, const float* dkb, const float* dvb, int64_t first, int64_t j0,
                  int64_t j1, float* dk_acc, float* dv_acc, int64_t step) {
    for (int64_t j = j0; j < j1; ++j) {
        float* dk = dk_acc + j * a.D * step;
        float* dv = dv_acc + j * a.Dv * step;
        const float* sk = dkb + (j - first) * a.D;
        const float* sv = dvb + (j - first) * a.Dv;
#pragma omp simd
        for (int64_t e = 0; e < a.D; ++e) dk[e] += sk[e];
#pragma omp simd
        for (int64_t e = 0; e < a.Dv; ++e) dv[e] += sv[e];
    }
}

// The next query block's rows i1..i1 + nq of q, out, dO and dq (head `head`, sequence sq)
// and the keys end..end + keys of k, v and dk_acc, dv_acc (the next document's, where keys
// follow the queries), fetched into L2 while this block computes (sequences that interleave:
// prefetch_next_sequence). Measured (documents of 16 tokens, N=4096, H=8, D=64, backward
// kernel alone, 1 thread, AMD EPYC Zen 4, fastest of 25 interleaved): 12.5 -> 11.4 ms.
void prefetch_next_block(const Args& a, int64_t head, int64_t sq, int64_t i1, int64_t nq,
                         int64_t end, int64_t keys, const float* kb, int64_t ldk,
                         const float* vb, int64_t ldv, float* dk_acc, float* dv_acc,
                         int64_t step) {
    for (int64_t i = i1; i < std::min(i1 + nq, a.N); ++i) {
        const int64_t row = qrow(a, head, sq, i);
        prefetch_row_l2(a.q + row * a.D, a.D);
        prefetch_row_l2(a.out + row * a.Dv, a.Dv);
        if (a.dout_st[2] != 0) prefetch_row_l2(dout_row(a, row), a.Dv);
        prefetch_row_l2(a.dq + row * a.D, a.D);
    }
    for (int64_t j = end; j < std::min(end + keys, a.S); ++j) {
        prefetch_row_l2(kb + j * ldk, a.D);
        prefetch_row_l2(vb + j * ldv, a.Dv);
        prefetch_row_l2(dk_acc + j * a.D * step, a.D);
        prefetch_row_l2(dv_acc + j * a.Dv * step, a.Dv);
    }
}

// The backward of query block rows i0..i1 (pre-scaled rows qs, dO' rows dob, their lse and D_i)
// on the tile path, where `tile_path` takes it (with the backward's row path, as the forward
// does with its own): dq (nq rows of D, before the scale) written, dK and dV added to dk_acc,
// dv_acc (rows j * step), the block's key blocks cleared; false (nothing done) elsewhere.
bool backward_tiles(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i0, int64_t i1,
                    const float* qs, const float* dob, const float* lse, const float* di,
                    const float* kb, int64_t ldk, const float* vb, int64_t ldv, Scratch& w,
                    float* dq, float* dk_acc, float* dv_acc, int64_t step) {
    if (!tile_path(a, w, i0, i1, row_path(a, w, i0, i1, kRowPathKeysBackward))) return false;
    const int64_t D = a.D, Dv = a.Dv;
    int64_t first, end;
    blocks_span(w, first, end);
    tile_buffers(a, w);
    if (w.dp.size() < static_cast<size_t>(kTileKeys * kTileRows)) w.dp.resize(kTileKeys * kTileRows);
    const size_t keys = static_cast<size_t>(end - first);
    if (w.dk.size() < keys * D) w.dk.resize(keys * D);
    if (w.dv.size() < keys * Dv) w.dv.resize(keys * Dv);
    if (a.groups == 1) {
        prefetch_next_block(a, b * a.H + h, sq, i1, i1 - i0, end, end - first, kb, ldk, vb, ldv,
                            dk_acc, dv_acc, step);
    }
    int64_t klo = 0, khi = 0;  // the buffers' rows written (keys klo..khi)
    each_tile(a, w, i0, i1, [&](int64_t r, int64_t n, const int64_t* lo, const int64_t* hi) {
        backward_tile(a, b, h, sq, i0 + r, n, qs + r * D, dob + r * Dv, lse + r, di + r, kb, ldk,
                      vb, ldv, lo, hi, w, dq + r * D, w.dk.data(), w.dv.data(), first, klo, khi);
    });
    add_key_rows(a, w.dk.data(), w.dv.data(), first, klo, khi, dk_acc, dv_acc, step);
    w.blocks.clear();  // computed: no blocks left
    return true;
}

}  // namespace
