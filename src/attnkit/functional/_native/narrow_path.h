// The narrow path: the forward of a row-path block (row_path.h) with plain scores (no score
// functions, dense mask, bias or dropout) whose rows each see at most kNarrowVectors vectors
// of keys (windows of up to 32 keys on AVX-512, 16 on AVX2), kRowGroup rows stage by stage,
// each row in registers from the product to the output: the scores of four keys summed into
// one 128-bit vector (sums4) and placed in the row's score vectors, the softmax on those
// registers, the weighted sum of the values normalised on its way to out; the queries read
// where they lie and scaled in registers (no load_q pass over the block). The row path
// (forward_rows, finish_rows) stores its scores, reloads them through its score functions and
// masks, and stores an unnormalised output that write_row reads again.
// Measured (AMD EPYC Zen 4, 1 thread, N=4096, H=8, D=64, kernel built for AVX-512, row path ->
// narrow path interleaved in one process, fastest of 9-15 rounds, thread CPU time): windows of
// 1, 9 and 17 keys forward 0.79-0.86x, 0.86-0.89x and 0.88-0.90x the time (windows of 9 keys
// ~97 ns a row, of which the products q k^T ~40 ns and P v ~19 ns: removing each in a scratch
// build). Tried and no faster: the same registers for the backward's rows (S, dP~, P and dS;
// 0.95-1.02x of the row path's, whose dK, dV and set-up dominate), the scale applied to the
// scores instead of q, one vector logarithm for a group's lse, 2 or 8 rows a group, prefetching
// 16 or 32 rows ahead; streaming stores of out were 1.09-1.13x slower.
//
// Legend: kNarrowVectors the widest row in vectors; narrow_path whether a block takes it;
// group_dots up to four dot products, narrow_scores a row's scores; forward_narrow a block's
// rows. x86 with AVX2 or AVX-512 only (sums4, keep_below); elsewhere the row path computes them.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "args.h"
#include "row_path.h"
#include "scratch.h"
#include "score_mods.h"
#include "simd.h"
#include "softmax_row.h"

