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
BACKWARD_BLOCK_Q, BACKWARD_BLOCK_K = 128, 256

# The grid on which a structured mask's partial blocks are stored as tiles (both kernels walk
# it, forward and backward, when there are tiles): the compiled kernel's backward blocks.
STRUCTURED_BLOCK_Q, STRUCTURED_BLOCK_K = 128, 256
