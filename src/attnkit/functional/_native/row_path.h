// The row path: a query block whose rows each see a few keys of a wider span (a narrow
// window) is computed a row at a time over each row's own keys, kRowGroup rows stage by stage,
// instead of by matrix products over key blocks. Which blocks take it, how their rows are
// walked, and the software prefetch that keeps the rows' data coming (forward.h's
// forward_rows and backward_block.h's backward_rows compute the rows; narrow_path.h's
// forward_narrow the forward's rows of at most 2 vectors of keys with plain scores).
//
// Legend: kRowPathKeys, kRowPathKeysBackward the widest row the path takes; row_span a row's
// keys [lo, hi); blocks_span the key blocks' span [first, end); row_path whether a block takes
// the path; kRowGroup rows computed together; each_row walks a block's rows in groups;
// kAhead, prefetch_forward, prefetch_next_sequence the prefetch (Args::groups interleaving).

#pragma once

#include <algorithm>
#include <cstdint>

#include "args.h"
#include "masks.h"
#include "scratch.h"
#include "simd.h"

namespace {

using namespace attnkit_simd;

// ------------------------------------------------------------------ the row path
// A block whose rows each see a few keys of a wider span (a narrow window: nq rows span
// w + nq - 1 keys) is computed a row at a time over each row's own keys, without matrix
// products, whose set-up (the BLAS packs its operands) costs more than their work there. Same
// masks, score functions, dropout and softmax as the block path. Measured (AMD EPYC Zen 4,
// 1 thread, N=4096, H=8, D=64, forward, fastest of 15, block path -> row path): two-sided
// windows of 9, 17, 31, 47 and 63 keys 10.6 -> 5.2, 10.4 -> 6.1, 14.3 -> 7.6, 16.5 -> 10.2 and
// 18.3 -> 15.8 ms, causal windows of 32 and 64 keys 14.8 -> 7.5 and 19.2 -> 14.4 ms; from
// about 96 keys on the blocks are as fast or faster, and where the span is no wider than the
// rows (short interleaved sequences, small documents) the row path only re-reads the keys.
// The backward's rows do twice the dot products: forward + backward, windows of 9 and 17 keys
// 28.0 -> 18.8 and 26.4 -> 21.3 ms, 33 keys 33.7 -> 30.8 (within the noise), 63 keys slower
// (48.1 -> 50.9).
constexpr int64_t kRowPathKeys = 64;          // the widest row of a forward row-path block
constexpr int64_t kRowPathKeysBackward = 32;  // and of a backward one
// The row length of the backward's row buffers: the widest row of either of its paths (the
// offset path's blocks, offset_backward.h's kOffsetKeys, send their clipped rows here).
constexpr int64_t kRowStrideBackward = 64;


// The keys [lo, hi) of row r (query i) of a block on the row path: its interval, cut by the
// causal limit and the key blocks' span [first, end).
inline void row_span(const Args& a, const Scratch& w, int64_t r, int64_t i, int64_t first,
                     int64_t end, int64_t& lo, int64_t& hi) {
    lo = a.rows ? std::max(w.lo[r], first) : first;
    hi = a.rows ? std::min(w.hi[r], end) : end;
    if (a.causal) hi = std::min(hi, i + a.S - a.N + 1);
    hi = std::max(hi, lo);
}

// The keys [first, end) the key blocks of a query block span ([0, 0) when there are none).
inline void blocks_span(const Scratch& w, int64_t& first, int64_t& end) {
    first = w.blocks.empty() ? 0 : w.blocks.front().j0;
    end = w.blocks.empty() ? 0 : w.blocks.back().j0 + w.blocks.back().nk;
}

// Whether rows i0..i1 take the row path: no tiles, every row's keys at most `limit`
// (kRowPathKeys, kRowPathKeysBackward), and the blocks' span wider than the widest row (its
// keys into *widest_out where given).
bool row_path(const Args& a, const Scratch& w, int64_t i0, int64_t i1, int64_t limit,
              int64_t* widest_out = nullptr) {
    if (a.table || a.rows_k > 1) return false;  // rows with several runs: the blocks
    int64_t first, end, widest = 0;
    blocks_span(w, first, end);
    for (int64_t r = 0; r < i1 - i0; ++r) {
        int64_t lo, hi;
        row_span(a, w, r, i0 + r, first, end, lo, hi);
        widest = std::max(widest, hi - lo);
    }
    if (widest_out) *widest_out = widest;
    return widest <= limit && end - first > widest;
}

// Rows a row-path call computes together (forward_rows): a row of a narrow window is one
// chain of dependent steps (dot products -> max -> exponentials -> sum -> weighted sum -> log),
// ~100 ns of mostly waiting for a window of 9 keys (AMD EPYC Zen 4); taken stage by stage for
// four independent rows, the chains overlap. Where a row's time goes (one key a row, kernel
// only, CPU time, N=4096, D=64): ~60 ns with every tensor in cache (H=1), ~90 ns at H=8 (32 MiB
// of q, k, v, out), perf showing the waits at the prefetch instructions. Tried and slower or no
// faster (A/B in one process): 8 rows a group (1.14-1.23x the time), the softmax of 16 rows at
// once one vector lane a row (one max, exp and log a column, no reductions across lanes: 1.2x
// faster in cache, 0.84-0.98x at H=8), streaming stores of out (no change), prefetching 4 or
// 16 rows ahead instead of 8 (no change), without the q or the k, v prefetch (1.1-1.15x).
constexpr int64_t kRowGroup = 4;

// Calls rows(r, n, lo, hi) for rows r..r+n-1 (n <= kRowGroup) of rows i0..i1 on the row path,
// lo[u], hi[u] the keys of row r + u (`row_span`), counting them as computed.
template <typename F>
void each_row(const Args& a, Scratch& w, int64_t i0, int64_t i1, F&& rows) {
    int64_t first, end;
    blocks_span(w, first, end);
    for (int64_t r = 0; r < i1 - i0; r += kRowGroup) {
        const int64_t n = std::min(kRowGroup, i1 - i0 - r);
        int64_t lo[kRowGroup], hi[kRowGroup];
        for (int64_t u = 0; u < n; ++u) {
            row_span(a, w, r + u, i0 + r + u, first, end, lo[u], hi[u]);
            w.work += hi[u] - lo[u];
        }
        rows(r, n, lo, hi);
    }
}

// Software prefetch on the row path, kAhead rows ahead: each row reads its query, writes its
// output and reads one key and value row more than the row before (a window's newest), so
// the rows kAhead queries and keys on are fetched while this one computes. Measured (perf,
// forward of a window of 9 keys, N=4096): the loads of q and the stores of out missing the
// cache were ~35% of the time; the hardware prefetcher does not follow interleaved
// sequences, whose rows lie D * groups floats apart (Args::groups).
constexpr int64_t kAhead = 8;

// The forward's, at query i of a block of nq rows: the query i + nq (the next block's, same
// head and sequence: load_q reads a block's queries at once), out of query i + kAhead, the
// key and value hi - 1 + kAhead.
inline void prefetch_forward(const Args& a, int64_t head, int64_t sq, int64_t i, int64_t nq,
                      const float* kb, int64_t ldk, const float* vb, int64_t ldv, int64_t hi) {
    if (i + nq < a.N) prefetch_row_l2(a.q + qrow(a, head, sq, i + nq) * a.D, a.D);
    if (i + kAhead < a.N) prefetch_row_w(a.out + qrow(a, head, sq, i + kAhead) * a.Dv, a.Dv);
    if (hi > 0 && hi - 1 + kAhead < a.S) {
        prefetch_row_l2(kb + (hi - 1 + kAhead) * ldk, a.D);
        prefetch_row_l2(vb + (hi - 1 + kAhead) * ldv, a.Dv);
    }
}

// Interleaved sequences (Args::groups > 1) lie D * groups floats a row apart, too far for the
// hardware prefetcher (a strided mask's 16-position sequences at N = 4096: 64 KiB): at the
// last query block of sequence sq, whose next work item is the first block of sequence sq + 1
// (each of its rows next to one of sq's) in query head `head`, that block's rows [0, nq) of
// q and out and the rows [first, end) of k and v (this block's key span: the next one's too
// where every sequence sees all of its keys, as a strided mask's) are fetched into L2 while
// this block computes; for the backward (`backward`) also the dO and dq rows, and the dK and
// dV rows where they are accumulated in place (`in_place`).
// Without it a strided 1/256 forward took 1.14x the time, prefetching one line of each row
// (the adjacent lines left to the hardware) 1.14x, and computing those 16 x 16 sequences on
// the row path instead of the blocks 1.0x forward, slower backward (1/64: 2x forward).
void prefetch_next_sequence(const Args& a, int64_t head, int64_t kvhead, int64_t sq, int64_t nq,
                            int64_t first, int64_t end, bool backward, bool in_place) {
    if (sq + 1 >= a.groups) return;
    for (int64_t i = 0; i < std::min(nq, a.N); ++i) {
        const int64_t row = row_of(a, head, a.N, sq + 1, i);
        prefetch_row_l2(a.q + row * a.D, a.D);
        prefetch_row_l2(a.out + row * a.Dv, a.Dv);
        if (backward) {
            prefetch_row_l2(dout_row(a, row), a.Dv);
            prefetch_row_l2(a.dq + row * a.D, a.D);
        }
    }
    for (int64_t j = first; j < end; ++j) {
        const int64_t row = row_of(a, kvhead, a.S, sq + 1, j);
        prefetch_row_l2(a.k + row * a.D, a.D);
        prefetch_row_l2(a.v + row * a.Dv, a.Dv);
        if (backward && in_place) {
            prefetch_row_l2(a.dk + row * a.D, a.D);
            prefetch_row_l2(a.dv + row * a.Dv, a.Dv);
        }
    }
}

}  // namespace
