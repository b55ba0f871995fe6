// The kernel's matrix products (the block path's S = q k^T, P v, dS k, ...): row-major wrappers
// around the BLAS sgemm_ that libtorch_cpu exports (MKL in torch's CPU wheels). They run inside
// the kernel's OpenMP region on torch's own libgomp, so MKL stays sequential per thread.
//
// Legend: gemm is sgemm_ with alpha = 1; mm_nt, mm_nn, mm_tn are C (r x c) = A op B [+ C],
// n = as stored, t = transposed, for row-major A, B, C with leading dimensions lda, ldb, ldc.

#pragma once

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc);

namespace {

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

}  // namespace
