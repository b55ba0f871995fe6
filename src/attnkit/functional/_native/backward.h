// The backward pass over a call: its work items (runs of a kv head's query blocks, planned by
// partition.h), the private slots of runs that do not own their head's dk, dv rows, and the
// pass that adds the slots in a fixed order afterwards.
//
// Legend: backward the whole pass (write: fill dk, dv instead of adding); backward_runs the
// work items (attnkit_partition::Run: head, query blocks first..last, key span klo..khi, slot);
// add_slots the slots' sums into dk, dv; zero_rows a head's dk, dv rows; rebase a slot's rows
// addressed from key 0.

#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "args.h"
#include "backward_block.h"
#include "masks.h"
#include "partition.h"
#include "scratch.h"

namespace {

// ------------------------------------------------------------------ the backward's work items
using attnkit_partition::heaviest_first;
using attnkit_partition::Run;
using attnkit_partition::runs_per_head;

// The address p - n (floats) as an integer sum: a slot's rows are addressed by key position
// from 0, and only rows klo.. of it are ever read or written.
inline float* rebase(float* p, int64_t n) {
    return reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(p) -
                                    static_cast<uintptr_t>(n) * sizeof(float));
}

// The runs of the backward (`attnkit_partition::plan_runs`) with P per head; for P = 1 the
// whole heads, without looking at their blocks.
std::vector<Run> backward_runs(const Args& a, int64_t heads, int64_t per_head, int64_t P,
                               int64_t& slot_floats) {
    slot_floats = 0;
    if (P == 1) {
        std::vector<Run> runs(heads);
        for (int64_t head = 0; head < heads; ++head) runs[head] = Run{head, 0, per_head, 0, 0, -1, 0.0};
        return runs;
    }
    const int64_t G = a.H / a.Hkv, nqb = ceil_div(a.N, a.bq);
    std::vector<KeyBlock> blocks;
    std::vector<int64_t> lo(a.bq * std::max<int64_t>(a.rows_k, 1)), hi(lo.size());  // rows' runs
    // score entries and key span of query block u of a head (the same for every sequence)
    auto block = [&](int64_t head, int64_t u, int64_t& klo, int64_t& khi) {
        const int64_t bk = head / a.groups, b = bk / a.Hkv, h = (bk % a.Hkv) * G + u / nqb;
        const int64_t i0 = (u % nqb) * a.bq, i1 = std::min(i0 + a.bq, a.N);
        key_blocks(a, b, h, i0, i1, blocks, lo.data(), hi.data());
        klo = khi = 0;
        double entries = 0.0;
        for (const KeyBlock& blk : blocks) entries += static_cast<double>(blk.nk) * (i1 - i0);
        if (!blocks.empty()) klo = blocks.front().j0, khi = blocks.back().j0 + blocks.back().nk;
        return entries;
    };
    return attnkit_partition::plan_runs(heads, per_head, P, a.D, a.Dv, block, slot_floats);
}

// Adds the slots of runs 1.. of each head to its dk, dv rows, in run order, the keys shared
// among the threads in chunks (called by every thread of the backward's parallel region).
void add_slots(const Args& a, const std::vector<Run>& runs, int64_t P, const float* slots) {
    constexpr int64_t kChunk = 128;  // keys
    const int64_t chunks = ceil_div(a.S, kChunk), heads = static_cast<int64_t>(runs.size()) / P;
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < heads * chunks; ++c) {
        const int64_t head = c / chunks, j0 = (c % chunks) * kChunk;
        const int64_t j1 = std::min(j0 + kChunk, a.S), sq = head % a.groups, bk = head / a.groups;
        float* dk = a.dk + row_of(a, bk, a.S, sq, 0) * a.D;
        float* dv = a.dv + row_of(a, bk, a.S, sq, 0) * a.Dv;
        for (int64_t p = 1; p < P; ++p) {
            const Run& run = runs[head * P + p];
            if (run.slot < 0) continue;
            const float* sk = slots + run.slot;
            const float* sv = sk + (run.khi - run.klo) * a.D;
            for (int64_t j = std::max(j0, run.klo); j < std::min(j1, run.khi); ++j) {
                float* dkj = dk + j * a.groups * a.D;
                float* dvj = dv + j * a.groups * a.Dv;
                const float* skj = sk + (j - run.klo) * a.D;
                const float* svj = sv + (j - run.klo) * a.Dv;
#pragma omp simd
                for (int64_t e = 0; e < a.D; ++e) dkj[e] += skj[e];
#pragma omp simd
                for (int64_t e = 0; e < a.Dv; ++e) dvj[e] += svj[e];
            }
        }
    }
}

