// The offset path: a tile of kTileRows consecutive query positions i..i+7 of a sequence, one a
// lane of a 32-byte vector (tile_path.h's tvec), whose keys are addressed by their offset
// delta = j - i from the lane's own query. Where every lane has the same offsets (a band; the
// interior of a 2-D neighbourhood in token order, whose 8 queries of an image row share their
// kh runs of kw keys shifted by one a lane) each FMA of the product computes kTileRows
// allowed entries and nothing is masked:
//     sT[c][u] = sum_d qT[d][u] * kT[d][i + u + delta_c]   (an unaligned 8-float load)
// over keys transposed once (offset_window: a sliding padded transposition for a sequence's
// blocks in order, the forward's; offset_ready: transposed.h's per-sequence cache, padded).
// Lanes whose keys differ (a run clipped at a sequence's ends, a neighbourhood's border tiles)
// compute the union of their offsets, each lane masked (-inf) to its own. Rows with several
// runs of keys (Args::rows_k) have one range of offsets a run. The softmax is tile_path.h's,
// lane by lane; each row's weighted sum reads only its own keys' value rows.
// The forward (forward.h's forward_offsets) takes rows of several runs in plain calls: 2-D
// neighbourhoods in token order (attnkit/functional/reordered.py's natural_runs), unions of
// row intervals; rows of one run (windows) keep the row path (offset_candidate's note).
//
// Legend: kOffsetRunKeys the widest union of offsets of one run a tile takes, kOffsetKeys of
// all runs together, kOffsetRuns the most runs; OffsetTile a tile's offsets (per run: first
// offset dlo, width, row `at` in the score tile, each lane's own [vlo, vhi) numbered from dlo);
// offset_tile builds it from the rows' runs (the padded caches, kOffsetPad, offset_ready and
// offset_window, are in transposed.h); offset_scores the masked
// product (any x^T against any padded cache: the forward's q k^T, a backward's dO' v^T too);
// offset_row_values a lane's weighted sum over its own value rows, offset_values a tile's run
// by run; tile_runs a tile's runs from Args::rows; offset_candidate, offset_path whether a
// block takes the path; prefetch_offset_row its prefetch.

#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "args.h"
#include "masks.h"
#include "row_path.h"
#include "scratch.h"
#include "simd.h"
#include "tile_path.h"
#include "transposed.h"

