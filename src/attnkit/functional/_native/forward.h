// The forward pass of one query block (FlashAttention-2 Algorithm 1): the block path, over
// key blocks with matrix products and an online softmax, the row path (row_path.h) or the tile
// path (tile_path.h).
//
// Legend: forward_block one query block (rows i0..i1 of head (b, h), sequence sq);
// forward_rows up to kRowGroup of its rows on the row path, finish_rows their softmax, values
// and output; forward_tile a tile of up to kTileRows rows; plain_scores whether a call needs
// nothing between the product and the softmax; write_row a row's out and lse from
// its running max m, sum l and unnormalised output acc. kb, vb the keys and values of the
// sequence, ldk, ldv apart (Args::groups interleaving).

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "args.h"
#include "blas.h"
#include "dropout.h"
#include "masks.h"
#include "narrow_path.h"
#include "offset_path.h"
#include "row_path.h"
#include "scratch.h"
#include "score_mods.h"
#include "simd.h"
#include "softmax_row.h"
#include "tile_path.h"
#include "transposed.h"

namespace {

using namespace attnkit_simd;

// out and lse of one row from its running max m and sum l and unnormalised output acc.
void write_row(const Args& a, int64_t row, const float* acc, float m, float l) {
    float* o = a.out + row * a.Dv;
    // l == 0 exactly when the row saw nothing: out 0 and lse -inf, never 0 / 0. A NaN
    // score makes l NaN: out (acc * 0) and lse stay NaN, and backward keeps the row.
    const float f = l > 0.0f ? a.inv_keep / l : 0.0f;
    for (int64_t e = 0; e < a.Dv; ++e) o[e] = acc[e] * f;
    a.lse[row] = l > 0.0f ? m + std::log(l) : (l == 0.0f ? kNegInf : l);
}

// Whether rows u < n each see at most `most` keys.
inline bool widest_at_most(const int64_t* lo, const int64_t* hi, int64_t n, int64_t most) {
    for (int64_t u = 0; u < n; ++u) {
        if (hi[u] - lo[u] > most) return false;
    }
    return true;
}

// Softmax, weighted sum of values and output of queries i..i+n-1 (n <= kRowGroup) of head
// `head`, sequence sq, query i + u over keys [lo[u], hi[u]), whose final scores (score
// functions and masks applied) are s + u * kRowPathKeys; acc holds n rows of Dv. (Forced
// inline into both callers, a window of 9 keys' forward took ~5% longer in cache.)
void finish_rows(const Args& a, int64_t head, int64_t sq, int64_t i, int64_t n, const float* vb,
                 int64_t ldv, const int64_t* lo, const int64_t* hi, float* s, float* acc) {
    float m[kRowGroup], l[kRowGroup];
    if (a.keep_t >= kNoDropout && widest_at_most(lo, hi, n, kLanes)) {
        // every row one vector (a window of up to kLanes keys): row_max and exp_sum_row<false>
        // on the vector held in a register, the same operations lane by lane (the same bits:
        // their sum starts at +0), without a store and a reload between them and no calls.
        // A window of 9 keys' forward (kernel only, N=4096, H=8, 1 thread, AMD EPYC Zen 4,
        // fastest of 40-60 interleaved rounds): 7-8 % faster; 1 key 2-3 %.
        vfloat x[kRowGroup];
        for (int64_t u = 0; u < n; ++u) {
            x[u] = load_part(s + u * kRowPathKeys, hi[u] - lo[u], kNegInf);
            m[u] = hmax(x[u], kNegInf);
        }
        for (int64_t u = 0; u < n; ++u) {
            const float m_safe = m[u] == kNegInf ? 0.0f : m[u];
            const vfloat p = exp_v(x[u] - splat(m_safe));
            store_part(s + u * kRowPathKeys, p, hi[u] - lo[u]);
            l[u] = reduce_add(p);
        }
    } else {
        for (int64_t u = 0; u < n; ++u) m[u] = row_max(s + u * kRowPathKeys, hi[u] - lo[u]);
        for (int64_t u = 0; u < n; ++u) {
            float* su = s + u * kRowPathKeys;
            const int64_t nk = hi[u] - lo[u];
            const float m_safe = m[u] == kNegInf ? 0.0f : m[u];
            l[u] = a.keep_t < kNoDropout
                ? exp_sum_row<true>(su, nk, m_safe, row_key(a, row_of(a, head, a.N, sq, i + u)),
                                    static_cast<uint32_t>(a.keep_t), lo[u])
                : exp_sum_row<false>(su, nk, m_safe, RowKey{}, 0, lo[u]);
        }
    }
    for (int64_t u = 0; u < n; ++u) {
        weighted_sum(s + u * kRowPathKeys, hi[u] - lo[u], vb + lo[u] * ldv, ldv, a.Dv,
                     acc + u * a.Dv);
    }
    for (int64_t u = 0; u < n; ++u) {
        write_row(a, qrow(a, head, sq, i + u), acc + u * a.Dv, m[u], l[u]);
    }
}

// Forward of queries i..i+n-1 (n <= kRowGroup) of a block of nq rows (pre-scaled rows qs,
// D apart), query i + u over keys [lo[u], hi[u]); kb, vb: the keys and values of its sequence,
// ldk, ldv apart. Stage by stage over the rows (kRowGroup); s holds kRowGroup rows of
// kRowPathKeys scores, acc n rows of Dv.
void forward_rows(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i, int64_t n,
                  int64_t nq, const float* qs, const float* kb, int64_t ldk, const float* vb,
                  int64_t ldv, const int64_t* lo, const int64_t* hi, float* s, float* acc) {
    const int64_t head = b * a.H + h;
    for (int64_t u = 0; u < n; ++u) {
        float* su = s + u * kRowPathKeys;
        const int64_t nk = hi[u] - lo[u];
        prefetch_forward(a, head, sq, i + u, nq, kb, ldk, vb, ldv, hi[u]);
        dots(qs + u * a.D, kb + lo[u] * ldk, ldk, a.D, nk, su);
        score_mod_row_fwd(a, h, i + u, lo[u], nk, su, nullptr);
        mask_row(a, b, h, i + u, lo[u], nk, su);
    }
    finish_rows(a, head, sq, i, n, vb, ldv, lo, hi, s, acc);
}

// Rows u < n (queries i + u, keys [lo[u], hi[u])) of a key-major score tile finished the row
// path's way: row u's scores, at col(u) + c * kTileRows for c < hi[u] - lo[u], copied to a row
// of their own, score functions and masks applied, then finish_rows (the tile and offset
// paths' calls with more than plain scores).
template <typename Col>
void finish_tile_rows(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i, int64_t n,
                      int64_t nq, const float* kb, int64_t ldk, const float* vb, int64_t ldv,
                      const int64_t* lo, const int64_t* hi, Scratch& w, float* acc, Col col) {
    const int64_t head = b * a.H + h;
    float* s = w.s.data();
    for (int64_t r = 0; r < n; r += kRowGroup) {
        const int64_t g = std::min(kRowGroup, n - r);
        for (int64_t u = r; u < r + g; ++u) {
            prefetch_tile_row(a, head, sq, i + u, nq, kb, ldk, vb, ldv);
            float* su = s + (u - r) * kRowPathKeys;
            const int64_t nk = hi[u] - lo[u];
            const float* cu = col(u);
            for (int64_t c = 0; c < nk; ++c) su[c] = cu[c * kTileRows];
            score_mod_row_fwd(a, h, i + u, lo[u], nk, su, nullptr);
            mask_row(a, b, h, i + u, lo[u], nk, su);
        }
        finish_rows(a, head, sq, i + r, g, vb, ldv, lo + r, hi + r, s, acc);
    }
}

// Forward of an offset tile t (offset_path.h: queries i..i+n-1 of the block of nq rows from
// i0, whose keys end at `end`; pre-scaled rows qs, D apart) against the padded cache kT (key
// 0's column, rows ldt apart): the scores, the softmax lane by lane and each row's weighted
// sum of its own value rows, lane by lane where a tile's value rows fit the first-level
// cache, else run by run (offset_values); with more than plain scores (one run a row),
// finish_tile_rows. lo, hi: the rows' runs (tile_runs). acc: kTileRows rows of Dv.
void forward_offsets(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i0, int64_t nq,
                     int64_t end, const float* qs, const float* kT, int64_t ldt,
                     const float* kb, int64_t ldk, const float* vb, int64_t ldv,
                     const OffsetTile& t, const int64_t* lo, const int64_t* hi, Scratch& w,
                     float* acc) {
    const int64_t head = b * a.H + h, Dv = a.Dv, i = t.i, n = t.n;
    w.work += n * t.total;
    float* sT = w.ts.data();
    transpose_q(qs, n, a.D, ceil_div(a.D, kDimBlock), w.tq.data());
    const tvec m = offset_scores(w.tq.data(), a.D, kT, ldt, t, sT);
    if (!plain_scores(a)) {
        finish_tile_rows(a, b, h, sq, i, n, nq, kb, ldk, vb, ldv, lo, hi, w, acc, [&](int64_t u) {
            return sT + (t.at[0] + t.vlo[0][u]) * kTileRows + u;
        });
        return;
    }
    const tvec l = tile_softmax(sT, t.total, m);
    const bool by_runs = t.total * Dv > kOffsetLaneFloats;
    if (by_runs) offset_values(t, sT, vb, ldv, Dv, acc);
    for (int64_t u = 0; u < n; ++u) {
        prefetch_offset_row(a, head, sq, i + u, nq, kb, ldk, vb, ldv, end + i + u - i0);
        if (!by_runs) offset_row_values(t, u, sT, vb, ldv, Dv, acc + u * Dv);
        write_row(a, qrow(a, head, sq, i + u), acc + u * Dv, m[u], l[u]);
    }
}

// Forward of the tile of queries i..i+n-1 (n <= kTileRows) of a block of nq rows (pre-scaled
// rows qs, D apart), query i + u over keys [lo[u], hi[u]): the rows' scores over the union of
// their keys as one register-blocked product (tile_path.h), each masked to its own keys. On
// plain_scores, the softmax on the key-major tile a row a lane (one max, exp and sum a
// vector for 8 rows, no horizontal reductions) and each row's weighted sum over its own keys
// (a key's value row is never read by a row that does not see it: an inf there stays out of
// the other rows); else each row's scores are copied to a row of their own and go the row
// path's way (score functions, masks, finish_rows). acc: kTileRows rows of Dv. Tried and no
// faster: acc = P~ v as one register-tiled product (tile_gemm) where every row sees the whole
// span (documents of 16, AMD EPYC Zen 4, 1 thread: 102 ns a row either way in cache, 4.5 and
// 4.7 ms at N=4096, H=8).
void forward_tile(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i, int64_t n,
                  int64_t nq, const float* qs, const float* kb, int64_t ldk, const float* vb,
                  int64_t ldv, const int64_t* lo, const int64_t* hi, Scratch& w, float* acc) {
    const int64_t head = b * a.H + h, Dv = a.Dv;
    int64_t jlo, jhi;
    tile_keys(lo, hi, n, jlo, jhi);
    const int64_t span = jhi - jlo;
    w.work += n * span;
    float* sT = w.ts.data();
    const tvec m = tile_scores_masked(a, w, qs, n, kb + jlo * ldk, ldk, jlo, span, lo, hi);
    if (!plain_scores(a)) {
        finish_tile_rows(a, b, h, sq, i, n, nq, kb, ldk, vb, ldv, lo, hi, w, acc,
                         [&](int64_t u) { return sT + (lo[u] - jlo) * kTileRows + u; });
        return;
    }
    const tvec l = tile_softmax(sT, span, m);
    // value rows [jlo, jhi) at vt, ldt apart: a copy where the sequence's rows interleave with
    // others' (Args::groups: D * groups floats apart, rows that share a first-level cache set)
    const float* vt = vb + jlo * ldv;
    int64_t ldt = ldv;
    if (ldv != Dv && span > 0) {
        vt = packed_values(w, vb + jlo * ldv, ldv, span, Dv);
        ldt = Dv;
    }
    for (int64_t u = 0; u < n; ++u) {
        prefetch_tile_row(a, head, sq, i + u, nq, kb, ldk, vb, ldv);
        float* au = acc + u * Dv;
        const int64_t nk = hi[u] - lo[u];
        if (nk == 0) {
            std::fill(au, au + Dv, 0.0f);
        } else {
            weighted_sum(sT + (lo[u] - jlo) * kTileRows + u, nk, vt + (lo[u] - jlo) * ldt, ldt,
                         Dv, au, kTileRows);
        }
        write_row(a, qrow(a, head, sq, i + u), au, m[u], l[u]);
    }
}

// Whether the block path's S reads the thread's transposed keys (transposed.h): where the
// backward would (a query block sees >= kCacheFromKeys keys) and one thread serves enough of
// the key head's rows for a key's transposition (~44 ns, k only) to pay for itself (~0.09 ns
// saved a row: break-even near 500 rows). The backward gives a thread whole runs of a head;
// the forward's query blocks go to threads one at a time (schedule(dynamic, 1)), so a thread
// serves about N * G / nthreads of a head's rows (G heads share a cache when sequences do not
// interleave: with Args::groups they alternate and each refills it). Reasoned, not measured:
// this machine has 2 shared cores.
inline bool forward_transposing(const Args& a, const std::vector<KeyBlock>& blocks) {
    const int64_t sharing = a.groups > 1 ? 1 : a.H / a.Hkv;
    return a.N * sharing >= kCacheFromKeys * a.nthreads && transposing(a, blocks, a.D, a.D);
}

void forward_block(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i0, int64_t i1,
                   Scratch& w) {
    const int64_t nq = i1 - i0, D = a.D, Dv = a.Dv, kvh = h / (a.H / a.Hkv);
    const int64_t ldk = D * a.groups, ldv = Dv * a.groups;  // key and value rows of sequence sq
    const float* kb = a.k + row_of(a, b * a.Hkv + kvh, a.S, sq, 0) * D;
    const float* vb = a.v + row_of(a, b * a.Hkv + kvh, a.S, sq, 0) * Dv;
    float *s = w.s.data(), *qs = w.qs.data(), *acc = w.acc.data();
    int64_t first, end;
    const std::vector<OffsetTile>* tiles =
        offset_candidate(a, plain_scores(a), nq) ? offset_path(a, b, i0, i1, first, end) : nullptr;
    if (tiles) {
        load_q(a, b, h, sq, i0, nq, qs);
        if (a.groups > 1 && i1 == a.N) {  // the last block of sequence sq
            prefetch_next_sequence(a, b * a.H + h, b * a.Hkv + kvh, sq, nq, first, end, false,
                                   false);
        }
        offset_buffers(a, w);
        int64_t ldt;
        const float* kT = offset_window(w.okt, kb, ldk, D, first, end, ldt);
        int64_t lo[kOffsetRuns * kTileRows], hi[kOffsetRuns * kTileRows];
        for (const OffsetTile& t : *tiles) {
            const int64_t r = t.i - i0;
            if (!plain_scores(a)) tile_runs(a, b, t.i, t.n, lo, hi);  // finish_tile_rows's
            forward_offsets(a, b, h, sq, i0, nq, end, qs + r * D, kT, ldt, kb, ldk, vb, ldv, t, lo,
                            hi, w, acc);
        }
        return;
    }
    key_blocks(a, b, h, i0, i1, w.blocks, w.lo.data(), w.hi.data());
    if (a.groups > 1 && i1 == a.N) {  // the last block of sequence sq
        blocks_span(w, first, end);
        prefetch_next_sequence(a, b * a.H + h, b * a.Hkv + kvh, sq, nq, first, end, false, false);
    }
    int64_t widest;
    const bool rows = row_path(a, w, i0, i1, kRowPathKeys, &widest);
    const bool tiled = tile_path(a, w, i0, i1, rows);
    if (!tiled && rows && narrow_path(a, widest)) {  // reads q itself
        if (widest <= kLanes) {
            forward_narrow<1>(a, b, h, sq, i0, i1, kb, ldk, vb, ldv, w);
        } else {
            forward_narrow<kNarrowVectors>(a, b, h, sq, i0, i1, kb, ldk, vb, ldv, w);
        }
        return;
    }
    load_q(a, b, h, sq, i0, nq, qs);
    if (tiled) {
        tile_buffers(a, w);
        each_tile(a, w, i0, i1, [&](int64_t r, int64_t n, const int64_t* lo, const int64_t* hi) {
            forward_tile(a, b, h, sq, i0 + r, n, nq, qs + r * D, kb, ldk, vb, ldv, lo, hi, w,
                         w.acc.data());
        });
        return;
    }
    if (rows) {
        if (w.s.size() < kRowGroup * kRowPathKeys) w.s.resize(kRowGroup * kRowPathKeys);
        each_row(a, w, i0, i1, [&](int64_t r, int64_t n, const int64_t* lo, const int64_t* hi) {
            forward_rows(a, b, h, sq, i0 + r, n, nq, qs + r * D, kb, ldk, vb, ldv, lo, hi,
                         w.s.data(), acc);
        });
        return;
    }
    std::fill(w.m.begin(), w.m.begin() + nq, kNegInf);  // running row max
    std::fill(w.l.begin(), w.l.begin() + nq, 0.0f);     // running sum of exp (before dropout)
    std::fill(acc, acc + nq * Dv, 0.0f);                // unnormalised output
    // S over the thread's transposed keys (AVX-512), as in the backward: MKL's sgemm_ packs
    // both operands on every call (perf, causal N=4096 forward: 10% of it in
    // mkl_blas_def_sgemm_scopy_*, 1.7% in mscale). Forward, B=1, H=8, D=64, 1 thread, AMD EPYC
    // Zen 4, loaded machine, interleaved with the previous kernel, median CPU time: dense
    // N=4096 0.94-0.98x, N=16384 0.94x, causal 0.96-1.00x, N=16384 0.97x, window 256 N=16384
    // 0.98x, prefix-LM N=16384 0.96x; D=128 causal N=4096 1.01x (noise: ~2%). acc += P~ v
    // stays on sgemm_: on gemm_acc.h's tiles it measured 0.99-1.00x alone (MKL packs v once
    // per 512-key call), and their one running sum per output over a block's up to 512 keys
    // took a causal N=257, S=1025 output to 3.7x the naive float32 error (5.9e-6 against
    // 1.6e-6; tests/functional/test_backward_partition.py), where sgemm_ stays within 2x.
    const bool cache = forward_transposing(a, w.blocks);
    for (const KeyBlock& blk : w.blocks) {
        const int64_t j0 = blk.j0, nk = blk.nk;
        w.work += nq * nk;
        times_keys(a, cache, w.kt, kb, ldk, D, nq, qs, D, j0, nk, s, nk);  // S = (scale q) k^T
        for (int64_t r = 0; r < nq; ++r) {
            float* sr = s + r * nk;
            const int64_t i = i0 + r;
            score_mod_row_fwd(a, h, i, j0, nk, sr, nullptr);
            mask_row(a, b, h, i, j0, nk, sr);
            mask_row_structured(a, blk, w.lo.data() + r, w.hi.data() + r, r, sr);
            const float m_new = std::max(w.m[r], row_max(sr, nk));
            const float m_safe = m_new == kNegInf ? 0.0f : m_new;  // nothing seen yet: exp -> 0
            const float alpha = exp_f(w.m[r] - m_safe);
            float sum;
            if (a.keep_t < kNoDropout) {
                const RowKey key = row_key(a, row_of(a, b * a.H + h, a.N, sq, i));
                sum = exp_sum_row<true>(sr, nk, m_safe, key, static_cast<uint32_t>(a.keep_t), j0);
            } else {
                sum = exp_sum_row<false>(sr, nk, m_safe, RowKey{}, 0, j0);
            }
            w.l[r] = w.l[r] * alpha + sum;  // the normaliser counts dropped entries too
            w.m[r] = m_new;
            if (alpha != 1.0f) {
                float* ar = acc + r * Dv;
#pragma omp simd
                for (int64_t e = 0; e < Dv; ++e) ar[e] *= alpha;
            }
        }
        mm_nn(nq, Dv, nk, s, nk, vb + j0 * ldv, ldv, 1.0f, acc, Dv);  // acc += P~ v
    }
    for (int64_t r = 0; r < nq; ++r) {
        write_row(a, qrow(a, b * a.H + h, sq, i0 + r), acc + r * Dv, w.m[r], w.l[r]);
    }
}

}  // namespace