// Zeroes the dk, dv rows of one head's sequence (S positions, `groups` rows apart).
void zero_rows(const Args& a, float* dk, float* dv) {
    for (int64_t j = 0; j < a.S; ++j) {
        std::fill(dk + j * a.groups * a.D, dk + j * a.groups * a.D + a.D, 0.0f);
        std::fill(dv + j * a.groups * a.Dv, dv + j * a.groups * a.Dv + a.Dv, 0.0f);
    }
}

// Backward: fills dq and adds to dk, dv, or with `write` fills them (their memory's old
// contents ignored). Work items are runs of a kv head's (b, kvh, sequence) G * ceil(N / bq)
// query blocks (`attnkit_partition`): whole heads when there are enough of them, else runs of
// equal work whose dk, dv sums are added after the loop in a fixed order. With `write` the run
// that adds into dk, dv (each head's first) zeroes the head's rows first: in the thread and
// cache that then fill them, in place of a pass over dk and dv before the call (one more
// parallel region, and its page faults on one thread: 6 ms of a 2-thread N=1024 backward
// on a loaded AMD EPYC, for tensors of 2 MiB).
void backward(const Args& a, bool write) {
    const int64_t G = a.H / a.Hkv, nqb = ceil_div(a.N, a.bq), per_head = G * nqb;
    const int64_t heads = a.B * a.Hkv * a.groups;
    const int64_t head_bytes = a.S * (a.D + a.Dv) * static_cast<int64_t>(sizeof(float));
    const int64_t P = runs_per_head(heads, per_head, a.nthreads, head_bytes);
    int64_t slot_floats = 0;
    const std::vector<Run> runs = backward_runs(a, heads, per_head, P, slot_floats);
    const std::vector<int64_t> order = P > 1 ? heaviest_first(runs) : std::vector<int64_t>{};
    std::vector<float> slots(slot_floats);  // zeroed
    if (write) {  // fresh dq, dk, dv (accumulating: the caller's tensors, holding sums)
        advise_huge_pages(a.dq, a.B * a.H * a.groups * a.N * a.D);
        advise_huge_pages(a.dk, a.B * a.Hkv * a.groups * a.S * a.D);
        advise_huge_pages(a.dv, a.B * a.Hkv * a.groups * a.S * a.Dv);
    }
#pragma omp parallel num_threads(static_cast<int>(a.nthreads))
    {
        Scratch w(a);
        w.dp.resize(block_floats(a));
        w.dob.resize(a.bq * a.Dv);
        w.dlt.resize(a.bq);
        if (a.softcap > 0.0f) w.g.resize(block_floats(a));
        if (a.rel && a.rel_grad) w.dtab.assign(a.H * a.rel_len, 0.0f);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < static_cast<int64_t>(runs.size()); ++t) {
            const int64_t idx = P > 1 ? order[t] : t;  // run idx % P of its head
            const Run& run = runs[idx];
            const int64_t seq = run.head, sq = seq % a.groups, bk = seq / a.groups;
            const int64_t b = bk / a.Hkv, kvh = bk % a.Hkv;
            float* dk_acc = a.dk + row_of(a, bk, a.S, sq, 0) * a.D;
            float* dv_acc = a.dv + row_of(a, bk, a.S, sq, 0) * a.Dv;
            int64_t step = a.groups;  // rows between a sequence's positions
            if (write && idx % P == 0) zero_rows(a, dk_acc, dv_acc);  // the head's first run
            if (run.slot >= 0) {  // the slot's rows are keys klo.., addressed from key 0
                float* slot = slots.data() + run.slot;
                dk_acc = rebase(slot, run.klo * a.D);
                dv_acc = rebase(slot + (run.khi - run.klo) * a.D, run.klo * a.Dv);
                step = 1;
            }
            for (int64_t u = run.first; u < run.last; ++u) {
                const int64_t h = kvh * G + u / nqb, i0 = (u % nqb) * a.bq;
                backward_block(a, b, h, sq, i0, std::min(i0 + a.bq, a.N), w, dk_acc, dv_acc, step);
            }
        }
        if (P > 1) add_slots(a, runs, P, slots.data());
        if (!w.dtab.empty()) {
#pragma omp critical(attnkit_dtab)
            for (int64_t e = 0; e < a.H * a.rel_len; ++e) a.rel_grad[e] += w.dtab[e];
        }
        if (a.work) {
#pragma omp atomic
            *a.work += w.work;
        }
    }
}

}  // namespace
