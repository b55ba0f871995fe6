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
    return hsum(sum);
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

// Calls row(r, lo, hi) for each row r of rows i0..i1 on the row path with its keys [lo, hi)
// (`row_span`), counting them as computed.
template <typename F>
void each_row(const Args& a, Scratch& w, int64_t i0, int64_t i1, F&& row) {
    int64_t first, end;
    blocks_span(w, first, end);
    for (int64_t r = 0; r < i1 - i0; ++r) {
        int64_t lo, hi;
        row_span(a, w, r, i0 + r, first, end, lo, hi);
        w.work += hi - lo;
        row(r, lo, hi);
    }
}

// Forward of query i (pre-scaled row qr) over keys [lo, hi); kb, vb: the keys and values of
// its sequence, ldk, ldv apart.
void forward_row(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i, const float* qr,
                 const float* kb, int64_t ldk, const float* vb, int64_t ldv, int64_t lo,
                 int64_t hi, float* s, float* acc) {
    const int64_t nk = hi - lo, row = row_of(a, b * a.H + h, a.N, sq, i);
    dots(qr, kb + lo * ldk, ldk, a.D, nk, s);
    score_mod_row_fwd(a, h, i, lo, nk, s, nullptr);
    mask_row(a, b, h, i, lo, nk, s);
    const float m = row_max(s, nk), m_safe = m == kNegInf ? 0.0f : m;
    const float l = a.keep_t < kNoDropout
        ? exp_sum_row<true>(s, nk, m_safe, row_key(a, row), static_cast<uint32_t>(a.keep_t), lo)
        : exp_sum_row<false>(s, nk, m_safe, RowKey{}, 0, lo);
    weighted_sum(s, nk, vb + lo * ldv, ldv, a.Dv, acc);
    write_row(a, row, acc, m, l);
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
    if (row_path(a, w, i0, i1, kRowPathKeys)) {
        each_row(a, w, i0, i1, [&](int64_t r, int64_t lo, int64_t hi) {
            forward_row(a, b, h, sq, i0 + r, qs + r * D, kb, ldk, vb, ldv, lo, hi, s, acc);
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

// Backward of query i (pre-scaled row qr, dO' row dor, its lse and D_i) over keys [lo, hi):
// the block path's Algorithm 2, lines 11-13, a row at a time. dq (D) is written (dS k), and
// the rows lo..hi of dk_acc and dv_acc (D * step and Dv * step apart) are added to.
void backward_row(const Args& a, int64_t b, int64_t h, int64_t sq, int64_t i, const float* qr,
                  const float* dor, float lse, float di, const float* kb, int64_t ldk,
                  const float* vb, int64_t ldv, int64_t lo, int64_t hi, Scratch& w, float* dq,
                  float* dk_acc, float* dv_acc, int64_t step) {
    const int64_t nk = hi - lo, D = a.D, Dv = a.Dv;
    std::fill(dq, dq + D, 0.0f);
    if (lse == kNegInf || nk == 0) return;  // the row sees nothing: no gradient
    float *s = w.s.data(), *dp = w.dp.data(), *g = w.g.empty() ? nullptr : w.g.data();
    dots(qr, kb + lo * ldk, ldk, D, nk, s);     // S
    dots(dor, vb + lo * ldv, ldv, Dv, nk, dp);  // dP~ = dO' v^T
    score_mod_row_fwd(a, h, i, lo, nk, s, g);
    mask_row(a, b, h, i, lo, nk, s);
    if (a.keep_t < kNoDropout) {
        const RowKey key = row_key(a, row_of(a, b * a.H + h, a.N, sq, i));
        grad_row<true>(s, dp, nk, lse, di, key, static_cast<uint32_t>(a.keep_t), lo);
    } else {
        grad_row<false>(s, dp, nk, lse, di, RowKey{}, 0, lo);
    }
    score_mod_row_bwd(a, h, i, lo, nk, dp, g, w.dtab.empty() ? nullptr : w.dtab.data());
    weighted_sum(dp, nk, kb + lo * ldk, ldk, D, dq);  // dQ = dS k
    for (int64_t c = 0; c < nk; ++c) {
        const float ds = dp[c], pk = s[c];
        float* dkr = dk_acc + (lo + c) * D * step;
        float* dvr = dv_acc + (lo + c) * Dv * step;
#pragma omp simd
        for (int64_t e = 0; e < D; ++e) dkr[e] += ds * qr[e];  // dK += dS^T (scale q)
#pragma omp simd
        for (int64_t e = 0; e < Dv; ++e) dvr[e] += pk * dor[e];  // dV += (P K)^T dO'
    }
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
    const uint32_t t = static_cast<uint32_t>(a.keep_t < kNoDropout ? a.keep_t : 0);
    if (row_path(a, w, i0, i1, kRowPathKeysBackward)) {
        each_row(a, w, i0, i1, [&](int64_t r, int64_t lo, int64_t hi) {
            backward_row(a, b, h, sq, i0 + r, qs + r * D, dob + r * Dv, lse[r], dlt[r], kb, ldk,
                         vb, ldv, lo, hi, w, dq + r * D, dk_acc, dv_acc, step);
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
