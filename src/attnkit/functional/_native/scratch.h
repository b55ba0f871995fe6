// What the forward and the backward share around a query block: each thread's scratch
// buffers, where a position's row lies in the (possibly interleaved) tensors, and loading a
// block's scaled queries.
//
// Legend: Scratch one thread's buffers (s scores, dp dP~, qs scaled queries, acc output or dq,
// m, l running max and sum, blocks the key blocks, lo, hi the rows' runs, work the entries
// computed); row_of the tensor row of position i of sequence r (Args::groups), qrow a
// query's (Args::qrows); dout_row a
// row of dO through its strides; load_q qs = scale * q for a block; ceil_div;
// advise_huge_pages the huge-page hint on a fresh output.

#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "args.h"
#include "masks.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace {

// Floats of one block of scores: bq x bk, or up to bq x kMergeKeys where key_blocks merges a
// table's blocks.
inline int64_t block_floats(const Args& a) {
    return a.bq * (a.table && !a.rows ? std::max(a.bk, kMergeKeys) : a.bk);
}

// One sequence's keys (or values) transposed (transposed.h): row d of t holds the d-th floats
// of all its keys, filled bk keys at a time, key j in column pad + j (the offset path's caches,
// offset_path.h, have pad zero columns either side; the others none).
struct Transposed {
    std::vector<float> t;
    int64_t pad = 0;
    std::vector<uint8_t> ready;  // keys jb * bk .. filled
    const float* src = nullptr;  // the keys they are (null: none yet)
    int64_t first = 0, end = 0, cap = 0;  // a sliding cache's keys and capacity (offset_window)
};

struct Scratch {
    std::vector<float> s, dp, qs, acc, dob, m, l, dlt, dk, dv;
    std::vector<float> g, dtab;  // score functions: the cap's derivative, this thread's d rel
    std::vector<float> tq, tk, ts, tv;  // the tile path's qT, packed keys, scores and values
    const float* packed_k = nullptr;     // the keys in tk (their first row, and how many)
    const float* packed_v = nullptr;     // the values in tv
    int64_t packed_k_n = 0, packed_v_n = 0;
    Transposed kt, vt;           // the backward's keys and values, transposed (transposed.h)
    Transposed okt, ovt;         // the offset path's keys (and the backward's values), padded
    std::vector<KeyBlock> blocks;
    std::vector<int64_t> lo, hi;  // each row's runs of keys, run k of row r at k * bq + r
    int64_t work = 0;             // score entries computed by this thread
    explicit Scratch(const Args& a)
        : s(block_floats(a)), qs(a.bq * a.D), acc(a.bq * std::max(a.Dv, a.D)), m(a.bq), l(a.bq),
          lo(a.bq * std::max<int64_t>(a.rows_k, 1)), hi(a.bq * std::max<int64_t>(a.rows_k, 1)) {}
};

// The tensor row of position i of sequence r in head `head` (b * H + h for q, out and lse,
// b * Hkv + kvh for k and v) of n positions a sequence: sequences interleave (Args::groups).
inline int64_t row_of(const Args& a, int64_t head, int64_t n, int64_t r, int64_t i) {
    return (head * n + i) * a.groups + r;
}

// The tensor row of query position i of sequence r in head `head` (b * H + h) of q, out,
// lse, dO, dlse and dq: row_of's, or through the row map Args::qrows.
inline int64_t qrow(const Args& a, int64_t head, int64_t r, int64_t i) {
    return a.qrows ? head * a.N + a.qrows[i] : row_of(a, head, a.N, r, i);
}

// Row `row` of dO in row_of's numbering of q's rows ((b * H + h) * N * groups + token), its
// entries dout_st[3] apart (Args::dout_st): a broadcast cotangent, such as the ones that
// out.sum().backward() sends, is read in place instead of being copied first.
inline const float* dout_row(const Args& a, int64_t row) {
    const int64_t tokens = a.N * a.groups, bh = row / tokens;
    return a.dout + (bh / a.H) * a.dout_st[0] + (bh % a.H) * a.dout_st[1] +
           (row % tokens) * a.dout_st[2];
}

// Rows i0..i1 of head (b, h), sequence r, pre-scaled: qs (nq, D) = scale * q.
void load_q(const Args& a, int64_t b, int64_t h, int64_t r, int64_t i0, int64_t nq, float* qs) {
    for (int64_t row = 0; row < nq; ++row) {
        const float* src = a.q + qrow(a, b * a.H + h, r, i0 + row) * a.D;
        float* dst = qs + row * a.D;
#pragma omp simd
        for (int64_t e = 0; e < a.D; ++e) dst[e] = src[e] * a.scale;
    }
}

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

// Asks Linux for transparent huge pages on the whole 2 MiB pages inside an output the kernel is
// about to fill (out, dq, dk, dv: fresh tensors of `floats` floats at p), before it first
// touches them. glibc serves tensors this large with fresh mmaps, which fault in 4 KiB at a
// time on the first write: at N=16384, H=8, D=64 each 32 MiB output cost ~24 ms in faults
// against ~0 ms once its pages are 2 MiB (filling a fresh 32 MiB tensor: 36 ms, 12 ms after
// this hint; AMD EPYC Zen 4, THP in "madvise" mode), 15-18% of a sparse forward + backward.
// The hint covers only memory the output owns whole, changes nothing where THP is off or
// "always", and PyTorch gives its own large CPU allocations the same hint under
// THP_MEM_ALLOC_ENABLE (c10/core/alloc_cpu.cpp). A failed hint is ignored.
constexpr int64_t kHugePageBytes = int64_t{1} << 21;
inline void advise_huge_pages(float* p, int64_t floats) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t start = reinterpret_cast<uintptr_t>(p), huge = kHugePageBytes;
    const uintptr_t lo = (start + huge - 1) & ~(huge - 1);
    const uintptr_t hi = (start + static_cast<uintptr_t>(floats) * sizeof(float)) & ~(huge - 1);
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
    (void)p;
    (void)floats;
#endif
}

}  // namespace
