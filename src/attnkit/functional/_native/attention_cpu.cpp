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
// The matrix products call the BLAS sgemm_ that libtorch_cpu exports (MKL in the CPU wheels),
// except the backward's and the forward block path's on AVX-512 builds (gemm_acc.h,
// transposed.h); they run inside the kernel's OpenMP regions on torch's own libgomp, so MKL
// stays sequential per thread. Everything between two products is one loop over the block.
//
// Dropout bits are a counter-based hash of each entry's position (dropout.h), so the backward
// regenerates them and nothing N x S is stored.
//
// The parts, each a header of this folder included here (one translation unit; the helpers
// live in an anonymous namespace):
//   args.h            Args, the call's arguments (mirrored by attnkit/functional/native.py)
//   simd.h            explicit vectors: exp_v, keep_words, the row path's dots / weighted_sum
//   blas.h            the row-major matrix products gemm, mm_nt, mm_nn, mm_tn (sgemm_)
//   gemm_acc.h        products as register tiles (AVX-512): acc_nn, acc_tn
//   transposed.h      each thread's transposed keys (and values) for S (and dP~): times_keys
//   dropout.h         the dropout hash: mix64, row_key, keep_word
//   softmax_row.h     one row's softmax: row_max, exp_sum_row (forward), grad_row (backward)
//   score_mods.h      score functions (softcap, ALiBi, relative tables) on a row
//   masks.h           bias, dense masks, causal, runs and tiles: at, mask_row, KeyBlock,
//                     mask_row_structured, key_end, stretches, key_blocks
//   scratch.h         per-thread Scratch, row_of, dout_row, load_q, ceil_div, advise_huge_pages
//   row_path.h        narrow windows a row at a time: row_path, each_row, the prefetch
//   narrow_path.h     the forward of those rows with plain scores, each row in registers
//   tile_path.h       short documents and sequences 8 rows at a time: tile_path,
//                     tile_product (the scores in registers), tile_softmax, tile_gemm
//   tile_backward.h   the backward of those blocks: backward_tiles, backward_tile
//   forward.h         the forward of a query block: forward_block, forward_rows,
//                     forward_tile, write_row
//   backward_block.h  the backward of a query block: backward_block, backward_rows, add_dk_dv
//   partition.h       how the backward's work is cut into runs among threads
//   backward.h        the backward over a call: backward, backward_runs, add_slots
//   finite.h          the finiteness scan behind attnkit_all_finite
// This file holds the extern "C" entry points that attnkit/functional/native.py calls.

#include <algorithm>
#include <cstdint>

#include "args.h"
#include "backward.h"
#include "dropout.h"
#include "finite.h"
#include "forward.h"
#include "scratch.h"

extern "C" {

// 8: runs of keys (Args::rows_k); 9: backward_write; 10: dO's strides (Args::dout_st);
// 11: the query row map (Args::qrows)
int attnkit_abi_version() { return 11; }

// Forward: fills out and lse. Work items are (b, h, sequence, query block), over the threads.
void attnkit_attention_forward(const Args* args) {
    const Args& a = *args;
    const int64_t nqb = ceil_div(a.N, a.bq), items = a.B * a.H * a.groups * nqb;
    advise_huge_pages(a.out, a.B * a.H * a.groups * a.N * a.Dv);
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
