// The per-row softmax pieces of one score block, shared by the block path and the row path:
// the row's maximum, the forward's exponentials and their sum (with dropout), and the
// backward's P and dS (FlashAttention-2, Dao 2023, Algorithms 1 and 2).
//
// Legend: sr one row of nk scores (keys j0 .. j0 + nk), dr the same row of dP~ in and dS out;
// m the running maximum, lse the forward's log-sum-exp, di D_i = rowsum(dO * O); key, t the
// row's dropout key and keep threshold (dropout.h); kNegInf the score of a hidden key (its
// exponential is 0). row_max, exp_sum_row (forward), grad_row (backward).

#pragma once

#include <cstdint>
#include <limits>

#include "dropout.h"
#include "simd.h"

namespace {

using namespace attnkit_simd;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ------------------------------------------------------------------ elementwise pieces
// (exp_f, the scalar exponential, and the row path's small products live in simd.h; the
// score functions in score_mods.h)

// max over x[0..n); -inf for n = 0; NaNs are passed over (the exponentials carry them on).
// Two vector accumulators, so that consecutive maxima do not wait for each other.
inline float row_max(const float* x, int64_t n) {
    vfloat m0 = splat(kNegInf), m1 = m0;
    int64_t c = 0;
    for (; c + 2 * kLanes <= n; c += 2 * kLanes) {
        m0 = vmax(load(x + c), m0);
        m1 = vmax(load(x + c + kLanes), m1);
    }
    for (; c + kLanes <= n; c += kLanes) m0 = vmax(load(x + c), m0);
    if (c < n) m1 = vmax(load_part(x + c, n - c, kNegInf), m1);
    return hmax(vmax(m1, m0), kNegInf);
}

// The forward's softmax numerators of one row of a block (keys j0 .. j0 + nk): sr[c] =
// exp(sr[c] - m) (FlashAttention-2 Algorithm 1, line 10), with dropout kept only where the
// key's word is below t. Returns their sum before dropout: the normaliser counts dropped
// entries too. One pass; the last partial vector is padded with -inf (exp: 0). Not unrolled:
// the exponential's ~20 operations per vector, not the sum's chain, bound the loop, and on
// AVX2's 16 registers a second vector in flight spilled its constants.
template <bool kDropout>
float exp_sum_row(float* sr, int64_t nk, float m, RowKey key, uint32_t t, int64_t j0) {
    const vfloat mv = splat(m);
    vfloat sum{};
    auto numerators = [&](vfloat x, int64_t c) {
        const vfloat p = exp_v(x - mv);
        sum += p;
        if constexpr (kDropout) return keep_words(key.lo, key.hi, j0 + c) < t ? p : vfloat{};
        return p;
    };
    int64_t c = 0;
    for (; c + kLanes <= nk; c += kLanes) store(sr + c, numerators(load(sr + c), c));
    if (c < nk) store_part(sr + c, numerators(load_part(sr + c, nk - c, kNegInf), c), nk - c);
    return reduce_add(sum);
}

// The backward's dS of one row of a block: P = exp(S - lse) (Algorithm 2, line 11) and
// dS = P * (dP - D_i) (line 13) into dr, P into sr; with dropout (keep mask K from the words)
// dS = (P*K) * dP~ - P * D_i and sr holds P*K, the probabilities dV sees.
template <bool kDropout>
void grad_row(float* sr, float* dr, int64_t nk, float lse, float di, RowKey key, uint32_t t,
              int64_t j0) {
    const vfloat lv = splat(lse), dv = splat(di);
    auto step = [&](vfloat x, vfloat g, int64_t c, vfloat& ds) {
        const vfloat p = exp_v(x - lv);
        if constexpr (kDropout) {
            const vfloat pk = keep_words(key.lo, key.hi, j0 + c) < t ? p : vfloat{};
            ds = pk * g - p * dv;
            return pk;
        }
        ds = p * (g - dv);
        return p;
    };
    int64_t c = 0;
    vfloat ds;
    for (; c + kLanes <= nk; c += kLanes) {
        store(sr + c, step(load(sr + c), load(dr + c), c, ds));
        store(dr + c, ds);
    }
    if (c < nk) {
        const int64_t n = nk - c;
        store_part(sr + c, step(load_part(sr + c, n, kNegInf), load_part(dr + c, n, 0.0f), c, ds), n);
        store_part(dr + c, ds, n);
    }
}

}  // namespace
