// Explicit SIMD for the kernel's softmax loops, on GCC/Clang vector extensions: one
// vector of kLanes floats is a zmm register where the kernel is compiled for AVX-512, a ymm
// register for AVX/AVX2, an xmm (or NEON) register elsewhere. The width is fixed at compile
// time by the -march the kernel is built with (attnkit/functional/_kernel_cache.py).
//
// Why not leave it to the auto-vectoriser: with -march=x86-64-v3 gcc 12 kept the forward's
// exp-and-sum loop scalar and branchy on the path it ran (perf: 33% of a dense forward in that
// loop against 9% for the same source at -march=native), and the same holds for whichever loop
// it gives up on next. Written as vectors, every build runs the same instructions per lane.
//
// Every function here computes, lane by lane, what the kernel's scalar helpers compute for
// one element (exp_v and exp_f share one body, exp_clamped, up to the compiler's contraction into FMAs; keep_words is
// dropout.h's keep_word bit for bit). A row's last partial vector goes through the same
// vector code (load_part / store_part), so no position in a row is computed differently.

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define ATTNKIT_VBYTES 64
#elif defined(__AVX__)
#define ATTNKIT_VBYTES 32
#else
#define ATTNKIT_VBYTES 16
#endif

namespace attnkit_simd {

constexpr int kLanes = ATTNKIT_VBYTES / 4;

// exp's clamps and rounding constant (exp_f and exp_v). At x = kExpLo = -127 ln2 the nearest
// k is -127, whose 2^k has exponent field 0 and reads as +0.0: exp is 0 exactly from k = -127
// on (x < -87.68), without a comparison, and -inf (clamped to kExpLo) gives 0, never NaN.
// Adding kExpShifter = 1.5 * 2^23 + 127 rounds x log2(e) to an integer k and leaves k + 127 in
// the low bits of the sum.
constexpr float kExpLo = -88.02969193f;
constexpr float kExpShifter = 12582912.0f + 127.0f;

typedef float vfloat __attribute__((vector_size(ATTNKIT_VBYTES)));
typedef int32_t vint __attribute__((vector_size(ATTNKIT_VBYTES)));
typedef uint32_t vuint __attribute__((vector_size(ATTNKIT_VBYTES)));

// x in every lane: a broadcast (vfloat{} + x also added 0 to x first: gcc 12 kept the add).
#if defined(__AVX512F__)
inline vfloat splat(float x) { return _mm512_set1_ps(x); }
#elif defined(__AVX__)
inline vfloat splat(float x) { return _mm256_set1_ps(x); }
#else
inline vfloat splat(float x) { return vfloat{} + x; }
#endif

inline vfloat load(const float* p) {  // unaligned
    vfloat v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline void store(float* p, vfloat v) { std::memcpy(p, &v, sizeof v); }

// The first n < kLanes elements of p, the other lanes `fill`; and their store. Masked loads
// and stores where the ISA has them: the lanes past n are neither read nor written (no
// fault past an array's end), and no scalar copy through a buffer (a vector load of a buffer
// just written a float at a time waits ~20 cycles for the stores to drain: perf showed the
// row path's one partial vector per row in row_max and exp_sum_row as 10-15% of a narrow
// window's forward).
#if defined(__AVX512F__)
inline __mmask16 lanes_below(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
inline vfloat load_part(const float* p, int64_t n, float fill) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), lanes_below(n), p);
}
inline void store_part(float* p, vfloat v, int64_t n) { _mm512_mask_storeu_ps(p, lanes_below(n), v); }
#elif defined(__AVX2__)
inline __m256i lanes_below(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline vfloat load_part(const float* p, int64_t n, float fill) {
    const __m256i m = lanes_below(n);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}
inline void store_part(float* p, vfloat v, int64_t n) { _mm256_maskstore_ps(p, lanes_below(n), v); }
#else
inline vfloat load_part(const float* p, int64_t n, float fill) {
    float buf[kLanes];
    for (int u = 0; u < kLanes; ++u) buf[u] = u < n ? p[u] : fill;
    return load(buf);
}

inline void store_part(float* p, vfloat v, int64_t n) {
    for (int u = 0; u < n; ++u) p[u] = v[u];
}
#endif

// v's first n lanes (0 <= n), the others `fill`: load_part's, on a register.
#if defined(__AVX512F__)
inline vfloat keep_below(vfloat v, int64_t n, float fill) {
    return _mm512_mask_blend_ps(lanes_below(std::min<int64_t>(n, kLanes)), _mm512_set1_ps(fill), v);
}
#elif defined(__AVX2__)
inline vfloat keep_below(vfloat v, int64_t n, float fill) {
    return _mm256_blendv_ps(_mm256_set1_ps(fill), v, _mm256_castsi256_ps(lanes_below(n)));
}
#endif

// a > b ? a : b and a < b ? a : b, a NaN in a passed over: x86's maxps / minps (one
// instruction; gcc 12 left the same selects written as vector ?: as a compare and a blend).
#if defined(__AVX512F__)
inline vfloat vmax(vfloat a, vfloat b) { return _mm512_max_ps(a, b); }
inline vfloat vmin(vfloat a, vfloat b) { return _mm512_min_ps(a, b); }
#elif defined(__AVX__)
inline vfloat vmax(vfloat a, vfloat b) { return _mm256_max_ps(a, b); }
inline vfloat vmin(vfloat a, vfloat b) { return _mm256_min_ps(a, b); }
#elif defined(__SSE__)
inline vfloat vmax(vfloat a, vfloat b) { return _mm_max_ps(a, b); }
inline vfloat vmin(vfloat a, vfloat b) { return _mm_min_ps(a, b); }
#else
inline vfloat vmax(vfloat a, vfloat b) { return a > b ? a : b; }
inline vfloat vmin(vfloat a, vfloat b) { return a < b ? a : b; }
#endif

inline float hsum(vfloat v) {
    float s = 0.0f;
    for (int u = 0; u < kLanes; ++u) s += v[u];
    return s;
}

// The sum of the lanes as a tree of shuffles and adds (hsum adds them one after another): for
// the row path's dot products, one per key.
inline float reduce_add(vfloat v) {
#if defined(__AVX512F__)
    return _mm512_reduce_add_ps(v);
#elif defined(__AVX__)
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
#else
    return hsum(v);
#endif
}

// The lane sums of four vectors as one 128-bit vector [sum a0, sum a1, sum a2, sum a3]: the
// four reduced together, a shuffle tree within each 128-bit lane, then the lanes added (two or
// four dot products' worth of shuffles fewer than four reduce_add). x86 only (reduce_add4
// elsewhere): the narrow path (narrow_path.h) keeps them in registers.
#if defined(__AVX512F__)
inline __m128 sums4(vfloat a0, vfloat a1, vfloat a2, vfloat a3) {
    // per 128-bit lane: t0 = [a0 0+2, a1 0+2, a0 1+3, a1 1+3], t1 the same of a2, a3
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1));
    const __m256 v = _mm256_add_ps(_mm512_castps512_ps256(u), hi);
    return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
}
#elif defined(__AVX__)
inline __m128 sums4(vfloat a0, vfloat a1, vfloat a2, vfloat a3) {
    const __m256 t0 = _mm256_add_ps(_mm256_unpacklo_ps(a0, a1), _mm256_unpackhi_ps(a0, a1));
    const __m256 t1 = _mm256_add_ps(_mm256_unpacklo_ps(a2, a3), _mm256_unpackhi_ps(a2, a3));
    const __m256 u = _mm256_add_ps(_mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}
#endif

// The lane sums of four vectors into out[0..4) (sums4 where there is one).
inline void reduce_add4(vfloat a0, vfloat a1, vfloat a2, vfloat a3, float* out) {
#if defined(__AVX__)
    _mm_storeu_ps(out, sums4(a0, a1, a2, a3));
#else
    out[0] = hsum(a0);
    out[1] = hsum(a1);
    out[2] = hsum(a2);
    out[3] = hsum(a3);
#endif
}

// The largest of m and the lanes of v, NaN lanes passed over: vmax(v, m) replaces them by m
// (maxps returns its second operand when the first is NaN), then a tree of maxima.
inline float hmax(vfloat v, float m) {
    v = vmax(v, splat(m));
#if defined(__AVX512F__)
    return _mm512_reduce_max_ps(v);
#elif defined(__AVX__)
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
#else
    for (int u = 0; u < kLanes; ++u) m = v[u] > m ? v[u] : m;
    return m;
#endif
}

// exp of an already clamped x (float or vfloat, with the integer type of its bits), the one
// body of exp_v and exp_f: Cody-Waite reduction x = k ln2 + r, |r| <= ln2 / 2, the Cephes expf
// polynomial (under 1 ulp), 2^k built from the bits of the sum that rounds x log2(e) (k + 127 in
// 0 .. 254 sits in t's low bits: the exponent field of 2^k). 15 operations and no select.
template <typename F, typename Bits>
inline F exp_clamped(F xc) {
    const F t = xc * 1.44269504088896341f + kExpShifter;
    const F kf = t - kExpShifter;  // k, the nearest integer to x log2(e)
    F r = xc - kf * 0.693359375f;
    r = r + kf * 2.12194440e-4f;
    F p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const F y = p * (r * r) + r + 1.0f;
    Bits bits;
    std::memcpy(&bits, &t, sizeof bits);
    bits <<= 23;
    F two_k;
    std::memcpy(&two_k, &bits, sizeof two_k);
    return y * two_k;
}

// exp(x) lane by lane, with exp_f's meaning: 0 exactly below -87.68 (and at -inf), NaN stays
// NaN (vmax and vmin return their second operand where one is NaN).
inline vfloat exp_v(vfloat x) {
    return exp_clamped<vfloat, vint>(vmin(splat(88.0f), vmax(splat(kExpLo), x)));
}

// The dropout words of keys j .. j + kLanes - 1 of one row: keep_word lane by lane.
inline vuint keep_words(uint32_t key_lo, uint32_t key_hi, int64_t j) {
    vuint x;
    for (int u = 0; u < kLanes; ++u) x[u] = static_cast<uint32_t>(u);  // folded to a constant
    x += static_cast<uint32_t>(j) + key_lo;
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x ^= key_hi;
    x *= 0x846ca68bU;
    return x ^ (x >> 16);
}


// exp(x) in float32 for softmax arguments (exp_clamped): exp is 0 exactly for x < -87.68
// (k = -127) and at -inf, and NaN stays NaN (simd.h, kExpLo). The scalar twin of exp_v, for the
// one value per row (the rescale factor of the running sums); branch-free, no libm call.
inline float exp_f(float x) {
    float xc = kExpLo > x ? kExpLo : x;  // a NaN x kept, as vmax / vmin do
    xc = 88.0f < xc ? 88.0f : xc;
    return exp_clamped<float, uint32_t>(xc);
}

// ------------------------------------------------------------------ prefetch
// A row of n floats into the cache ahead of its use, one hint per 64-byte line: for reads, or
// for writes (the line fetched for ownership, so that the store does not wait for it). As
// volatile asm on x86: gcc 12 -O1 and up deleted every __builtin_prefetch of the kernel's row
// path (objdump: none left), asm it must keep.
#if defined(__x86_64__) || defined(__i386__)
inline void prefetch_row(const float* p, int64_t n) {
    for (int64_t e = 0; e < n; e += 16) asm volatile("prefetcht0 %0" : : "m"(p[e]));
}

// Into the second-level cache only (fewer first-level miss buffers held).
inline void prefetch_row_l2(const float* p, int64_t n) {
    for (int64_t e = 0; e < n; e += 16) asm volatile("prefetcht1 %0" : : "m"(p[e]));
}

inline void prefetch_row_w(float* p, int64_t n) {
#if defined(__PRFCHW__)
    for (int64_t e = 0; e < n; e += 16) asm volatile("prefetchw %0" : : "m"(p[e]));
#else
    prefetch_row(p, n);
#endif
}
#else
inline void prefetch_row(const float* p, int64_t n) {
    for (int64_t e = 0; e < n; e += 16) __builtin_prefetch(p + e, 0, 3);
}

inline void prefetch_row_l2(const float* p, int64_t n) {
    for (int64_t e = 0; e < n; e += 16) __builtin_prefetch(p + e, 0, 2);
}

inline void prefetch_row_w(float* p, int64_t n) {
    for (int64_t e = 0; e < n; e += 16) __builtin_prefetch(p + e, 1, 3);
}
#endif

// ------------------------------------------------------------------ small products
// The row path's (row_path.h) products of one query row with a few key or value rows.

inline float dot(const float* x, const float* y, int64_t n) {
    vfloat acc{};
    int64_t e = 0;
    for (; e + kLanes <= n; e += kLanes) acc += load(x + e) * load(y + e);
    if (e < n) acc += load_part(x + e, n - e, 0.0f) * load_part(y + e, n - e, 0.0f);
    return reduce_add(acc);
}

// s[c] = x . row c of y (n wide, rows ld apart) for c < nk: four rows at a time, sharing the
// loads of x and reduced together.
inline void dots(const float* x, const float* y, int64_t ld, int64_t n, int64_t nk, float* s) {
    int64_t c = 0;
    for (; c + 4 <= nk; c += 4) {
        const float* y0 = y + c * ld;
        vfloat a0{}, a1{}, a2{}, a3{};
        int64_t e = 0;
        for (; e + kLanes <= n; e += kLanes) {
            const vfloat xv = load(x + e);
            a0 += xv * load(y0 + e);
            a1 += xv * load(y0 + ld + e);
            a2 += xv * load(y0 + 2 * ld + e);
            a3 += xv * load(y0 + 3 * ld + e);
        }
        if (e < n) {
            const int64_t m = n - e;
            const vfloat xv = load_part(x + e, m, 0.0f);
            a0 += xv * load_part(y0 + e, m, 0.0f);
            a1 += xv * load_part(y0 + ld + e, m, 0.0f);
            a2 += xv * load_part(y0 + 2 * ld + e, m, 0.0f);
            a3 += xv * load_part(y0 + 3 * ld + e, m, 0.0f);
        }
        reduce_add4(a0, a1, a2, a3, s + c);
    }
    for (; c < nk; ++c) s[c] = dot(x, y + c * ld, n);
}

// out (n) = [out +] the sum of w * row over the terms (w, row) that terms(f) hands to f, each
// row n wide: n in chunks of four vectors, so that four independent chains of multiply-adds
// run at once, the sum held in registers across the rows (accumulating in memory would chain
// every row's update to the previous one's store: one load and one store of out per vector,
// not one per row). The terms come in the same order for every chunk, so the sums' order is
// the visitor's. kScaled: the sum times f is stored (the narrow path's output row, normalised
// on its way out).
template <bool kAccumulate, bool kScaled = false, typename Terms>
inline void combine_terms(float* out, int64_t n, Terms terms, float f = 1.0f) {
    const vfloat fv = splat(f);
    int64_t e = 0;
    for (; e + 4 * kLanes <= n; e += 4 * kLanes) {
        vfloat a0{}, a1{}, a2{}, a3{};
        if (kAccumulate) {
            a0 = load(out + e), a1 = load(out + e + kLanes);
            a2 = load(out + e + 2 * kLanes), a3 = load(out + e + 3 * kLanes);
        }
        terms([&](float w, const float* x) {
            const vfloat wu = splat(w);
            const float* xu = x + e;
            a0 += wu * load(xu);
            a1 += wu * load(xu + kLanes);
            a2 += wu * load(xu + 2 * kLanes);
            a3 += wu * load(xu + 3 * kLanes);
        });
        if (kScaled) a0 *= fv, a1 *= fv, a2 *= fv, a3 *= fv;
        store(out + e, a0);
        store(out + e + kLanes, a1);
        store(out + e + 2 * kLanes, a2);
        store(out + e + 3 * kLanes, a3);
    }
    for (; e < n; e += kLanes) {  // one vector at a time, the last one partial
        const int64_t r = std::min<int64_t>(kLanes, n - e);
        vfloat acc{};
        if (kAccumulate) acc = load_part(out + e, r, 0.0f);
        terms([&](float w, const float* x) { acc += splat(w) * load_part(x + e, r, 0.0f); });
        if (kScaled) acc *= fv;
        store_part(out + e, acc, r);
    }
}

// out (n) = [out +] sum over u < m of w[u * ws] * row(u) [times f]: combine_terms over m rows.
template <bool kAccumulate, bool kScaled = false, typename Row>
inline void combine_rows(float* out, int64_t n, const float* w, int64_t ws, int64_t m, Row row,
                         float f = 1.0f) {
    combine_terms<kAccumulate, kScaled>(out, n, [&](auto&& g) {
        for (int64_t u = 0; u < m; ++u) g(w[u * ws], row(u));
    }, f);
}

// out (n) = sum over c < nk of p[c * ps] * row c of x (rows ld apart): a row's weighted sum of
// values (ps: the tile path's probabilities lie a tile's rows apart).
inline void weighted_sum(const float* p, int64_t nk, const float* x, int64_t ld, int64_t n,
                         float* out, int64_t ps = 1) {
    combine_rows<false>(out, n, p, ps, nk, [x, ld](int64_t c) { return x + c * ld; });
}

// out (n) += sum over u < m of c[u] * x[u]: a key's dK or dV row updated once for the m query
// rows of the row path that see it.
inline void add_weighted_rows(float* out, int64_t n, const float* const* x, const float* c,
                              int64_t m) {
    combine_rows<true>(out, n, c, 1, m, [x](int64_t u) { return x[u]; });
}

#if defined(__AVX__)
// dst (8 x 8, rows ldd apart) = the 8 x 8 floats at src (rows lds apart) transposed, rows of
// src from `rows` on read as 0 (unpack, shuffle, cross-lane permute: 24 shuffles): the
// backward's transposed keys (transposed.h) and the tile path's transposed queries; kAdd:
// added to dst instead (the offset path's dK, dV rows, offset_backward.h).
template <bool kAdd = false>
inline void transpose8(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t rows = 8) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = i < rows ? _mm256_loadu_ps(src + i * lds) : __m256{};
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    auto put = [](float* p, __m256 x) {
        _mm256_storeu_ps(p, kAdd ? _mm256_add_ps(_mm256_loadu_ps(p), x) : x);
    };
    for (int i = 0; i < 4; ++i) {
        put(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        put(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}
#endif

}  // namespace attnkit_simd