namespace {

using namespace attnkit_simd;

constexpr int kNarrowVectors = 2;

#if defined(__AVX2__)
constexpr bool kNarrowPath = true;
#else
constexpr bool kNarrowPath = false;
#endif

// Whether a block on the row path whose widest row sees `widest` keys takes the narrow path:
// plain scores (no dropout).
inline bool narrow_path(const Args& a, int64_t widest) {
    return kNarrowPath && plain_scores(a) && widest <= kNarrowVectors * kLanes;
}

#if defined(__AVX2__)
// The K <= 4 dot products (scale x) . row k of y (rows ld apart, D wide) as the first K lanes of
// a 128-bit vector (the others repeat the first's): K independent chains of multiply-adds,
// sharing the loads of x, reduced together (sums4).
template <int K>
inline __m128 group_dots(const float* x, vfloat sc, const float* y, int64_t ld, int64_t D) {
    vfloat acc[K] = {};
    int64_t e = 0;
    for (; e + kLanes <= D; e += kLanes) {
        const vfloat xv = load(x + e) * sc;
        for (int k = 0; k < K; ++k) acc[k] += xv * load(y + k * ld + e);
    }
    if (e < D) {  // the last partial vector, as dots' (simd.h)
        const vfloat xv = load_part(x + e, D - e, 0.0f) * sc;
        for (int k = 0; k < K; ++k) acc[k] += xv * load_part(y + k * ld + e, D - e, 0.0f);
    }
    return sums4(acc[0], acc[K > 1 ? 1 : 0], acc[K > 2 ? 2 : 0], acc[K > 3 ? 3 : 0]);
}

// The scores (scale x) . row c of y (rows ld apart, D wide; scale x is load_q's, in registers)
// for c < nk (1 <= nk <= NV * kLanes) in sv[0..NV), key c in lane c % kLanes of vector
// c / kLanes, the lanes from nk on -inf: four keys at a time, the last group only its own.
template <int NV>
inline void narrow_scores(const float* x, float scale, const float* y, int64_t ld, int64_t D,
                          int64_t nk, vfloat* sv) {
    const vfloat sc = splat(scale);
    constexpr int kGroups = NV * kLanes / 4;
    __m128 g[kGroups];
    for (int c4 = 0; c4 < kGroups; ++c4) {
        const int64_t c = 4 * c4, left = nk - c;
        const float* yc = y + c * ld;
        if (left >= 4) {
            g[c4] = group_dots<4>(x, sc, yc, ld, D);
        } else if (left == 3) {
            g[c4] = group_dots<3>(x, sc, yc, ld, D);
        } else if (left == 2) {
            g[c4] = group_dots<2>(x, sc, yc, ld, D);
        } else if (left == 1) {
            g[c4] = group_dots<1>(x, sc, yc, ld, D);
        } else {
            g[c4] = _mm_set1_ps(kNegInf);
        }
    }
    for (int v = 0; v < NV; ++v) {
#if defined(__AVX512F__)
        __m512 s = _mm512_castps128_ps512(g[4 * v]);
        s = _mm512_insertf32x4(s, g[4 * v + 1], 1);
        s = _mm512_insertf32x4(s, g[4 * v + 2], 2);
        sv[v] = _mm512_insertf32x4(s, g[4 * v + 3], 3);
#else
        sv[v] = _mm256_set_m128(g[2 * v + 1], g[2 * v]);
#endif
        const int64_t left = nk - v * kLanes;  // keys in this vector
        if (left < kLanes) sv[v] = keep_below(sv[v], std::max<int64_t>(left, 0), kNegInf);
    }
}

// Forward of the rows i0..i1 of a block of head (b, h), sequence sq, on the narrow path (every
// row at most NV vectors of keys: narrow_path): the queries read from q and scaled in
// registers, keys and values kb, vb (ldk, ldv apart). out and lse as write_row writes them:
// finish_rows's softmax, lane by lane (exp_v, one reduce_add of a row's exponentials), the
// weighted sum times inv_keep / l. Rows are counted in w.work as each_row counts them.
template <int NV>
void forward_narrow(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i0, int64_t i1,
                    const float* kb, int64_t ldk, const float* vb, int64_t ldv, Scratch& w) {
    constexpr int64_t G = kRowGroup;
    const int64_t head = b * a.H + h, nq = i1 - i0, D = a.D, Dv = a.Dv;
    int64_t first, end;
    blocks_span(w, first, end);
    alignas(64) float p[G][NV * kLanes];
    for (int64_t r = 0; r < nq; r += G) {
        const int64_t n = std::min(G, nq - r);
        int64_t lo[G], nk[G];
        vfloat sv[G][NV];
        for (int64_t u = 0; u < n; ++u) {
            int64_t hi;
            row_span(a, w, r + u, i0 + r + u, first, end, lo[u], hi);
            nk[u] = hi - lo[u];
            w.work += nk[u];
            prefetch_forward(a, head, sq, i0 + r + u, nq, kb, ldk, vb, ldv, hi);
            const float* x = a.q + qrow(a, head, sq, i0 + r + u) * D;
            if (nk[u] > 0) narrow_scores<NV>(x, a.scale, kb + lo[u] * ldk, ldk, D, nk[u], sv[u]);
        }
        float m[G], l[G];
        for (int64_t u = 0; u < n; ++u) {
            if (nk[u] == 0) continue;
            vfloat mv = splat(kNegInf);
            for (int v = 0; v < NV; ++v) mv = vmax(sv[u][v], mv);  // NaN lanes passed over
            m[u] = hmax(mv, kNegInf);
            const float m_safe = m[u] == kNegInf ? 0.0f : m[u];
            vfloat sum{};
            for (int v = 0; v < NV; ++v) {
                const vfloat pv = exp_v(sv[u][v] - splat(m_safe));
                sum += pv;
                store(p[u] + v * kLanes, pv);
            }
            l[u] = reduce_add(sum);
        }
        for (int64_t u = 0; u < n; ++u) {
            const int64_t row = qrow(a, head, sq, i0 + r + u);
            float* o = a.out + row * Dv;
            if (nk[u] == 0) {  // the row sees nothing: out 0, lse -inf (write_row's l == 0)
                std::fill(o, o + Dv, 0.0f);
                a.lse[row] = kNegInf;
                continue;
            }
            const float f = l[u] > 0.0f ? a.inv_keep / l[u] : 0.0f;
            const float* x = vb + lo[u] * ldv;
            combine_rows<false, true>(o, Dv, p[u], 1, nk[u],
                                      [x, ldv](int64_t c) { return x + c * ldv; }, f);
            a.lse[row] = l[u] > 0.0f ? m[u] + std::log(l[u]) : (l[u] == 0.0f ? kNegInf : l[u]);
        }
    }
}
#else
template <int NV>
void forward_narrow(const Args&, int64_t, int64_t, int64_t, int64_t, int64_t, const float*,
                    int64_t, const float*, int64_t, Scratch&) {}
#endif

}  // namespace
