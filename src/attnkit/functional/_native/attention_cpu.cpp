// attnkit's CPU attention kernel: FlashAttention-2 (Dao 2023) forward and backward in float32
// with the mask, bias, causal limit and dropout fused into one pass over each score block.
//
// Legend: B batch, H query heads, Hkv key/value heads (G = H / Hkv query heads share one),
// N queries, S keys, D query/key head width, Dv value head width; bq x bk score blocks,
// nq x nk the size of the current (possibly shorter, last) block. All tensors are dense
// row-major float32: q (B, H, N, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv), out (B, H, N, Dv),
// lse (B, H, N). mask (bytes, nonzero = may attend) and bias (float32) are read through four
// element strides, so any broadcast view of (B, H, N, S) works without being materialised.
//
// The matrix products call the BLAS sgemm_ that libtorch_cpu exports (MKL in the CPU wheels);
// they run inside this file's OpenMP region on torch's own libgomp, so MKL stays sequential
// per thread. Everything between two products is one loop over the block.
//
// Dropout bits are a counter-based hash of the position, not of the blocking: row
// r = (b * H + h) * N + i has the 64-bit key K_r = splitmix64(seed + (r + 1) * golden), and entry
// (b, h, i, j) reads the 32-bit word mix32(j + lo(K_r), hi(K_r)) (Wellons' lowbias32 with the
// key's high half xored in between its two rounds; see keep_word). It is kept iff that word is
// below T = round(2^32 (1 - p)) clamped to [1, 2^32 - 1]: P(keep) = T / 2^32, within 2^-33 of
// 1 - p. One 32-bit hash per entry costs ~0.2 ns here against ~0.6 ns for half a splitmix64
// (AVX2 has no 64-bit vector multiply). attnkit/functional/_dropout.py computes the same words
// with torch integer ops (the PyTorch chunked path and the tests use it).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "args.h"
#include "finite.h"
#include "partition.h"
#include "score_mods.h"
#include "simd.h"

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc);

