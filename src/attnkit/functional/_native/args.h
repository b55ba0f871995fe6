// The kernel's arguments, one struct that attnkit/functional/native.py mirrors field by field
// (ctypes.Structure): sizes, flags and pointers of one call of attention_cpu.cpp.

#pragma once

#include <cstdint>

extern "C" {

// Mirrored field by field by attnkit/functional/native.py (ctypes.Structure).
struct Args {
    int64_t B, H, Hkv, N, S, D, Dv;
    int64_t bq, bk;
    int64_t causal;     // 1: query i sees keys j <= i + S - N (bottom-right aligned)
    int64_t keep_t;     // dropout: keep iff 32-bit word < keep_t; 2^32 = no dropout
    int64_t nthreads;
    uint64_t seed;
    float scale;        // multiplies q . k^T
    float inv_keep;     // 2^32 / keep_t, applied to the output (and to dO in backward)
    const float* q;
    const float* k;
    const float* v;
    const uint8_t* mask;  // may be null
    int64_t mask_st[4];
    const float* bias;    // may be null
    int64_t bias_st[4];
    float* out;
    float* lse;
    const float* dout;    // backward only: dO (B, H, N, Dv), read through dout_st
    int64_t dout_st[4];   // dO's strides (elements; 0: broadcast), its token axis q's (N * groups)
    const float* dlse;    // backward only, may be null
    float* dq;
    float* dk;            // zeroed by the caller
    float* dv;            // zeroed by the caller
    // Structured masks (attnkit/functional/_mask_plan.py), ANDed with mask, bias and causal:
    const int64_t* rows;  // may be null: lo (K, B|1, N) then hi: row i sees the keys of its
                          // K runs lo_k <= j < hi_k (sorted, disjoint, empty ones lo >= hi)
    int64_t rows_bst;     // batch stride of lo and hi (0 when one row set serves every batch)
    int64_t rows_half;    // offset of hi from lo
    int64_t rows_k;       // K, the runs of each row (1: one interval)
    int64_t rows_kst;     // stride between a row's runs
    const int32_t* table; // may be null: (B|1, H|1, nqb, nkb) on the bq x bk grid, per block
                          // -1 empty (skipped), -2 full, t >= 0 partial with tile t
    int64_t table_st[2];  // batch and head strides of the table (elements)
    const uint8_t* tiles; // (T, bq, bk): the partial blocks' booleans
    int64_t* work;        // may be null: score entries computed are added here
    // Score functions (attnkit/functional/score_mods.py, `_native_mod.py`), applied to
    // scale q k^T before bias and masks: s -> post(cap(pre(s))), where ALiBi and the relative
    // table are each added before the cap (pre) or after it (post).
    float softcap;          // 0: none; else s -> softcap * tanh(s / softcap)
    const float* alibi;     // may be null: slopes (H,); s += slope_h * (j - (i + alibi_offset)),
    int64_t alibi_offset;   // or -slope_h * |j - (i + alibi_offset)| when alibi_symmetric
    int64_t alibi_symmetric;
    int64_t alibi_post;     // 1: added after the cap
    const float* rel;       // may be null: (H, rel_len) values, s += rel[h, kpos_j - qpos_i + zero]
    const int64_t* rel_qpos;  // (N,) positions of the queries; null: qpos_i = i
    const int64_t* rel_kpos;  // (S,) positions of the keys; null: kpos_j = j
    int64_t rel_zero;
    int64_t rel_len;
    int64_t rel_post;       // 1: added after the cap
    float* rel_grad;        // backward, may be null: (H, rel_len), d rel accumulated (zeroed)
    // Interleaved sequences (a strided mask's residue classes, attnkit/functional/reordered.py):
    // the token axis of q, k, v, out, lse and their gradients holds `groups` independent
    // sequences, token i * groups + r being position i of sequence r; N and S count one
    // sequence's positions, and masks, bias and causal apply to positions. 1: one sequence.
    int64_t groups;
    // A query row map (attnkit/functional/reordered.py: a mask made block-sparse by permuting
    // the tokens): position i of every head's query sequence reads q, out, lse, dO and dlse
    // and writes out, lse and dq at token row qrows[i] of the caller's tensors, (N,) shared
    // by every batch row and head, a permutation of 0..N-1. Masks, bias, causal, score
    // functions and the dropout key still see position i: only the rows move, so the caller
    // passes q and dO in token order and gets out, lse and dq in token order, without gathers
    // (4 of (B, H, N, D) at ~13 ms each at N=16384, H=8, D=64 in a NATTEN fwd+bwd).
    // null: row i. Only with groups == 1.
    const int64_t* qrows;
};

}  // extern "C"
