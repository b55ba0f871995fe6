"""Block sizes of attnkit's attention kernels, in a module of its own: the cost model
(`attnkit.analysis.kernel_work`) reads them without loading the kernels (and torch.compile's
machinery, which registering the compiled kernel's operators pulls in).

Legend: bq x bk = query rows x keys of one score block.
"""

# The compiled CPU kernel (`attnkit.functional.native`). Tuned at N=2048, H=8, D=64, dropout
# 0.1 (1 thread) over 32-256 query x 128-1024 key blocks, all within ~10%: forward 128x512 (a
# 256 KiB score block), backward 128x256 (score and dP blocks of 128 KiB each, side by side in
# L2). Forward 92 ms and backward 185 ms at these.
FORWARD_BLOCK_Q, FORWARD_BLOCK_K = 128, 512
# Full (not causal, unstructured) forwards from N = 768 on take 256 query rows a block, as
# SDPA's CPU kernel does there: MKL packs each key and value block once per query block, and
# twice the rows halve that. Measured (2026-11-27, AMD EPYC Zen 4, 1 thread, interleaved with
# SDPA, CPU time): D=128 N=2048 1.04-1.07x -> 1.00-1.02x SDPA's time with the kernel built for
# AVX-512 and for AVX2, N=4096 1.06x -> 0.99x; causal calls keep 128 (0.84x vs 0.91x: a wider
# block computes more of the diagonal it then masks).
WIDE_FORWARD_BLOCK_Q, WIDE_FROM_N = 256, 768


def forward_blocks(n: int, causal: bool, structured: bool) -> tuple[int, int]:
    """The compiled kernel's forward blocks (bq, bk) for N = n queries (without tiles: a mask
    with tiles puts both passes on their grid)."""
    if causal or structured or n < WIDE_FROM_N:
        return FORWARD_BLOCK_Q, FORWARD_BLOCK_K
    return WIDE_FORWARD_BLOCK_Q, FORWARD_BLOCK_K


BACKWARD_BLOCK_Q, BACKWARD_BLOCK_K = 128, 256
# The backward's paths for rows of one run of keys (_native/row_path.h's kRowPathKeysBackward,
# _native/offset_backward.h's kBandKeys): query blocks whose rows see at most
# BACKWARD_ROW_KEYS keys each go a row at a time, at most BACKWARD_BAND_KEYS (plain scores:
# no score functions, dense mask, bias or dropout) on the offset path, whose query blocks stay
# BACKWARD_BLOCK_Q rows (`_grid.backward_query_block`): its key tiles compute each block's
# first and last keys' sums in part, (bq + w - 1) / bq of their share, and its per-block set-up
# is paid once for more rows.
BACKWARD_ROW_KEYS, BACKWARD_BAND_KEYS = 32, 64

# The grid on which a structured mask's partial blocks are stored as tiles (both kernels walk
# it, forward and backward, when there are tiles): the compiled kernel's backward blocks.
STRUCTURED_BLOCK_Q, STRUCTURED_BLOCK_K = 128, 256
