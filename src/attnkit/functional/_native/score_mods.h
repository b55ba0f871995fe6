// Score functions (attnkit/functional/score_mods.py, `_native_mod.py`) inside the kernel:
// tanh soft-capping, ALiBi and relative tables on one row of a score block, forward and
// backward. Included by forward.h and backward_block.h (attention_cpu.cpp's translation
// unit).

#pragma once

#include <cmath>
#include <cstdint>

#include "args.h"
#include "dropout.h"
#include "simd.h"

namespace {

using namespace attnkit_simd;

// ------------------------------------------------------------------ score functions

// tanh(x) in float32, branch-free so the loops vectorise: Cephes' tanhf (an odd polynomial for
// |x| < 0.625, 1 - 2 / (exp(2|x|) + 1) beyond, about 2 ulp); tanh(±inf) = ±1, NaN stays NaN.
inline float tanh_f(float x) {
    const float ax = std::fabs(x), z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    const float small = p * z * x + x;
    const float big = 1.0f - 2.0f / (exp_f(2.0f * ax) + 1.0f);
    return ax < 0.625f ? small : std::copysign(big, x);
}

// The relative values of head h and query i, indexed by the key's position: row[kpos_j].
inline const float* rel_row(const Args& a, int64_t h, int64_t i) {
    const int64_t qp = a.rel_qpos ? a.rel_qpos[i] : i;
    return a.rel + h * a.rel_len + a.rel_zero - qp;
}

// The additive terms of one stage (post = 0 before the cap, 1 after) on row i, keys j0..j0+nk.
void score_mod_add(const Args& a, int64_t post, int64_t h, int64_t i, int64_t j0, int64_t nk,
                   float* s) {
    if (a.alibi && a.alibi_post == post) {
        const float m = a.alibi[h];
        const int64_t d0 = j0 - (i + a.alibi_offset);
        if (a.alibi_symmetric) {
#pragma omp simd
            for (int64_t c = 0; c < nk; ++c) s[c] += -m * std::fabs(static_cast<float>(d0 + c));
        } else {
#pragma omp simd
            for (int64_t c = 0; c < nk; ++c) s[c] += m * static_cast<float>(d0 + c);
        }
    }
    if (a.rel && a.rel_post == post) {
        const float* row = rel_row(a, h, i);
        if (a.rel_kpos) {
            const int64_t* kp = a.rel_kpos + j0;
            for (int64_t c = 0; c < nk; ++c) s[c] += row[kp[c]];
        } else {
            row += j0;
#pragma omp simd
            for (int64_t c = 0; c < nk; ++c) s[c] += row[c];
        }
    }
}

inline bool has_score_mod(const Args& a) { return a.softcap > 0.0f || a.alibi || a.rel; }

// Whether a call's scores need nothing between the product and the softmax: no score
// functions, dense mask, bias or dropout (the forward's tiles' lane-by-lane softmax, the
// backward's offset path).
inline bool plain_scores(const Args& a) {
    return !a.mask && !a.bias && !has_score_mod(a) && a.keep_t >= kNoDropout;
}

// Forward: the score function on one row of raw scores s (before bias and masks). With g
// non-null (backward), g[c] = d cap / d s = 1 - tanh^2 is kept for `score_mod_row_bwd`.
void score_mod_row_fwd(const Args& a, int64_t h, int64_t i, int64_t j0, int64_t nk, float* s,
                       float* g) {
    if (!has_score_mod(a)) return;
    score_mod_add(a, 0, h, i, j0, nk, s);
    if (a.softcap > 0.0f) {
        const float cap = a.softcap, inv = 1.0f / a.softcap;
        if (g) {
#pragma omp simd
            for (int64_t c = 0; c < nk; ++c) {
                const float t = tanh_f(s[c] * inv);
                s[c] = cap * t;
                g[c] = 1.0f - t * t;
            }
        } else {
#pragma omp simd
            for (int64_t c = 0; c < nk; ++c) s[c] = cap * tanh_f(s[c] * inv);
        }
    }
    score_mod_add(a, 1, h, i, j0, nk, s);
}

// Gradient of one row's relative values: d rel[h, kpos_j - qpos_i + zero] += ds[c], into this
// thread's copy drel (H, rel_len).
void rel_grad_add(const Args& a, int64_t h, int64_t i, int64_t j0, int64_t nk, const float* ds,
                  float* drel) {
    const int64_t qp = a.rel_qpos ? a.rel_qpos[i] : i;
    float* row = drel + h * a.rel_len + a.rel_zero - qp;
    if (a.rel_kpos) {
        const int64_t* kp = a.rel_kpos + j0;
        for (int64_t c = 0; c < nk; ++c) row[kp[c]] += ds[c];
    } else {
        row += j0;
#pragma omp simd
        for (int64_t c = 0; c < nk; ++c) row[c] += ds[c];
    }
}

// Backward: ds (dS of the final scores) becomes dS of the raw scores, in place; the relative
// values' gradient goes to dtab (this thread's (H, rel_len) copy, null when not wanted).
void score_mod_row_bwd(const Args& a, int64_t h, int64_t i, int64_t j0, int64_t nk, float* ds,
                       const float* g, float* dtab) {
    if (!has_score_mod(a)) return;
    if (dtab && a.rel_post == 1) rel_grad_add(a, h, i, j0, nk, ds, dtab);
    if (a.softcap > 0.0f) {
#pragma omp simd
        for (int64_t c = 0; c < nk; ++c) ds[c] *= g[c];
    }
    if (dtab && a.rel_post == 0) rel_grad_add(a, h, i, j0, nk, ds, dtab);
}

}  // namespace
