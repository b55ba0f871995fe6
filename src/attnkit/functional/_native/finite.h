// Whether a dense float buffer holds only finite numbers, for attention's rule 1 on the short
// path (attnkit/functional/_fast_path.py): a NaN or ±inf is exactly an all-ones exponent field,
// so each element is one AND and one compare on its bits. The loop has no branch and no early
// exit (the usual answer, "all finite", reads every element anyway), so the compiler
// vectorises it at the kernel's -march; a scalar tail handles any length.

#pragma once

#include <cstdint>

namespace attnkit_finite {

// dtype codes of attnkit_all_finite (attnkit/functional/native.py, `FINITE_CODES`)
enum Code : int { kFloat32 = 0, kFloat64 = 1, kBFloat16 = 2, kFloat16 = 3 };

// 1 if no element of the n words has all of `exp` set in its exponent field, else 0.
template <typename W>
int all_finite(const void* data, int64_t n, W exp) {
    const W* w = static_cast<const W*>(data);
    W bad = 0;
    for (int64_t i = 0; i < n; ++i) bad |= static_cast<W>((w[i] & exp) == exp);
    return bad == 0;
}

// The exponent masks: float32 8 bits, float64 11, bfloat16 8 (float32's top half), float16 5.
// -1 for an unknown code.
inline int all_finite_code(const void* data, int64_t n, int code) {
    switch (code) {
        case kFloat32: return all_finite<uint32_t>(data, n, 0x7f800000u);
        case kFloat64: return all_finite<uint64_t>(data, n, 0x7ff0000000000000ull);
        case kBFloat16: return all_finite<uint16_t>(data, n, 0x7f80u);
        case kFloat16: return all_finite<uint16_t>(data, n, 0x7c00u);
        default: return -1;
    }
}

}  // namespace attnkit_finite
