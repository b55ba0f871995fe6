// What the forward and the backward share around a query block: each thread's scratch
// buffers, where a position's row lies in the (possibly interleaved) tensors, and loading a
// block's scaled queries.
//
// Legend: Scratch one thread's buffers (s scores, dp dP~, qs scaled queries, acc output or dq,
// m, l running max and sum, blocks the key blocks, lo, hi the rows' runs, work the entries
// computed); row_of the tensor row of position i of sequence r (Args::groups);
// load_q qs = scale * q for a block; ceil_div.

#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "args.h"
#include "masks.h"

namespace {

struct Scratch {
    std::vector<float> s, dp, qs, acc, dob, m, l, dlt, dk, dv;
    std::vector<float> g, dtab;  // score functions: the cap's derivative, this thread's d rel
    std::vector<KeyBlock> blocks;
    std::vector<int64_t> lo, hi;  // each row's runs of keys, run k of row r at k * bq + r
    int64_t work = 0;             // score entries computed by this thread
    explicit Scratch(const Args& a)
        : s(a.bq * a.bk), qs(a.bq * a.D), acc(a.bq * std::max(a.Dv, a.D)), m(a.bq), l(a.bq),
          lo(a.bq * std::max<int64_t>(a.rows_k, 1)), hi(a.bq * std::max<int64_t>(a.rows_k, 1)) {}
};

// The tensor row of position i of sequence r in head `head` (b * H + h for q, out and lse,
// b * Hkv + kvh for k and v) of n positions a sequence: sequences interleave (Args::groups).
inline int64_t row_of(const Args& a, int64_t head, int64_t n, int64_t r, int64_t i) {
    return (head * n + i) * a.groups + r;
}

// Rows i0..i1 of head (b, h), sequence r, pre-scaled: qs (nq, D) = scale * q.
void load_q(const Args& a, int64_t b, int64_t h, int64_t r, int64_t i0, int64_t nq, float* qs) {
    for (int64_t row = 0; row < nq; ++row) {
        const float* src = a.q + row_of(a, b * a.H + h, a.N, r, i0 + row) * a.D;
        float* dst = qs + row * a.D;
#pragma omp simd
        for (int64_t e = 0; e < a.D; ++e) dst[e] = src[e] * a.scale;
    }
}

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

}  // namespace
