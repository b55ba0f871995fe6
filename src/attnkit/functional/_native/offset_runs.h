// The backward's offset path for rows of several runs of keys (a 2-D neighbourhood in token
// order: 8 queries of a canvas row share their kh runs of kw keys shifted by one a lane; unions
// of row intervals), issue 36, items 2 and 7. The forward's offset tiles (offset_path.h's
// offset_path: each tile's runs, the union of its lanes' offsets a run, each lane masked to
// its own) carry the query lanes, as in the bands' path (offset_backward.h) but run by run:
//   S and dP~ offset_path.h's offset_scores (masked entries -inf), P = exp(S - lse) (0 where
//   masked), dS = P (dP~ - D_i) (0 where P is: a masked dP~ is -inf), dQ = dS k each lane
//   over its own key rows (offset_path.h's offset_values, offset_row_values: the forward's
//   P v).
// The key lanes (offset_sums.h's key_lanes) need each run's P and dS kept by offset and query
// with one range of offsets for a run of consecutive queries: a slot (RunSlot) holds run k of
// consecutive tiles whose run k has the same offsets (a canvas row's interior tiles; each
// border tile, whose union is wider, its own), zero at every other query's column, so that a
// key tile reads its queries along a diagonal. Each slot's key lanes add its keys' dK, dV rows
// once. Rows that see nothing (lse -inf) give 0; lanes past the block's rows are empty.
//
// Exactness: dQ reads only each row's own keys; in S, dP~ and the key lanes every entry a lane
// does not see is selected away or a product by an exact 0 (its P and dS), so a finite key or
// query outside a row's runs adds nothing, while a NaN or inf query may reach the dK, dV of
// keys near those it sees (as on the blocks, whose masked entries are products by 0 too).
//
// Legend: kRunsDefault the default routing; runs_fit whether a block may take the path (the
// environment's switch: offset_backward.h's offset_env); RunSlot, RunsBlock a block's slots
// and their P and dS rows, runs_slots the slots of a block's tiles; runs_scatter a border
// tile's dK, dV; runs_tile one query tile; offset_runs the whole block.

#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "args.h"
#include "offset_backward.h"
#include "offset_path.h"
#include "offset_sums.h"
#include "scratch.h"
#include "score_mods.h"
#include "tile_path.h"
#include "transposed.h"