namespace {

using namespace attnkit_simd;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// ------------------------------------------------------------------ row-major matrix products
// BLAS is column-major: a row-major (r x c) matrix is its transpose there, so C = A op B
// becomes C^T = B^T op A^T and the operands swap places.

inline void gemm(char ta, char tb, int m, int n, int k, const float* a, int lda, const float* b,
                 int ldb, float beta, float* c, int ldc) {
    const float one = 1.0f;
    sgemm_(&ta, &tb, &m, &n, &k, &one, a, &lda, b, &ldb, &beta, c, &ldc);
}

// C (r x c) = A (r x k) . B (c x k)^T  [+ C if beta = 1]
inline void mm_nt(int r, int c, int k, const float* A, int lda, const float* B, int ldb,
                  float beta, float* C, int ldc) {
    gemm('T', 'N', c, r, k, B, ldb, A, lda, beta, C, ldc);
}

// C (r x c) = A (r x k) . B (k x c)  [+ C]
inline void mm_nn(int r, int c, int k, const float* A, int lda, const float* B, int ldb,
                  float beta, float* C, int ldc) {
    gemm('N', 'N', c, r, k, B, ldb, A, lda, beta, C, ldc);
}

// C (r x c) = A (k x r)^T . B (k x c)  [+ C]
inline void mm_tn(int r, int c, int k, const float* A, int lda, const float* B, int ldb,
                  float beta, float* C, int ldc) {
    gemm('N', 'T', c, r, k, B, ldb, A, lda, beta, C, ldc);
}

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

inline uint64_t mix64(uint64_t z) {  // splitmix64's output function (Steele et al. 2014)
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

constexpr int64_t kNoDropout = int64_t{1} << 32;  // keep_t meaning "keep everything"

// The dropout key of one row (the hash's two 32-bit halves), computed once per row and block.
struct RowKey {
    uint32_t lo, hi;
};

inline RowKey row_key(const Args& a, int64_t row) {
    const uint64_t z = mix64(a.seed + static_cast<uint64_t>(row + 1) * kGolden);
    return {static_cast<uint32_t>(z), static_cast<uint32_t>(z >> 32)};
}

// The 32-bit word of key j in a row: a bijection of j for each row key, so every word of a row
// is distinct; the multiplies are 32-bit and vectorise on AVX2 (8 lanes) and AVX-512 (16).
inline uint32_t keep_word(RowKey key, int64_t j) {
    uint32_t x = static_cast<uint32_t>(j) + key.lo;
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x ^= key.hi;
    x *= 0x846ca68bU;
    return x ^ (x >> 16);
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
// at this block's first key (null: no tile mask).
struct KeyBlock {
    int64_t j0, nk;
    const uint8_t* tile;
};

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
        for (int64_t k = 0; k < a.rows_k; ++k) {
            const int64_t* rl = a.rows + k * a.rows_kst + b * a.rows_bst + i0;
            std::copy(rl, rl + (i1 - i0), lo + k * a.bq);
            std::copy(rl + a.rows_half, rl + a.rows_half + (i1 - i0), hi + k * a.bq);
        }
        stretches(a, i1 - i0, lo, hi, end, spans);
    }
    const int64_t nkb = (a.S + a.bk - 1) / a.bk, qb = i0 / a.bq;
    const int32_t* row =
        a.table ? a.table + b * a.table_st[0] + h * a.table_st[1] + qb * nkb : nullptr;
    for (const auto& [first, last] : spans) {
        if (!a.table) {
            for (int64_t j0 = first; j0 < last; j0 += a.bk) out.push_back({j0, std::min(a.bk, last - j0), nullptr});
            continue;
        }
        for (int64_t kb = first / a.bk; kb * a.bk < last; ++kb) {
            const int32_t t = row[kb];
            if (t == -1) continue;
            const int64_t j0 = std::max(kb * a.bk, first), j1 = std::min((kb + 1) * a.bk, last);
            const uint8_t* tile = t >= 0 ? a.tiles + t * a.bq * a.bk + (j0 - kb * a.bk) : nullptr;
            out.push_back({j0, j1 - j0, tile});
        }
    }
}

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

// out and lse of one row from its running max m and sum l and unnormalised output acc.
void write_row(const Args& a, int64_t row, const float* acc, float m, float l) {
    float* o = a.out + row * a.Dv;
    // l == 0 exactly when the row saw nothing: out 0 and lse -inf, never 0 / 0. A NaN
    // score makes l NaN: out (acc * 0) and lse stay NaN, and backward keeps the row.
    const float f = l > 0.0f ? a.inv_keep / l : 0.0f;
    for (int64_t e = 0; e < a.Dv; ++e) o[e] = acc[e] * f;
    a.lse[row] = l > 0.0f ? m + std::log(l) : (l == 0.0f ? kNegInf : l);
}

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
// (kRowPathKeys, kRowPathKeysBackward), and the blocks' span wider than the widest row.
bool row_path(const Args& a, const Scratch& w, int64_t i0, int64_t i1, int64_t limit) {
    if (a.table || a.rows_k > 1) return false;  // rows with several runs: the blocks
    int64_t first, end, widest = 0;
    blocks_span(w, first, end);
    for (int64_t r = 0; r < i1 - i0; ++r) {
        int64_t lo, hi;
        row_span(a, w, r, i0 + r, first, end, lo, hi);
        widest = std::max(widest, hi - lo);
    }
    return widest <= limit && end - first > widest;
}

// Rows a row-path call computes together (forward_rows): a row of a narrow window is one
// chain of dependent steps (dot products -> max -> exponentials -> sum -> weighted sum -> log),
// ~100 ns of mostly waiting for a window of 9 keys (AMD EPYC Zen 4); taken stage by stage for
// four independent rows, the chains overlap.
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
void prefetch_forward(const Args& a, int64_t head, int64_t sq, int64_t i, int64_t nq,
                      const float* kb, int64_t ldk, const float* vb, int64_t ldv, int64_t hi) {
    if (i + nq < a.N) prefetch_row_l2(a.q + row_of(a, head, a.N, sq, i + nq) * a.D, a.D);
    if (i + kAhead < a.N) prefetch_row_w(a.out + row_of(a, head, a.N, sq, i + kAhead) * a.Dv, a.Dv);
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
void prefetch_next_sequence(const Args& a, int64_t head, int64_t kvhead, int64_t sq, int64_t nq,
                            int64_t first, int64_t end, bool backward, bool in_place) {
    if (sq + 1 >= a.groups) return;
    for (int64_t i = 0; i < std::min(nq, a.N); ++i) {
        const int64_t row = row_of(a, head, a.N, sq + 1, i);
        prefetch_row_l2(a.q + row * a.D, a.D);
        prefetch_row_l2(a.out + row * a.Dv, a.Dv);
        if (backward) {
            prefetch_row_l2(a.dout + row * a.Dv, a.Dv);
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

// Forward of queries i..i+n-1 (n <= kRowGroup) of a block of nq rows (pre-scaled rows qs,
// D apart), query i + u over keys [lo[u], hi[u]); kb, vb: the keys and values of its sequence,
// ldk, ldv apart. Stage by stage over the rows (kRowGroup); s holds kRowGroup rows of
// kRowPathKeys scores, acc n rows of Dv.
void forward_rows(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i, int64_t n,
                  int64_t nq, const float* qs, const float* kb, int64_t ldk, const float* vb,
                  int64_t ldv, const int64_t* lo, const int64_t* hi, float* s, float* acc) {
    const int64_t head = b * a.H + h;
    float m[kRowGroup], l[kRowGroup];
    for (int64_t u = 0; u < n; ++u) {
        float* su = s + u * kRowPathKeys;
        const int64_t nk = hi[u] - lo[u];
        prefetch_forward(a, head, sq, i + u, nq, kb, ldk, vb, ldv, hi[u]);
        dots(qs + u * a.D, kb + lo[u] * ldk, ldk, a.D, nk, su);
        score_mod_row_fwd(a, h, i + u, lo[u], nk, su, nullptr);
        mask_row(a, b, h, i + u, lo[u], nk, su);
    }
    for (int64_t u = 0; u < n; ++u) m[u] = row_max(s + u * kRowPathKeys, hi[u] - lo[u]);
    for (int64_t u = 0; u < n; ++u) {
        float* su = s + u * kRowPathKeys;
        const int64_t nk = hi[u] - lo[u];
        const float m_safe = m[u] == kNegInf ? 0.0f : m[u];
        l[u] = a.keep_t < kNoDropout
            ? exp_sum_row<true>(su, nk, m_safe, row_key(a, row_of(a, head, a.N, sq, i + u)),
                                static_cast<uint32_t>(a.keep_t), lo[u])
            : exp_sum_row<false>(su, nk, m_safe, RowKey{}, 0, lo[u]);
    }
    for (int64_t u = 0; u < n; ++u) {
        weighted_sum(s + u * kRowPathKeys, hi[u] - lo[u], vb + lo[u] * ldv, ldv, a.Dv,
                     acc + u * a.Dv);
    }
    for (int64_t u = 0; u < n; ++u) {
        write_row(a, row_of(a, head, a.N, sq, i + u), acc + u * a.Dv, m[u], l[u]);
    }
}

void forward_block(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i0, int64_t i1,
                   Scratch& w) {
    const int64_t nq = i1 - i0, D = a.D, Dv = a.Dv, kvh = h / (a.H / a.Hkv);
    const int64_t ldk = D * a.groups, ldv = Dv * a.groups;  // key and value rows of sequence sq
    const float* kb = a.k + row_of(a, b * a.Hkv + kvh, a.S, sq, 0) * D;
    const float* vb = a.v + row_of(a, b * a.Hkv + kvh, a.S, sq, 0) * Dv;
    float *s = w.s.data(), *qs = w.qs.data(), *acc = w.acc.data();
    load_q(a, b, h, sq, i0, nq, qs);
    key_blocks(a, b, h, i0, i1, w.blocks, w.lo.data(), w.hi.data());
    if (a.groups > 1 && i1 == a.N) {  // the last block of sequence sq
        int64_t first, end;
        blocks_span(w, first, end);
        prefetch_next_sequence(a, b * a.H + h, b * a.Hkv + kvh, sq, nq, first, end, false, false);
    }
    if (row_path(a, w, i0, i1, kRowPathKeys)) {
        if (w.s.size() < kRowGroup * kRowPathKeys) w.s.resize(kRowGroup * kRowPathKeys);
        each_row(a, w, i0, i1, [&](int64_t r, int64_t n, const int64_t* lo, const int64_t* hi) {
            forward_rows(a, b, h, sq, i0 + r, n, nq, qs + r * D, kb, ldk, vb, ldv, lo, hi,
                         w.s.data(), acc);
        });
        return;
    }
    std::fill(w.m.begin(), w.m.begin() + nq, kNegInf);  // running row max
    std::fill(w.l.begin(), w.l.begin() + nq, 0.0f);     // running sum of exp (before dropout)
    std::fill(acc, acc + nq * Dv, 0.0f);                // unnormalised output
    for (const KeyBlock& blk : w.blocks) {
        const int64_t j0 = blk.j0, nk = blk.nk;
        w.work += nq * nk;
        mm_nt(nq, nk, D, qs, D, kb + j0 * ldk, ldk, 0.0f, s, nk);  // S = (scale q) k^T
        for (int64_t r = 0; r < nq; ++r) {
            float* sr = s + r * nk;
            const int64_t i = i0 + r;
            score_mod_row_fwd(a, h, i, j0, nk, sr, nullptr);
            mask_row(a, b, h, i, j0, nk, sr);
            mask_row_structured(a, blk, w.lo.data() + r, w.hi.data() + r, r, sr);
            const float m_new = std::max(w.m[r], row_max(sr, nk));
            const float m_safe = m_new == kNegInf ? 0.0f : m_new;  // nothing seen yet: exp -> 0
            const float alpha = exp_f(w.m[r] - m_safe);
            float sum;
            if (a.keep_t < kNoDropout) {
                const RowKey key = row_key(a, row_of(a, b * a.H + h, a.N, sq, i));
                sum = exp_sum_row<true>(sr, nk, m_safe, key, static_cast<uint32_t>(a.keep_t), j0);
            } else {
                sum = exp_sum_row<false>(sr, nk, m_safe, RowKey{}, 0, j0);
            }
            w.l[r] = w.l[r] * alpha + sum;  // the normaliser counts dropped entries too
            w.m[r] = m_new;
            if (alpha != 1.0f) {
                float* ar = acc + r * Dv;
#pragma omp simd
                for (int64_t e = 0; e < Dv; ++e) ar[e] *= alpha;
            }
        }
        mm_nn(nq, Dv, nk, s, nk, vb + j0 * ldv, ldv, 1.0f, acc, Dv);  // acc += P~ v
    }
    for (int64_t r = 0; r < nq; ++r) {
        write_row(a, row_of(a, b * a.H + h, a.N, sq, i0 + r), acc + r * Dv, w.m[r], w.l[r]);
    }
}

// The backward's prefetch at query i of a block of nq rows: the next block's query, dO, O
// (read by its preamble) and dq (written at its end) rows, the key, value and their dK, dV
// rows hi - 1 + kAhead.
void prefetch_backward(const Args& a, int64_t head, int64_t sq, int64_t i, int64_t nq,
                       const float* kb, int64_t ldk, const float* vb, int64_t ldv, int64_t hi,
                       float* dk_acc, float* dv_acc, int64_t step) {
    if (i + nq < a.N) {
        const int64_t row = row_of(a, head, a.N, sq, i + nq);
        prefetch_row(a.q + row * a.D, a.D);
        prefetch_row(a.dout + row * a.Dv, a.Dv);
        prefetch_row(a.out + row * a.Dv, a.Dv);
        prefetch_row_w(a.dq + row * a.D, a.D);
    }
    const int64_t j = hi - 1 + kAhead;
    if (hi > 0 && j < a.S) {
        prefetch_row(kb + j * ldk, a.D);
        prefetch_row(vb + j * ldv, a.Dv);
        prefetch_row_w(dk_acc + j * a.D * step, a.D);
        prefetch_row_w(dv_acc + j * a.Dv * step, a.Dv);
    }
}

// dK and dV of the row path's rows u < n over their keys [lo[u], hi[u]) (nk[u] = 0: a row
// that adds nothing): each key's rows of dk_acc and dv_acc are added to once, with dS^T of the
// rows that see it times their (scaled) queries and (P K)^T times their dO' rows (ds, pk: the
// rows' dS and P K, W apart; qs, dob: D and Dv apart).
void add_dk_dv(const Args& a, int64_t n, const int64_t* lo, const int64_t* hi, const int64_t* nk,
               const float* ds, const float* pk, int64_t W, const float* qs, const float* dob,
               float* dk_acc, float* dv_acc, int64_t step) {
    int64_t first = a.S, end = 0;
    for (int64_t u = 0; u < n; ++u) {
        if (nk[u] == 0) continue;
        first = std::min(first, lo[u]);
        end = std::max(end, hi[u]);
    }
    for (int64_t j = first; j < end; ++j) {
        const float* xq[kRowGroup];
        const float* xo[kRowGroup];
        float cs[kRowGroup], cp[kRowGroup];
        int64_t m = 0;
        for (int64_t u = 0; u < n; ++u) {
            if (nk[u] == 0 || j < lo[u] || j >= hi[u]) continue;  // only rows that see key j
            cs[m] = ds[u * W + j - lo[u]];
            cp[m] = pk[u * W + j - lo[u]];
            xq[m] = qs + u * a.D;
            xo[m] = dob + u * a.Dv;
            ++m;
        }
        if (m == 0) continue;
        add_weighted_rows(dk_acc + j * a.D * step, a.D, xq, cs, m);   // dK += dS^T (scale q)
        add_weighted_rows(dv_acc + j * a.Dv * step, a.Dv, xo, cp, m);  // dV += (P K)^T dO'
    }
}

// Backward of queries i..i+n-1 (n <= kRowGroup) of a block of nq rows (pre-scaled rows qs, dO'
// rows dob, D and Dv apart, their lse and D_i), query i + u over keys [lo[u], hi[u]): the
// block path's Algorithm 2, lines 11-13, stage by stage over the rows (kRowGroup). dq (n rows
// of D) is written (dS k), dk_acc and dv_acc added to (add_dk_dv).
void backward_rows(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i, int64_t n,
                   int64_t nq, const float* qs, const float* dob, const float* lse,
                   const float* di, const float* kb, int64_t ldk, const float* vb, int64_t ldv,
                   const int64_t* lo, const int64_t* hi, Scratch& w, float* dq, float* dk_acc,
                   float* dv_acc, int64_t step) {
    constexpr int64_t W = kRowPathKeysBackward;  // scores a row
    const int64_t D = a.D, Dv = a.Dv, head = b * a.H + h;
    float *s = w.s.data(), *dp = w.dp.data(), *g = w.g.empty() ? nullptr : w.g.data();
    float* dtab = w.dtab.empty() ? nullptr : w.dtab.data();
    int64_t nk[kRowGroup];
    for (int64_t u = 0; u < n; ++u) {
        prefetch_backward(a, head, sq, i + u, nq, kb, ldk, vb, ldv, hi[u], dk_acc, dv_acc, step);
        nk[u] = lse[u] == kNegInf ? 0 : hi[u] - lo[u];  // a row that sees nothing: no gradient
        if (nk[u] == 0) continue;
        float* gu = g ? g + u * W : nullptr;
        dots(qs + u * D, kb + lo[u] * ldk, ldk, D, nk[u], s + u * W);     // S
        dots(dob + u * Dv, vb + lo[u] * ldv, ldv, Dv, nk[u], dp + u * W);  // dP~ = dO' v^T
        score_mod_row_fwd(a, h, i + u, lo[u], nk[u], s + u * W, gu);
        mask_row(a, b, h, i + u, lo[u], nk[u], s + u * W);
    }
    for (int64_t u = 0; u < n; ++u) {
        if (nk[u] == 0) continue;
        if (a.keep_t < kNoDropout) {
            const RowKey key = row_key(a, row_of(a, head, a.N, sq, i + u));
            grad_row<true>(s + u * W, dp + u * W, nk[u], lse[u], di[u], key,
                           static_cast<uint32_t>(a.keep_t), lo[u]);
        } else {
            grad_row<false>(s + u * W, dp + u * W, nk[u], lse[u], di[u], RowKey{}, 0, lo[u]);
        }
        score_mod_row_bwd(a, h, i + u, lo[u], nk[u], dp + u * W, g ? g + u * W : nullptr, dtab);
    }
    for (int64_t u = 0; u < n; ++u) {
        std::fill(dq + u * D, dq + (u + 1) * D, 0.0f);
        if (nk[u] > 0) weighted_sum(dp + u * W, nk[u], kb + lo[u] * ldk, ldk, D, dq + u * D);
    }
    add_dk_dv(a, n, lo, hi, nk, dp, s, W, qs, dob, dk_acc, dv_acc, step);
}

// One query block of head (b, h), sequence sq; dk, dv (S, D) / (S, Dv) of its kv head are
// accumulated into dk_acc / dv_acc, whose position j is row j * step. FlashAttention-2
// Algorithm 2 with dropout: with keep mask K and dO' = dO * inv_keep, dV += (P*K)^T dO',
// dP~ = dO' V^T, dS = (P*K) * dP~ - P * D_i.
void backward_block(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i0, int64_t i1,
                    Scratch& w, float* dk_acc, float* dv_acc, int64_t step) {
    const int64_t nq = i1 - i0, D = a.D, Dv = a.Dv, kvh = h / (a.H / a.Hkv);
    const int64_t ldk = D * a.groups, ldv = Dv * a.groups;  // key and value rows of sequence sq
    const float* kb = a.k + row_of(a, b * a.Hkv + kvh, a.S, sq, 0) * D;
    const float* vb = a.v + row_of(a, b * a.Hkv + kvh, a.S, sq, 0) * Dv;
    float *s = w.s.data(), *dp = w.dp.data(), *qs = w.qs.data(), *dq = w.acc.data();
    float *dob = w.dob.data(), *dlt = w.dlt.data(), *lse = w.l.data();
    load_q(a, b, h, sq, i0, nq, qs);
    for (int64_t r = 0; r < nq; ++r) {
        const int64_t row = row_of(a, b * a.H + h, a.N, sq, i0 + r);
        const float* go = a.dout + row * Dv;
        const float* o = a.out + row * Dv;
        float d = 0.0f;  // D_i = rowsum(dO * O) (Algorithm 2, line 4)
#pragma omp simd reduction(+ : d)
        for (int64_t e = 0; e < Dv; ++e) d += go[e] * o[e];
#pragma omp simd
        for (int64_t e = 0; e < Dv; ++e) dob[r * Dv + e] = go[e] * a.inv_keep;
        // a gradient on lse adds P_ij * dlse_i to dS_ij, i.e. subtracts dlse_i from D_i
        dlt[r] = a.dlse ? d - a.dlse[row] : d;
        lse[r] = a.lse[row];
    }
    std::fill(dq, dq + nq * D, 0.0f);
    key_blocks(a, b, h, i0, i1, w.blocks, w.lo.data(), w.hi.data());
    const int64_t G = a.H / a.Hkv;
    if (a.groups > 1 && i1 == a.N && h % G == G - 1 && step == a.groups) {
        int64_t first, end;  // sequence sq's last block in place (not split): sq + 1's next
        blocks_span(w, first, end);
        prefetch_next_sequence(a, b * a.H + h - (G - 1), b * a.Hkv + kvh, sq, nq, first, end,
                               true, true);
    }
    const uint32_t t = static_cast<uint32_t>(a.keep_t < kNoDropout ? a.keep_t : 0);
    if (row_path(a, w, i0, i1, kRowPathKeysBackward)) {
        const size_t need = kRowGroup * kRowPathKeysBackward;
        for (std::vector<float>* buf : {&w.s, &w.dp}) {
            if (buf->size() < need) buf->resize(need);
        }
        if (!w.g.empty() && w.g.size() < need) w.g.resize(need);
        each_row(a, w, i0, i1, [&](int64_t r, int64_t n, const int64_t* lo, const int64_t* hi) {
            backward_rows(a, b, h, sq, i0 + r, n, nq, qs + r * D, dob + r * Dv, lse + r, dlt + r,
                          kb, ldk, vb, ldv, lo, hi, w, dq + r * D, dk_acc, dv_acc, step);
        });
        w.blocks.clear();  // computed: no blocks left
    }
    for (const KeyBlock& blk : w.blocks) {
        const int64_t j0 = blk.j0, nk = blk.nk;
        w.work += nq * nk;
        mm_nt(nq, nk, D, qs, D, kb + j0 * ldk, ldk, 0.0f, s, nk);         // S
        mm_nt(nq, nk, Dv, dob, Dv, vb + j0 * ldv, ldv, 0.0f, dp, nk);  // dP~ = dO' v^T
        for (int64_t r = 0; r < nq; ++r) {
            float *sr = s + r * nk, *dr = dp + r * nk;
            const int64_t i = i0 + r;
            if (lse[r] == kNegInf) {  // the row sees nothing: P = 0, no gradient
                std::fill(sr, sr + nk, 0.0f);
                std::fill(dr, dr + nk, 0.0f);
                continue;
            }
            float* gr = w.g.empty() ? nullptr : w.g.data() + r * nk;
            score_mod_row_fwd(a, h, i, j0, nk, sr, gr);
            mask_row(a, b, h, i, j0, nk, sr);
            mask_row_structured(a, blk, w.lo.data() + r, w.hi.data() + r, r, sr);
            if (a.keep_t < kNoDropout) {
                const RowKey key = row_key(a, row_of(a, b * a.H + h, a.N, sq, i));
                grad_row<true>(sr, dr, nk, lse[r], dlt[r], key, t, j0);
            } else {
                grad_row<false>(sr, dr, nk, lse[r], dlt[r], RowKey{}, 0, j0);
            }
            score_mod_row_bwd(a, h, i, j0, nk, dr, gr, w.dtab.empty() ? nullptr : w.dtab.data());
        }
        const int64_t ldv_acc = Dv * step, ldk_acc = D * step;
        mm_tn(nk, Dv, nq, s, nk, dob, Dv, 1.0f, dv_acc + j0 * ldv_acc, ldv_acc);  // dV += (PK)^T dO'
        mm_nn(nq, D, nk, dp, nk, kb + j0 * ldk, ldk, 1.0f, dq, D);  // dQ += dS k
        mm_tn(nk, D, nq, dp, nk, qs, D, 1.0f, dk_acc + j0 * ldk_acc, ldk_acc);  // dK += dS^T (sq)
    }
    for (int64_t r = 0; r < nq; ++r) {
        float* dq_out = a.dq + row_of(a, b * a.H + h, a.N, sq, i0 + r) * D;
#pragma omp simd
        for (int64_t e = 0; e < D; ++e) dq_out[e] = dq[r * D + e] * a.scale;
    }
}

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

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
#pragma omp parallel num_threads(static_cast<int>(a.nthreads))
    {
        Scratch w(a);
        w.dp.resize(a.bq * a.bk);
        w.dob.resize(a.bq * a.Dv);
        w.dlt.resize(a.bq);
        if (a.softcap > 0.0f) w.g.resize(a.bq * a.bk);
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

extern "C" {

int attnkit_abi_version() { return 9; }  // 8: runs of keys (Args::rows_k); 9: backward_write

// Forward: fills out and lse. Work items are (b, h, sequence, query block), over the threads.
void attnkit_attention_forward(const Args* args) {
    const Args& a = *args;
    const int64_t nqb = ceil_div(a.N, a.bq), items = a.B * a.H * a.groups * nqb;
#pragma omp parallel num_threads(static_cast<int>(a.nthreads))
    {
        Scratch w(a);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < items; ++t) {
            const int64_t seq = t / nqb, bh = seq / a.groups, i0 = (t % nqb) * a.bq;
            forward_block(a, bh / a.H, bh % a.H, seq % a.groups, i0, std::min(i0 + a.bq, a.N), w);
        }
        if (a.work) {
#pragma omp atomic
            *a.work += w.work;
        }
    }
}

// Backward: fills dq and ADDS the gradients to dk, dv (zeroed by the caller, or partial sums
// being accumulated: ring attention).
void attnkit_attention_backward(const Args* args) { backward(*args, false); }

// Backward: fills dq, dk and dv (whatever dk and dv held before).
void attnkit_attention_backward_write(const Args* args) { backward(*args, true); }

// The dropout keep words of rows [row0, row0 + rows) and keys [j0, j0 + nk), for tests:
// out (rows, nk) uint32.
void attnkit_keep_words(const Args* args, int64_t row0, int64_t rows, int64_t j0, int64_t nk,
                        uint32_t* out) {
    for (int64_t r = 0; r < rows; ++r) {
        const RowKey key = row_key(*args, row0 + r);
        for (int64_t c = 0; c < nk; ++c) out[r * nk + c] = keep_word(key, j0 + c);
    }
}

// 1 if the n contiguous elements at address (addr_hi << 32) | addr_lo, of dtype `code`
// (attnkit_finite::Code), are all finite, 0 if one is a NaN or ±inf, -1 for an unknown code.
// Called from Python on every short-path attention call (native.py, `finite_check`) through
// ctypes with no argtypes, each argument a C int: ~0.3 µs less than converting a pointer and
// an int64 (1.5% of a 20 µs call), hence the address in two halves and n < 2^31.
int attnkit_all_finite(uint32_t addr_lo, uint32_t addr_hi, int32_t n, int32_t code) {
    const uintptr_t addr = static_cast<uintptr_t>((static_cast<uint64_t>(addr_hi) << 32) | addr_lo);
    return attnkit_finite::all_finite_code(reinterpret_cast<const void*>(addr), n, code);
}

}  // extern "C"