namespace {

using namespace attnkit_simd;

// The widest union of one run's offsets over a tile's lanes (a window of w keys: w, plus the
// lanes' differences where it is clipped), and of all runs' together.
constexpr int64_t kOffsetRunKeys = 64;
constexpr int64_t kOffsetKeys = 512;
static_assert(kOffsetRunKeys <= kRowPathKeys, "finish_rows takes a run of a row");
// Runs a row may have on the offset path (attnkit/functional/_runs.py's MAX_RUNS).
constexpr int64_t kOffsetRuns = 16;

// A tile's offsets: queries i..i+n-1 (n <= kTileRows, lane u query i + u); run k's offsets
// dlo[k] .. dlo[k] + width[k] in rows at[k] .. of the score tile (key-major, kTileRows floats a
// row); lane u sees offsets dlo[k] + [vlo[k][u], vhi[k][u]) (empty: 0, 0). `total` rows in
// all, `seen` entries the lanes see.
struct OffsetTile {
    int64_t i, n, runs, total, seen;
    int64_t first, end;  // the keys the lanes see, from first to end (INT64_MAX, INT64_MIN: none)
    int64_t dlo[kOffsetRuns], width[kOffsetRuns], at[kOffsetRuns];
    tint vlo[kOffsetRuns], vhi[kOffsetRuns];
};

typedef int64_t tlong __attribute__((vector_size(kTileRows * 8)));

// Every lane of x folded into each lane by op (0: the smallest, 1: the largest, 2: the sum),
// in three halvings.
template <typename V>
inline V lanes_fold(V x, int op) {
    const V swap4 = __builtin_shuffle(x, tint{4, 5, 6, 7, 0, 1, 2, 3});
    V y = op == 0 ? (swap4 < x ? swap4 : x) : op == 1 ? (swap4 > x ? swap4 : x) : swap4 + x;
    const V swap2 = __builtin_shuffle(y, tint{2, 3, 0, 1, 6, 7, 4, 5});
    y = op == 0 ? (swap2 < y ? swap2 : y) : op == 1 ? (swap2 > y ? swap2 : y) : swap2 + y;
    const V swap1 = __builtin_shuffle(y, tint{1, 0, 3, 2, 5, 4, 7, 6});
    return op == 0 ? (swap1 < y ? swap1 : y) : op == 1 ? (swap1 > y ? swap1 : y) : swap1 + y;
}

// t from runs k < K of rows u < n (query i + u): keys [lo[k * ld + u], hi[k * ld + u]) (empty
// where lo >= hi). False where a run's union is wider than kOffsetRunKeys, all runs' wider
// than kOffsetKeys, or K > kOffsetRuns. Lane by lane in vectors (and the runs read in place,
// not copied: 7 x 7 on 64 x 64 forward 2.69 -> 2.47 x density x dense; the scalar walk, twice
// over each run's lanes, and the copies were ~13% of it, perf).
inline bool offset_tile(const int64_t* lo, const int64_t* hi, int64_t ld, int64_t K, int64_t i,
                        int64_t n, OffsetTile& t) {
    if (K > kOffsetRuns) return false;
    t.i = i, t.n = n, t.runs = K, t.total = 0, t.seen = 0;
    const tint lane = {0, 1, 2, 3, 4, 5, 6, 7};
    const tint live = lane < static_cast<int32_t>(n);
    tlong first = tlong{} + INT64_MAX, end = tlong{} + INT64_MIN;
    for (int64_t k = 0; k < K; ++k) {
        tlong L{}, H{};  // lanes from n on: empty (whatever the caller's arrays hold there)
        for (int64_t u = 0; u < n; ++u) L[u] = lo[k * ld + u], H[u] = hi[k * ld + u];
        const tint seen = live & __builtin_convertvector(L < H, tint);
        const tint rl = __builtin_convertvector(L - i, tint) - lane;  // lo - (i + u)
        const tint rh = __builtin_convertvector(H - i, tint) - lane;
        int32_t dlo = lanes_fold(seen ? rl : tint{} + INT32_MAX, 0)[0];
        int32_t dhi = lanes_fold(seen ? rh : tint{} + INT32_MIN, 1)[0];
        if (dlo >= dhi) dlo = dhi = 0;  // no lane sees run k
        if (dhi - dlo > kOffsetRunKeys) return false;
        t.seen += lanes_fold(seen ? rh - rl : tint{}, 2)[0];
        const tlong seen64 = __builtin_convertvector(seen, tlong);
        first = seen64 ? (L < first ? L : first) : first;
        end = seen64 ? (H > end ? H : end) : end;
        t.dlo[k] = dlo, t.width[k] = dhi - dlo, t.at[k] = t.total;
        t.total += dhi - dlo;
        t.vlo[k] = seen ? rl - dlo : tint{};
        t.vhi[k] = seen ? rh - dlo : tint{};
    }
    t.first = INT64_MAX, t.end = INT64_MIN;
    for (int u = 0; u < kTileRows; ++u) {
        t.first = std::min(t.first, first[u]), t.end = std::max(t.end, end[u]);
    }
    return t.total <= kOffsetKeys;
}

// Offsets c0..c0+C of one run against the tile's lanes: for each dimension d the lanes' x
// components (one vector) times C unaligned vectors of the cache's row d, C accumulators
// (C independent FMA chains; below 8 two sets, even and odd d, so that the chains still
// overlap). y: the cache at lane 0's key of offset c0. Masked to each lane's [vlo, vhi), into
// sT rows 0..C, their maximum into m.
template <int C>
void offset_chunk(const float* xT, int64_t dims, const float* y, int64_t ldt, int32_t c0,
                  tint vlo, tint vhi, float* sT, tvec& m) {
    constexpr int kSets = C < 8 ? 2 : 1;
    tvec acc[kSets][C];
    for (int s = 0; s < kSets; ++s) {
#pragma GCC unroll 32
        for (int c = 0; c < C; ++c) acc[s][c] = tvec{};
    }
    int64_t d = 0;
    for (; d + kSets <= dims; d += kSets) {
#pragma GCC unroll 2
        for (int s = 0; s < kSets; ++s) {
            const tvec xv = tload(xT + (d + s) * kTileRows);
            const float* yd = y + (d + s) * ldt;
#pragma GCC unroll 32
            for (int c = 0; c < C; ++c) acc[s][c] += xv * tload(yd + c);
        }
    }
    for (; d < dims; ++d) {
        const tvec xv = tload(xT + d * kTileRows);
        const float* yd = y + d * ldt;
#pragma GCC unroll 32
        for (int c = 0; c < C; ++c) acc[0][c] += xv * tload(yd + c);
    }
    const tvec ninf = tsplat(kNegInf);
#pragma GCC unroll 32
    for (int c = 0; c < C; ++c) {
        const tvec sum = kSets == 2 ? acc[0][c] + acc[kSets - 1][c] : acc[0][c];
        const tint j = tint{} + (c0 + c);
        const tvec s = (vlo <= j) & (j < vhi) ? sum : ninf;
        m = tmax(s, m);  // a NaN score passed over (the exponentials carry it on)
        tstore(sT + c * kTileRows, s);
    }
}

// The widest chunk of offsets computed at once: accumulators, the x vector and a load within
// the 32 vector registers of AVX-512 (ymm0-31) or the 16 of AVX2.
#if defined(__AVX512F__)
constexpr int kOffsetChunk = 24;
#elif defined(__AVX__)
constexpr int kOffsetChunk = 12;
#else
constexpr int kOffsetChunk = 8;
#endif

using OffsetChunkFn = void (*)(const float*, int64_t, const float*, int64_t, int32_t, tint, tint,
                               float*, tvec&);

template <int... Cs>
constexpr std::array<OffsetChunkFn, sizeof...(Cs)> offset_chunks(
    std::integer_sequence<int, Cs...>) {
    return {&offset_chunk<Cs + 1>...};
}

// The score tile of x^T (dims x kTileRows, lane u the tile's query i + u) against the padded
// cache yT (key 0's column, rows ldt apart): run k's offsets into rows at[k] .. of sT, masked
// to each lane's own; returns the lanes' maxima (-inf where a lane sees nothing). A run's
// offsets go in chunks of about equal width (a window of 33 keys: 17 + 16 on AVX-512, not
// 24 + 9, whose 9 chains would wait on each other).
inline tvec offset_scores(const float* xT, int64_t dims, const float* yT, int64_t ldt,
                          const OffsetTile& t, float* sT) {
    static constexpr auto chunk = offset_chunks(std::make_integer_sequence<int, kOffsetChunk>{});
    tvec m = tsplat(kNegInf);
    for (int64_t k = 0; k < t.runs; ++k) {
        const int64_t width = t.width[k];
        if (width == 0) continue;
        const int64_t parts = ceil_div(width, kOffsetChunk), base = width / parts;
        const float* y = yT + t.i + t.dlo[k];
        int64_t c = 0;
        for (int64_t p = 0; p < parts; ++p) {
            const int64_t C = base + (p < width % parts ? 1 : 0);
            chunk[C - 1](xT, dims, y + c, ldt, static_cast<int32_t>(c), t.vlo[k], t.vhi[k],
                         sT + (t.at[k] + c) * kTileRows, m);
            c += C;
        }
    }
    return m;
}

// out (Dv) = lane u's weighted sum of its own value rows: for each run it sees, the
// probabilities p (sT, lane u's column) of its keys i + u + dlo[k] + [vlo, vhi) times those
// rows of v (rows ldv apart); 0 where it sees nothing. No other row's value is read (an inf
// there stays out of this row). The sum over all runs is held in registers, four vectors of
// out at a time (simd.h's combine_terms over every run's rows): run by run through
// combine_rows (a load and a store of out a run) a 7 x 7 neighbourhood's forward on 128 x 128
// took ~1.2x the time (AMD EPYC Zen 4).
inline void offset_row_values(const OffsetTile& t, int64_t u, const float* p, const float* v,
                              int64_t ldv, int64_t Dv, float* out) {
    const float* pk[kOffsetRuns];  // the runs it sees: probabilities, value rows, keys
    const float* vk[kOffsetRuns];
    int64_t nk[kOffsetRuns], runs = 0;
    for (int64_t k = 0; k < t.runs; ++k) {
        const int64_t l = t.vlo[k][u], m = t.vhi[k][u] - l;
        if (m <= 0) continue;
        pk[runs] = p + (t.at[k] + l) * kTileRows + u;
        vk[runs] = v + (t.i + u + t.dlo[k] + l) * ldv;
        nk[runs++] = m;
    }
    combine_terms<false>(out, Dv, [&](auto&& f) {
        for (int64_t k = 0; k < runs; ++k) {
            const float* x = vk[k];
            for (int64_t c = 0; c < nk[k]; ++c, x += ldv) f(pk[k][c * kTileRows], x);
        }
    });
}

// acc rows u < n (Dv floats each) = offset_row_values of every lane of the tile, run by run
// over the lanes: a run's value rows (its width + 7) stay in the first-level cache while the 8
// lanes read them, where lane by lane each lane walked all its runs' rows (225 rows, 56 KiB,
// for a 15 x 15 neighbourhood) through the second-level cache again. Measured (15 x 15 on
// 64 x 64, N=4096, H=8, D=64, forward, AMD EPYC Zen 4, fastest of 11 interleaved rounds):
// 50.8 -> 45.2 ms; a 7 x 7 one's rows fit (kOffsetLaneFloats), and run by run took 1.1x.
// Value floats of a tile's offsets (t.total x Dv) up to which the forward takes each lane's
// weighted sum whole in registers (offset_row_values): a 7 x 7 neighbourhood's, 49-98 value
// rows of 64, stay in the first-level cache from one lane to the next.
constexpr int64_t kOffsetLaneFloats = 8192;

inline void offset_values(const OffsetTile& t, const float* p, const float* v, int64_t ldv,
                          int64_t Dv, float* acc) {
    bool any[kTileRows] = {};
    for (int64_t k = 0; k < t.runs; ++k) {
        for (int64_t u = 0; u < t.n; ++u) {
            const int64_t l = t.vlo[k][u], nk = t.vhi[k][u] - l;
            if (nk <= 0) continue;
            const float* pk = p + (t.at[k] + l) * kTileRows + u;
            const float* vk = v + (t.i + u + t.dlo[k] + l) * ldv;
            auto row = [vk, ldv](int64_t c) { return vk + c * ldv; };
            if (any[u]) {
                combine_rows<true>(acc + u * Dv, Dv, pk, kTileRows, nk, row);
            } else {
                combine_rows<false>(acc + u * Dv, Dv, pk, kTileRows, nk, row);
            }
            any[u] = true;
        }
    }
    for (int64_t u = 0; u < t.n; ++u) {
        if (!any[u]) std::fill(acc + u * Dv, acc + (u + 1) * Dv, 0.0f);
    }
}

// The runs of queries i..i+n-1 of batch row b (Args::rows): run k of query i + u at
// [k * kTileRows + u], cut at the causal limit; lanes from n on empty.
inline void tile_runs(const Args& a, int64_t b, int64_t i, int64_t n, int64_t* lo, int64_t* hi) {
    for (int64_t k = 0; k < a.rows_k; ++k) {
        const int64_t* rl = a.rows + k * a.rows_kst + b * a.rows_bst + i;
        const int64_t* rh = rl + a.rows_half;
        for (int64_t u = 0; u < kTileRows; ++u) {
            const int64_t l = u < n ? rl[u] : 0;
            int64_t h = u < n ? rh[u] : 0;
            if (a.causal) h = std::min(h, i + u + a.S - a.N + 1);
            lo[k * kTileRows + u] = l, hi[k * kTileRows + u] = std::max(h, l);
        }
    }
}

// Whether a block of nq rows may take the offset path: structured rows of several runs
// (Args::rows, no tiles), at least kTileRows of them, and nothing between the product and the
// softmax (`plain`: finish_rows takes one run a row). Rows of one run (windows) keep the row
// path: on the offset path a window of 9, 17, 33 and 63 keys took 1.10-1.20x, 1.14x, 1.06x
// and 1.07x the row path's time (N=4096, H=8, D=64, forward, fastest of 9 interleaved rounds,
// AMD EPYC Zen 4; also with 128-row blocks): the same FMAs an entry (8-lane offsets against
// 16-lane dot products), plus the transposed queries and keys, and the row's fixed costs (its
// query, output, logarithm) dominate.
inline bool offset_candidate(const Args& a, bool plain, int64_t nq) {
    return a.rows && !a.table && a.rows_k > 1 && plain && nq >= kTileRows;
}

// The offset tiles of rows i0..i1 of a candidate block (batch row b), kTileRows rows a tile,
// or null where the block does not take the offset path: every tile within offset_tile's
// limits, and the tiles computing at most 5/4 of the entries their rows see (a neighbourhood's
// border tiles compute ~1.5x theirs, its interior exactly; short documents, whose lanes'
// offsets differ, 23/16: the tile path's). Sets [first, end), the keys the lanes see. Called
// before key_blocks, whose sort of every row's runs (K x bq intervals) took ~9% of a 7 x 7
// neighbourhood's forward. The tiles live until the next call on the thread.
inline const std::vector<OffsetTile>* offset_path(const Args& a, int64_t b, int64_t i0,
                                                  int64_t i1, int64_t& first, int64_t& end) {
    thread_local std::vector<OffsetTile> tiles;
    if (a.rows_k > kOffsetRuns) return nullptr;
    tiles.resize(ceil_div(i1 - i0, kTileRows));
    int64_t computed = 0, seen = 0;
    first = INT64_MAX, end = INT64_MIN;
    int64_t lo[kOffsetRuns * kTileRows], hi[kOffsetRuns * kTileRows];
    for (int64_t r = 0; r < i1 - i0; r += kTileRows) {
        const int64_t n = std::min(kTileRows, i1 - i0 - r);
        OffsetTile& t = tiles[r / kTileRows];
        tile_runs(a, b, i0 + r, n, lo, hi);
        if (!offset_tile(lo, hi, kTileRows, a.rows_k, i0 + r, n, t)) return nullptr;
        computed += n * t.total, seen += t.seen;
        first = std::min(first, t.first), end = std::max(end, t.end);
    }
    if (first >= end) first = end = 0;
    return 4 * computed <= 5 * seen ? &tiles : nullptr;
}

// The offset path's prefetch, at query i of a block of nq rows from i0 whose keys end at
// `end`: the next block's query i + nq and the key and value end + (i - i0) (the rows that
// the next block's span adds: in a band or a 2-D neighbourhood in token order a block's keys
// follow the previous block's), into the second-level cache, and the out row i +
// kOffsetAhead for writing. Measured (7 x 7 neighbourhood on 64 x 64, N=4096, H=8, D=64,
// forward, AMD EPYC Zen 4, fastest of 9 interleaved rounds): 15.0 -> 13.0 ms against the
// query, out, key and value rows of query i + 64.
constexpr int64_t kOffsetAhead = 16;

inline void prefetch_offset_row(const Args& a, int64_t head, int64_t sq, int64_t i, int64_t nq,
                                const float* kb, int64_t ldk, const float* vb, int64_t ldv,
                                int64_t j) {
    if (i + nq < a.N) prefetch_row_l2(a.q + qrow(a, head, sq, i + nq) * a.D, a.D);
    if (i + kOffsetAhead < a.N) {
        prefetch_row_w(a.out + qrow(a, head, sq, i + kOffsetAhead) * a.Dv, a.Dv);
    }
    if (j >= 0 && j < a.S) {
        prefetch_row_l2(kb + j * ldk, a.D);
        prefetch_row_l2(vb + j * ldv, a.Dv);
    }
}

// The thread's buffers for the offset path: qT, the score tile, the row path's rows.
inline void offset_buffers(const Args& a, Scratch& w) {
    const size_t dims = static_cast<size_t>(ceil_div(std::max(a.D, a.Dv), kDimBlock) * kDimBlock);
    if (w.tq.size() < dims * kTileRows) w.tq.resize(dims * kTileRows);
    if (w.ts.size() < kOffsetKeys * kTileRows) w.ts.resize(kOffsetKeys * kTileRows);
    if (w.s.size() < kRowGroup * kRowPathKeys) w.s.resize(kRowGroup * kRowPathKeys);
}

}  // namespace