namespace {

// The default routing of rows of several runs (ATTNKIT_OFFSET_BACKWARD unset): on AVX-512 and
// AVX2 builds (offset_runs' note; attnkit/functional/_grid.py's offset_runs). Measured on the
// AVX2 build (x86-64-v3, AMD EPYC Zen 4, 1 thread, loaded machine), forward + backward in
// token order against reordered: 15 x 15 on 64 x 64 0.88x, 7 x 7 0.56x.
#if defined(__AVX512F__) || defined(__AVX2__)
constexpr bool kRunsDefault = true;
#else
constexpr bool kRunsDefault = false;
#endif

// Whether a block of nq rows may take the path: plain rows of several runs (offset_path.h's
// offset_candidate), keys and values fitting the padded caches, and the switch on ("1": on,
// "0": off, unset: kRunsDefault).
inline bool runs_fit(const Args& a, int64_t nq) {
    const int on = offset_env();
    return (on == 1 || (on == -1 && kRunsDefault)) && offset_candidate(a, plain_scores(a), nq) &&
           offset_cacheable(a, std::max(a.D, a.Dv));
}

// Run k's offsets [dlo, dlo + W) for the tiles of block columns [c0, c1): P and dS row c
// (offset dlo + c) at [at + c * ld], query column c0 + x at base + x, zero at every other.
struct RunSlot {
    int64_t dlo, W, c0, c1, at, ld, base;
};

// A block's slots, the slot of tile t's run k at of[t * kOffsetRuns + k] (-1: none), and
// the slots' P and dS rows.
struct RunsBlock {
    std::vector<RunSlot> slots;
    std::vector<int32_t> of;
    std::vector<float> p, ds;
};

inline RunsBlock& runs_block() {
    thread_local RunsBlock rb;
    return rb;
}

// Whether every lane of tile t sees every offset of its runs (the interior of a
// neighbourhood, a partial tile's lanes aside): its P and dS go into the slots; else (border
// tiles, whose lanes see 2/3 of a wider union) each lane's keys' dK, dV rows are added from
// its own entries (runs_scatter): in a slot of its own such a tile's key lanes summed ~4 key
// tiles over the wider union, a 64-wide canvas' key lanes 2.5x the work of its entries.
inline bool lanes_share(const OffsetTile& t) { return t.seen == t.n * t.total; }

// The slots of a block's tiles (queries from i0): run k of a tile joins run k's last slot
// where that ends at the tile and has its offsets, else opens one; the rows zeroed outside
// the tiles' columns.
inline void runs_slots(const std::vector<OffsetTile>& tiles, int64_t i0, RunsBlock& rb) {
    rb.slots.clear();
    rb.of.assign(tiles.size() * kOffsetRuns, -1);
    int32_t open[kOffsetRuns];
    std::fill(open, open + kOffsetRuns, -1);
    for (size_t t = 0; t < tiles.size(); ++t) {
        const OffsetTile& ot = tiles[t];
        const int64_t col = ot.i - i0;
        if (!lanes_share(ot)) continue;  // its keys' rows added lane by lane (runs_scatter)
        for (int64_t k = 0; k < ot.runs; ++k) {
            if (ot.width[k] == 0) continue;
            int32_t s = open[k];
            if (s < 0 || rb.slots[s].dlo != ot.dlo[k] || rb.slots[s].W != ot.width[k] ||
                rb.slots[s].c1 != col) {
                s = open[k] = static_cast<int32_t>(rb.slots.size());
                rb.slots.push_back(RunSlot{ot.dlo[k], ot.width[k], col, col, 0, 0, 0});
            }
            rb.slots[s].c1 = col + kTileRows;
            rb.of[t * kOffsetRuns + k] = s;
        }
    }
    int64_t at = 0;
    for (RunSlot& s : rb.slots) {  // key_lanes reads W - 1 columns before, 16 past the keys
        s.base = ceil_div(s.W, kTileRows) * kTileRows;
        s.ld = s.base + ceil_div(s.c1 - s.c0 + s.W + 2 * kTileRows, kTileRows) * kTileRows;
        s.at = at;
        at += s.W * s.ld;
    }
    rb.p.resize(at);
    rb.ds.resize(at);
    for (const RunSlot& slot : rb.slots) {  // the tiles write columns base .. base + c1 - c0
        for (std::vector<float>* buf : {&rb.p, &rb.ds}) {
            float* row = buf->data() + slot.at;
            for (int64_t c = 0; c < slot.W; ++c, row += slot.ld) {
                std::fill(row, row + slot.base, 0.0f);
                std::fill(row + slot.base + slot.c1 - slot.c0, row + slot.ld, 0.0f);
            }
        }
    }
}

// dK, dV of tile t's lanes whose offsets differ: for each key of each run, the lanes that see
// it, their dS times their (scaled) query rows qs and P times their dO' rows dob added to its
// rows of dk_acc, dv_acc (simd.h's add_weighted_rows; key j at row j * step). p, ds: the
// tile's P and dS (key-major).
inline void runs_scatter(const Args& a, const OffsetTile& t, const float* p, const float* ds,
                         const float* qs, const float* dob, float* dk_acc, float* dv_acc,
                         int64_t step) {
    for (int64_t k = 0; k < t.runs; ++k) {
        // key i + dlo + m (m < width + 7) meets lane u at offset c = m - u
        for (int64_t m = 0; m < t.width[k] + kTileRows - 1; ++m) {
            const float* xq[kTileRows];
            const float* xo[kTileRows];
            float cs[kTileRows], cp[kTileRows];
            int64_t seen = 0;
            for (int64_t u = 0; u < t.n; ++u) {
                const int64_t c = m - u;
                if (c < t.vlo[k][u] || c >= t.vhi[k][u]) continue;
                const int64_t r = (t.at[k] + c) * kTileRows + u;
                cs[seen] = ds[r], cp[seen] = p[r];
                xq[seen] = qs + u * a.D, xo[seen] = dob + u * a.Dv;
                ++seen;
            }
            if (seen == 0) continue;
            const int64_t j = t.i + t.dlo[k] + m;
            add_weighted_rows(dk_acc + j * a.D * step, a.D, xq, cs, seen);   // dK += dS^T (sq)
            add_weighted_rows(dv_acc + j * a.Dv * step, a.Dv, xo, cp, seen);  // dV += P^T dO'
        }
    }
}

// Query tile ot of the block from i0 (pre-scaled rows qs, dO' rows dob, their lse and D_i,
// all from the tile's first row): S, dP~, P, dS; P and dS into its slots (a tile whose
// lanes' offsets differ: its dK, dV added by runs_scatter); dQ (unscaled, ot.n
// rows of D) into dq.
inline void runs_tile(const Args& a, OffsetBlock& ob, RunsBlock& rb, int64_t t,
                      const OffsetTile& ot, int64_t i0, const float* qs, const float* dob,
                      const float* kT, const float* vT, int64_t ldt, const float* kb,
                      int64_t ldk, const float* lse,
                      const float* di, float* dq, float* dk_acc, float* dv_acc, int64_t step) {
    const int64_t D = a.D, Dv = a.Dv, col = ot.i - i0, n = ot.n;
    float *s = ob.s.data(), *dp = ob.dp.data(), *ds = ob.dst.data();
    float *tq = ob.tq.data(), *tdo = ob.tdo.data();
    tile_operands(a, ob, col, qs, dob, tq, tdo, n);
    offset_scores(tq, D, kT, ldt, ot, s);     // S = (scale q) k^T, -inf where masked
    offset_scores(tdo, Dv, vT, ldt, ot, dp);  // dP~ = dO' v^T
    float lanes_l[kTileRows] = {}, lanes_d[kTileRows] = {};  // a lane that sees nothing: 0
    for (int64_t u = 0; u < n; ++u) {
        lanes_l[u] = lse[u] == kNegInf ? 0.0f : lse[u], lanes_d[u] = di[u];
    }
    const tvec lv = tload(lanes_l), dv = tload(lanes_d), zero{};
    const bool slotted = lanes_share(ot);
    for (int64_t k = 0; k < ot.runs; ++k) {
        if (ot.width[k] == 0) continue;
        float *sp = s, *sd = ds;  // the slot's rows, or the tile's own (runs_scatter)
        int64_t ld = kTileRows;
        if (slotted) {
            const RunSlot& slot = rb.slots[rb.of[t * kOffsetRuns + k]];
            sp = rb.p.data() + slot.at + slot.base + (col - slot.c0) - ot.at[k] * slot.ld;
            sd = rb.ds.data() + slot.at + slot.base + (col - slot.c0) - ot.at[k] * slot.ld;
            ld = slot.ld;
        }
        for (int64_t c = ot.at[k]; c < ot.at[k] + ot.width[k]; ++c) {
            const int64_t r = c * kTileRows;
            const tvec p = texp(tload(s + r) - lv);  // Algorithm 2, line 11: 0 where masked
            const tvec g = p != zero ? p * (tload(dp + r) - dv) : zero;  // line 13
            tstore(ds + r, g);
            tstore(sp + c * ld, p);
            tstore(sd + c * ld, g);
        }
    }
    // dQ = dS k, each lane over its own key rows (the forward's weighted sums, offset_path.h)
    // (against a sum over the offsets in lanes, dQT = dS kT over the padded cache and a
    // transposition: 0.96x the backward's time at 15 x 15 on 64 x 64, 1.00x at 7 x 7)
    if (ot.total * D > kOffsetLaneFloats) {
        offset_values(ot, ds, kb, ldk, D, dq);
    } else {
        for (int64_t u = 0; u < n; ++u) offset_row_values(ot, u, ds, kb, ldk, D, dq + u * D);
    }
    if (!slotted) runs_scatter(a, ot, s, ds, qs, dob, dk_acc, dv_acc, step);
}

// Measured (AMD EPYC Zen 4, 1 thread, H=8, D=64, loaded shared machine, fastest and median of
// 5-11 interleaved rounds): forward + backward in token order against the reordered tiles
// 15 x 15 on 64 x 64 0.85-0.90x, on 128 x 128 0.80-0.82x; 7 x 7 0.41-0.44x and 0.57-0.59x;
// the backward ~2.7-3.3x the token-order forward. The forward's sliding caches
// (offset_window) in place of offset_ready took 1.23x the time at 15 x 15 on 128 x 128, and
// pair_dots for two interior tiles' S and dP~ 1.01-1.07x (tried, not kept). With
// the forward's 16-32-row query blocks instead of 128 rows: 15 x 15 on 128 x 128 1.23x, 7 x 7
// on 64 x 64 1.27x, 15 x 15 on 64 x 64 0.85-1.47x in three noisy runs (each slot's key lanes
// sum its keys' span: W - 1 keys more than its queries).
// The rows i0..i1 of a block on the path (its offset tiles `tiles`, offset_path.h's
// offset_path; [first, end) the keys they see): each query tile (runs_tile), then each slot's
// key lanes. Arguments as backward_block.h's backward_rows' for the whole block.
inline void offset_runs(const Args& a, const std::vector<OffsetTile>& tiles, int64_t i0,
                        int64_t i1, const float* qs, const float* dob, const float* lse,
                        const float* di, const float* kb, int64_t ldk, const float* vb,
                        int64_t ldv, int64_t first, int64_t end, Scratch& w, float* dq,
                        float* dk_acc, float* dv_acc, int64_t step) {
    const int64_t nq = i1 - i0, D = a.D, Dv = a.Dv;
    RunsBlock& rb = runs_block();
    runs_slots(tiles, i0, rb);
    int64_t widest = 0;
    for (const RunSlot& slot : rb.slots) widest = std::max(widest, slot.W);
    OffsetBlock& ob = offset_block();
    offset_start(a, ob, nq, 0, widest + kTileRows);  // qT, dOT: the slots' W + 16 past nq
    const int64_t dims = ceil_div(std::max(D, Dv), kDimBlock) * kDimBlock;
    for (std::vector<float>* buf : {&ob.s, &ob.dp, &ob.dst}) {
        if (buf->size() < static_cast<size_t>(kOffsetKeys * kTileRows)) {
            buf->resize(kOffsetKeys * kTileRows);
        }
    }
    const float* kT = offset_ready(a, w.okt, kb, ldk, D, first, end);
    const float* vT = offset_ready(a, w.ovt, vb, ldv, Dv, first, end);
    const int64_t ldt = offset_ld(a);
    for (size_t t = 0; t < tiles.size(); ++t) {
        const OffsetTile& ot = tiles[t];
        const int64_t r = ot.i - i0;
        w.work += ot.n * ot.total;
        runs_tile(a, ob, rb, static_cast<int64_t>(t), ot, i0, qs + r * D, dob + r * Dv, kT, vT,
                  ldt, kb, ldk, lse + r, di + r, dq + r * D, dk_acc, dv_acc, step);
    }
    float* acc = ob.acc.data();
    for (const RunSlot& slot : rb.slots) {
        const int64_t x = slot.at + slot.base, y = ob.P + slot.c0;
        const KeyRows kr{rb.ds.data() + x,  rb.p.data() + x, ob.qT.data() + y,
                         ob.doT.data() + y, slot.ld,         ob.L,
                         slot.W,            i0 + slot.c0 + slot.dlo,
                         slot.c1 - slot.c0 + slot.W - 1};
        key_lanes(a, kr, first, end, acc, acc + dims * kTileRows, dk_acc, dv_acc, step);
    }
}

}  // namespace
