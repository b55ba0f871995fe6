// How the kernel's backward (backward.h) shares its work among threads.
//
// Legend: a "head" here is one kv head of one batch entry and one interleaved sequence
// (B * Hkv * groups of them); each owns its rows of dk and dv, and its G * nqb query blocks
// (G query heads, nqb query blocks each) all add to those rows.
//
// With many heads per thread a work item is a whole head: no two items touch the same dk, dv
// rows, and the sums are added in one fixed order. With few heads per thread (B=1, H=8 on 2
// or 3 threads; one kv head on any), whole heads balance badly: 8 items on 3 threads leave a
// thread idle a quarter of the time, and on a busy machine a thread that lost its core for a
// while holds up the end of the call by up to a whole head. Each head's query blocks are then
// cut into `parts` runs of about equal work (score entries, so that causal and structured
// heads split fairly), the heaviest run started first. Run 0 adds into dk, dv; the others add
// into private slots that cover only the keys they touch, and a second pass adds the slots in
// run order: the result does not depend on the timing, only on the thread count.

#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace attnkit_partition {

// Work items per thread wanted before whole heads are split (dynamic scheduling then leaves at
// most ~1/4 of a thread's work as the tail). Measured (AMD EPYC Zen 4, 2 threads on a loaded
// machine, N=2048-4096, H=8, D=64, fwd+bwd, interleaved with whole heads): 8 a thread (two
// runs a head) was no faster on B=1, H=8 (0.91-1.16x, within the noise) and one kv head in 16
// runs 1.03x slower than in 2: the slots cost more than a short tail.
constexpr int64_t kItemsPerThread = 4;

// One run of a head's query blocks [first, last) (u = g * nqb + query block), the keys
// [klo, khi) they touch, and where its dk, dv sums go: `slot` floats into the slots buffer
// (khi - klo rows of D, then of Dv), or -1: into dk, dv themselves.
struct Run {
    int64_t head, first, last, klo, khi, slot;
    double cost;
};

// The slots' memory may reach twice dk and dv's or this, whichever is more.
constexpr int64_t kSlotBytes = int64_t{64} << 20;

// Runs per head: 1 with enough heads (or one thread); else enough for kItemsPerThread items a
// thread, at most one per query block, within the slots' memory (`kSlotBytes`): a head cut in
// P runs may need P - 1 slots as long as its dk, dv rows, `head_bytes`.
inline int64_t runs_per_head(int64_t heads, int64_t per_head, int64_t threads,
                             int64_t head_bytes) {
    if (threads <= 1 || heads >= kItemsPerThread * threads) return 1;
    const int64_t want = (kItemsPerThread * threads + heads - 1) / heads;
    const int64_t budget = std::max(2 * heads * head_bytes, kSlotBytes);
    const int64_t room = 1 + budget / std::max<int64_t>(1, heads * head_bytes);
    return std::max<int64_t>(1, std::min({per_head, want, room}));
}

// The runs of every head, in head order and run order within a head, P per head (some may be
// empty: first == last). block(head, u, klo, khi) returns query block u's cost (score
// entries) and sets the keys it touches ([0, 0) for none). Slot offsets are assigned to runs
// 1.. of each head; `slot_floats` receives the slots' total size.
template <typename Block>
std::vector<Run> plan_runs(int64_t heads, int64_t per_head, int64_t P, int64_t D, int64_t Dv,
                           Block&& block, int64_t& slot_floats) {
    std::vector<Run> runs;
    runs.reserve(heads * P);
    slot_floats = 0;
    std::vector<double> cost(per_head);
    std::vector<int64_t> lo(per_head), hi(per_head);
    for (int64_t head = 0; head < heads; ++head) {
        double total = 0.0;
        for (int64_t u = 0; u < per_head; ++u) total += cost[u] = block(head, u, lo[u], hi[u]);
        // block u goes to run floor(P * (work ahead of u) / total): runs of about total / P
        std::vector<Run> own(P);
        for (int64_t p = 0; p < P; ++p) own[p] = Run{head, 0, 0, INT64_MAX, 0, -1, 0.0};
        double before = 0.0;
        int64_t p_prev = 0;
        for (int64_t u = 0; u < per_head; ++u) {
            const int64_t p = total > 0.0 ? std::min<int64_t>(P - 1, static_cast<int64_t>(before * P / total)) : 0;
            for (int64_t q = p_prev + 1; q <= p; ++q) own[q].first = own[q].last = u;
            p_prev = p;
            Run& r = own[p];
            r.last = u + 1;
            r.cost += cost[u];
            before += cost[u];
            if (lo[u] < hi[u]) r.klo = std::min(r.klo, lo[u]), r.khi = std::max(r.khi, hi[u]);
        }
        for (int64_t q = p_prev + 1; q < P; ++q) own[q].first = own[q].last = per_head;
        for (int64_t p = 0; p < P; ++p) {
            Run& r = own[p];
            if (r.klo >= r.khi) r.klo = r.khi = 0;  // touches no key
            if (p > 0 && r.khi > r.klo) {
                r.slot = slot_floats;
                slot_floats += (r.khi - r.klo) * (D + Dv);
            }
            runs.push_back(r);
        }
    }
    return runs;
}

// The runs' indices, heaviest first (ties: in plan order), for a dynamic schedule.
inline std::vector<int64_t> heaviest_first(const std::vector<Run>& runs) {
    std::vector<int64_t> order(runs.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return runs[x].cost > runs[y].cost; });
    return order;
}

}  // namespace attnkit_partition
