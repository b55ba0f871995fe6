// Masks inside the kernel: which keys each row of a query block computes, and the scores of
// the keys it must not see. Dense masks and bias are applied to a block's scores row by row;
// structured masks (attnkit/functional/_mask_plan.py) decide which key blocks are computed at
// all, and within them hide keys outside each row's runs and where a partial tile says no.
//
// Legend: at the entry of a broadcast (B, H, N, S) view; mask_row bias, dense mask and causal
// limit on one row; KeyBlock one key block (j0, nk, tile) of a query block;
// mask_row_structured runs and tiles on one row; key_end the causal end of a query block's
// keys; stretches the union of its rows' runs ("stretches" of keys); key_blocks the key
// blocks a query block computes. Runs: Args::rows, rows_k of them a row, copied as
// lo[k * bq + r], hi[k * bq + r] (run k of row r).

#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "args.h"
#include "softmax_row.h"

namespace {

// Entry (b, h, i, j0) of a broadcast (B, H, N, S) view given by four element strides.
template <typename T>
const T* at(const T* base, const int64_t* st, int64_t b, int64_t h, int64_t i, int64_t j0) {
    return base + b * st[0] + h * st[1] + i * st[2] + j0 * st[3];
}

// Scores of one row of a block: add bias, block masked keys and keys past the causal limit.
void mask_row(const Args& a, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t nk, float* s) {
    if (a.bias) {
        const float* br = at(a.bias, a.bias_st, b, h, i, j0);
        const int64_t sj = a.bias_st[3];
        if (sj == 1) {
#pragma omp simd
            for (int64_t c = 0; c < nk; ++c) s[c] += br[c];
        } else {
            for (int64_t c = 0; c < nk; ++c) s[c] += br[c * sj];
        }
    }
    if (a.mask) {
        const uint8_t* mr = at(a.mask, a.mask_st, b, h, i, j0);
        const int64_t sj = a.mask_st[3];
        if (sj == 1) {
#pragma omp simd
            for (int64_t c = 0; c < nk; ++c) s[c] = mr[c] ? s[c] : kNegInf;
        } else {
            for (int64_t c = 0; c < nk; ++c) s[c] = mr[c * sj] ? s[c] : kNegInf;
        }
    }
    if (a.causal) {
        const int64_t first_hidden = i + (a.S - a.N) + 1 - j0;  // first column past the limit
        for (int64_t c = std::max<int64_t>(first_hidden, 0); c < nk; ++c) s[c] = kNegInf;
    }
}

// One key block of a query block: keys j0 .. j0 + nk, and the partial tile's row 0 column 0
// at this block's first key (null: no tile mask); or, where key_blocks merged adjacent blocks
// of the table's grid (`tab`, j0 on the grid), the table entries of its bk-wide parts.
struct KeyBlock {
    int64_t j0, nk;
    const uint8_t* tile;
    const int32_t* tab;
};

// Adjacent non-empty blocks of a table (no runs) are merged into one product of up to this
// many keys (grids with wider blocks keep theirs): a 2-D neighbourhood's query tile sees 3
// runs of 3 adjacent key tiles, 7.6 products of 64 x 64 x 64 a query block on 64 x 64 blocks
// (15 x 15 kernel), each packed by MKL (the packing ~8 % of the forward, perf), 3 once merged.
// Measured (AMD EPYC Zen 4, 1 thread, H=8, D=64, two kernel builds interleaved in one
// process, fastest of 11, unmerged -> merged): NATTEN 15 x 15 on 64 x 64 forward 65.9 -> 57.0
// ms, forward + backward 213 -> 190; on 128 x 128 302 -> 263 and 918 -> 871; 7 x 7 on 128 x 128
// (4 x 4 tiles, 16 x 32 blocks) 160 -> 145 and 505 -> 474; a predicate |i - j| < 200 at
// N=4096 (64 x 128 blocks) 69.8 -> 66.7 and 233 -> 228. A second run: 0.86-0.92x throughout.
constexpr int64_t kMergeKeys = 256;

// Structured masks on one row of a block: keys outside the row's runs (lo[k * bq], hi[k * bq]
// for k < rows_k: sorted, disjoint, empty ones lo >= hi; one fill per gap) and where the tile
// says no.
void mask_row_structured(const Args& a, const KeyBlock& kb, const int64_t* lo, const int64_t* hi,
                         int64_t r, float* s) {
    if (a.rows) {
        int64_t c = 0;  // columns before c are settled
        for (int64_t k = 0; k < a.rows_k; ++k) {
            const int64_t l = lo[k * a.bq], h = hi[k * a.bq];
            if (l >= h) continue;
            const int64_t from = std::min(std::max<int64_t>(l - kb.j0, 0), kb.nk);
            for (; c < from; ++c) s[c] = kNegInf;
            c = std::max(c, std::min(std::max<int64_t>(h - kb.j0, 0), kb.nk));
        }
        for (; c < kb.nk; ++c) s[c] = kNegInf;
    }
    if (kb.tile) {
        const uint8_t* t = kb.tile + r * a.bk;
#pragma omp simd
        for (int64_t c = 0; c < kb.nk; ++c) s[c] = t[c] ? s[c] : kNegInf;
    }
    if (kb.tab) {  // merged blocks: each part's tile, if partial
        for (int64_t p = 0; p * a.bk < kb.nk; ++p) {
            if (kb.tab[p] < 0) continue;  // full
            const uint8_t* t = a.tiles + (kb.tab[p] * a.bq + r) * a.bk;
            float* sp = s + p * a.bk;
            const int64_t n = std::min(a.bk, kb.nk - p * a.bk);
#pragma omp simd
            for (int64_t c = 0; c < n; ++c) sp[c] = t[c] ? sp[c] : kNegInf;
        }
    }
}

// End (exclusive) of the keys that rows i0..i1-1 may see at all under `causal`.
inline int64_t key_end(const Args& a, int64_t i1) {
    return a.causal ? std::min(a.S, std::max<int64_t>(i1 + a.S - a.N, 0)) : a.S;
}

// The stretches of keys [first, end) some row of a query block sees: the union of the rows'
// runs (cut at `end`), ascending, disjoint and not touching. From rows' runs lo, hi (k * bq + r).
void stretches(const Args& a, int64_t nq, const int64_t* lo, const int64_t* hi, int64_t end,
               std::vector<std::pair<int64_t, int64_t>>& out) {
    out.clear();
    if (a.rows_k == 1) {  // one run a row, in order (windows, causal, documents): merged as read
        bool ordered = true;
        for (int64_t r = 0; r < nq && ordered; ++r) {
            const int64_t l = lo[r], h = std::min(hi[r], end);
            if (l >= h) continue;
            ordered = out.empty() || l >= out.back().first;
            if (ordered && !out.empty() && l <= out.back().second) {
                out.back().second = std::max(out.back().second, h);
            } else if (ordered) {
                out.push_back({l, h});
            }
        }
        if (ordered) return;
        out.clear();  // out of order: sorted and merged below
    }
    for (int64_t k = 0; k < a.rows_k; ++k) {
        for (int64_t r = 0; r < nq; ++r) {
            const int64_t l = lo[k * a.bq + r], h = std::min(hi[k * a.bq + r], end);
            if (l < h) out.push_back({l, h});
        }
    }
    // rows' single intervals mostly come in order already (windows, causal, documents)
    if (!std::is_sorted(out.begin(), out.end())) std::sort(out.begin(), out.end());
    size_t n = 0;
    for (const auto& x : out) {
        if (n > 0 && x.first <= out[n - 1].second) {
            out[n - 1].second = std::max(out[n - 1].second, x.second);
        } else {
            out[n++] = x;
        }
    }
    out.resize(n);
}

// The runs of rows i0..i1-1 of batch row b (Args::rows): run k of row r to lo[k * bq + r],
// hi[k * bq + r].
inline void copy_runs(const Args& a, int64_t b, int64_t i0, int64_t i1, int64_t* lo, int64_t* hi) {
    for (int64_t k = 0; k < a.rows_k; ++k) {
        const int64_t* rl = a.rows + k * a.rows_kst + b * a.rows_bst + i0;
        std::copy(rl, rl + (i1 - i0), lo + k * a.bq);
        std::copy(rl + a.rows_half, rl + a.rows_half + (i1 - i0), hi + k * a.bq);
    }
}

// The key blocks rows i0..i1-1 of head (b, h) compute, in order: each stretch of keys some row
// sees (`stretches`; rows that see nothing add nothing), cut by the causal end, in blocks of bk
// from its first key; on the table's grid instead when there is a table, without the blocks it
// marks empty. Rows' own runs go to lo[k * bq + r], hi[k * bq + r].
void key_blocks(const Args& a, int64_t b, int64_t h, int64_t i0, int64_t i1,
                std::vector<KeyBlock>& out, int64_t* lo, int64_t* hi) {
    thread_local std::vector<std::pair<int64_t, int64_t>> spans;
    out.clear();
    const int64_t end = key_end(a, i1);
    spans.assign(1, {0, end});
    if (a.rows) {
        copy_runs(a, b, i0, i1, lo, hi);
        stretches(a, i1 - i0, lo, hi, end, spans);
    }
    const int64_t nkb = (a.S + a.bk - 1) / a.bk, qb = i0 / a.bq;
    const int32_t* row =
        a.table ? a.table + b * a.table_st[0] + h * a.table_st[1] + qb * nkb : nullptr;
    for (const auto& [first, last] : spans) {
        if (!a.table) {
            for (int64_t j0 = first; j0 < last; j0 += a.bk) out.push_back({j0, std::min(a.bk, last - j0), nullptr, nullptr});
            continue;
        }
        for (int64_t kb = first / a.bk; kb * a.bk < last; ++kb) {
            const int32_t t = row[kb];
            if (t == -1) continue;
            const int64_t j0 = std::max(kb * a.bk, first), j1 = std::min((kb + 1) * a.bk, last);
            if (!a.rows) {  // j0 on the grid: merged with the block before where adjacent
                KeyBlock* prev = out.empty() ? nullptr : &out.back();
                if (prev && prev->j0 + prev->nk == j0 && prev->nk + a.bk <= kMergeKeys) {
                    prev->nk += j1 - j0;
                } else {
                    out.push_back({j0, j1 - j0, nullptr, row + kb});
                }
                continue;
            }
            const uint8_t* tile = t >= 0 ? a.tiles + t * a.bq * a.bk + (j0 - kb * a.bk) : nullptr;
            out.push_back({j0, j1 - j0, tile, nullptr});
        }
    }
}

}  // namespace
