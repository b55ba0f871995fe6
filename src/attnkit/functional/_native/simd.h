// Explicit SIMD for attention_cpu.cpp's softmax loops, on GCC/Clang vector extensions: one
// vector of kLanes floats is a zmm register where the kernel is compiled for AVX-512, a ymm
// register for AVX/AVX2, an xmm (or NEON) register elsewhere. The width is fixed at compile
// time by the -march the kernel is built with (attnkit/functional/_kernel_cache.py).
//
// Why not leave it to the auto-vectoriser: with -march=x86-64-v3 gcc 12 kept the forward's
// exp-and-sum loop scalar and branchy on the path it ran (perf: 33% of a dense forward in that
// loop against 9% for the same source at -march=native), and the same holds for whichever loop
// it gives up on next. Written as vectors, every build runs the same instructions per lane.
//
// Every function here computes, lane by lane, what the scalar helpers of attention_cpu.cpp
// compute for one element (exp_v is exp_f up to the compiler's contraction into FMAs,
// keep_words is keep_word bit for bit). A row's last partial vector goes through the same
// vector code (load_part / store_part), so no position in a row is computed differently.

#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#define ATTNKIT_VBYTES 64
#elif defined(__AVX__)
#define ATTNKIT_VBYTES 32
#else
#define ATTNKIT_VBYTES 16
#endif

namespace attnkit_simd {

constexpr int kLanes = ATTNKIT_VBYTES / 4;

typedef float vfloat __attribute__((vector_size(ATTNKIT_VBYTES)));
typedef int32_t vint __attribute__((vector_size(ATTNKIT_VBYTES)));
typedef uint32_t vuint __attribute__((vector_size(ATTNKIT_VBYTES)));

inline vfloat splat(float x) { return vfloat{} + x; }

inline vfloat load(const float* p) {  // unaligned
    vfloat v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline void store(float* p, vfloat v) { std::memcpy(p, &v, sizeof v); }

// The first n < kLanes elements of p, the other lanes `fill`; and their store.
inline vfloat load_part(const float* p, int64_t n, float fill) {
    float buf[kLanes];
    for (int u = 0; u < kLanes; ++u) buf[u] = u < n ? p[u] : fill;
    return load(buf);
}

inline void store_part(float* p, vfloat v, int64_t n) {
    for (int u = 0; u < n; ++u) p[u] = v[u];
}

inline vfloat vmax(vfloat a, vfloat b) { return a > b ? a : b; }  // a NaN in a is passed over

inline float hsum(vfloat v) {
    float s = 0.0f;
    for (int u = 0; u < kLanes; ++u) s += v[u];
    return s;
}

inline float hmax(vfloat v, float m) {
    for (int u = 0; u < kLanes; ++u) m = v[u] > m ? v[u] : m;
    return m;
}

// exp(x) lane by lane, with exp_f's meaning (attention_cpu.cpp): Cody-Waite reduction
// x = k ln2 + r and the Cephes polynomial (about 1 ulp), 0 exactly below -87.33 (and at -inf),
// NaN stays NaN. Two operations fewer than exp_f's scalar form: k + 127 is read from the low
// bits of x log2(e) + 1.5 * 2^23 + 127 (the addition rounds to an integer there), so 2^k is
// that float's bits shifted into the exponent field, without a float-to-int conversion.
inline vfloat exp_v(vfloat x) {
    const vfloat lo = splat(-87.33654f), hi = splat(88.0f);
    const float shifter = 12582912.0f + 127.0f;  // 1.5 * 2^23 + the exponent bias
    vfloat xc = x < lo ? lo : x;                 // max(lo, x), a NaN x kept
    xc = xc > hi ? hi : xc;
    const vfloat t = xc * 1.44269504088896341f + shifter;
    const vfloat kf = t - shifter;  // k, the nearest integer to x log2(e)
    vfloat r = xc - kf * 0.693359375f;
    r = r + kf * 2.12194440e-4f;
    vfloat p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const vfloat y = p * (r * r) + r + 1.0f;
    vint bits;
    std::memcpy(&bits, &t, sizeof bits);
    bits <<= 23;  // k + 127 < 256 sits in the low bits: it becomes the exponent of 2^k
    vfloat two_k;
    std::memcpy(&two_k, &bits, sizeof two_k);
    return x < lo ? vfloat{} : y * two_k;
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

}  // namespace attnkit_simd
