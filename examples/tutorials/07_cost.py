# Made from docs/en/tutorials/07-cost.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # What attention costs
#
# Attention is famous for costing "N²". This tutorial counts exactly what it costs,
# term by term, with `attnkit.analysis`, checks every count against PyTorch's own FLOP
# counter, finds where the N² term takes over, and shows why images hit that wall first
# and how Swin's windows get around it. At the end you measure the times on your machine
# and put them beside the formulas.
#
# You will learn:
#
# - where 3NC² + 2N²C (one head) and 4NC² + 2N²C (multi-head, with W_O) come from;
# - why the number of heads does not change the count;
# - at which sequence length the N² term becomes the larger one;
# - how window attention turns 2N²C into 2M²NC, and what that saves on a 56×56 grid;
# - what a sliding window or packed documents cost: the pairs the mask allows, and the blocks
#   a kernel that skips masked work really computes.
#
# ## Counting rule
#
# A matrix product [a, c]·[c, b] does a·b·c multiply-accumulates (MACs). One MAC is a
# multiply and an add, so FLOPs = 2 × MACs. Softmax, scaling and masking are a few
# operations per score; they are kept apart (`Cost.elementwise`) because they are small
# next to the products.
#
# ## One head: 3NC² + 2N²C
#
# Take X with N tokens of width C, and one head as wide as the model (d_k = C):
#
# | step | product | MACs |
# | --- | --- | --- |
# | Q, K, V = X·W_q, X·W_k, X·W_v | three [N, C]·[C, C] | 3·N·C² |
# | scores Q·Kᵀ | [N, C]·[C, N] | N²·C |
# | weights·V | [N, N]·[N, C] | N²·C |
#
# The projections grow with N (linearly) and with C², the two products with attention
# weights grow with N². ViT-B/16 has N = 197 tokens (196 patches and a class token) of
# width C = 768:

# %%
import torch

import attnkit
from attnkit.analysis import mha_cost, single_head_cost

N, C = 197, 768
one = single_head_cost(N, C)
for name, macs in one.terms.items():
    print(f"{name:14} {macs:>13,}")
print(f"{'total':14} {one.macs:>13,}")
print(f"3NC² + 2N²C  = {3 * N * C**2 + 2 * N**2 * C:>13,}")

# %% [markdown]
# ```text
# q_proj           116,195,328
# k_proj           116,195,328
# v_proj           116,195,328
# scores (QKᵀ)      29,805,312
# weights·V         29,805,312
# total            408,196,608
# 3NC² + 2N²C  =   408,196,608
# ```
#
# ## Multi-head: 4NC² + 2N²C, whatever H is
#
# Multi-head attention cuts the width C into H heads of width d = C/H. Each head's score
# product costs N·N·d, and H of them cost N²·H·d = N²·C: the same as one wide head. The
# projections are the same three C×C matrices, just read as H slices. The only new term
# is the output projection W_O, one more [N, C]·[C, C]:

# %%
for heads in (1, 4, 12):
    print(f"H = {heads:2}: {mha_cost(N, C, heads).macs:,} MACs")
print(f"4NC² + 2N²C = {4 * N * C**2 + 2 * N**2 * C:,}")
print(f"without W_O: {mha_cost(N, C, 12, out_proj=False).macs:,} MACs (= one head)")

# %% [markdown]
# ```text
# H =  1: 524,391,936 MACs
# H =  4: 524,391,936 MACs
# H = 12: 524,391,936 MACs
# 4NC² + 2N²C = 524,391,936
# without W_O: 408,196,608 MACs (= one head)
# ```
#
# Formulas can be wrong; a counter that watches the real kernels is a good referee.
# `torch.utils.flop_counter.FlopCounterMode` counts the FLOPs of every matrix product
# that actually runs. It has no formula for PyTorch's fused attention kernel on the CPU
# (it would count it as 0), so we ask attnkit for its `reference` backend, which computes
# attention with plain matrix products and a softmax:

# %%
from torch.utils.flop_counter import FlopCounterMode

mha = attnkit.MultiHeadAttention(C, 12).eval()
x = torch.randn(1, N, C)  # (B, N, C)
with torch.no_grad(), attnkit.use_backend("reference"), FlopCounterMode(display=False) as counter:
    mha(x)
print(f"counted by torch: {counter.get_total_flops():,} FLOPs")
print(f"attnkit formula:  {mha_cost(N, C, 12).flops:,} FLOPs")
print("equal:", counter.get_total_flops() == mha_cost(N, C, 12).flops)

# %% [markdown]
# ```text
# counted by torch: 1,048,783,872 FLOPs
# attnkit formula:  1,048,783,872 FLOPs
# equal: True
# ```
#
# The command line prints the same table:
#
# ```console
# $ attnkit flops --tokens 197 --dim 768 --heads 12
# multi-head self-attention  N=197  S=197  C=768  H=12  B=1
#
# term                   MACs          FLOPs   share
# --------------------------------------------------
# q_proj          116,195,328    232,390,656   22.2%
# k_proj          116,195,328    232,390,656   22.2%
# v_proj          116,195,328    232,390,656   22.2%
# scores (QKᵀ)     29,805,312     59,610,624    5.7%
# weights·V        29,805,312     59,610,624    5.7%
# out_proj        116,195,328    232,390,656   22.2%
# --------------------------------------------------
# total (matmul)  524,391,936  1,048,783,872  100.0%
#
# closed form: 4NC² + 2N²C = 4·197·768² + 2·197²·768 = 524,391,936 MACs
# params: 2,362,368
# backward ≈ 2 × forward: 1,048,783,872 MACs
# score matrix (B·H·N·S, float32): 1.8 MiB (1,862,832 B)
# kept for backward (reference backend): 3.5 MiB (3,678,384 B)
# not matmuls, not in the totals (FLOPs): scale 465,708, softmax 2,328,540, bias 605,184
# attnkit flops: self-attention layer: 524,391,936 MACs = 1.05 GFLOPs, 2,362,368 params (nothing written; --plot draws cost against length)
# ```
#
# It also gives the parameters (4C² + 4C = 2,362,368), the size of the score matrix, and
# the small elementwise work (scale, softmax, bias adds) that the totals leave out.
#
# ## Where N² takes over
#
# The projections cost 4NC², the attention products 2N²C. They are equal when
# 4NC² = 2N²C, that is at **N = 2C**. Below it, attention is mostly matrix-by-weights
# work, like an MLP; above it, the N² products dominate, and doubling N quadruples them.

# %%
C = 768
print("    N   projections   N² products   N² share")
for n in (128, 512, 1536, 4096, 16384):
    cost = mha_cost(n, C, 12)
    proj = 4 * n * C**2
    print(f"{n:5}  {proj:12.3e}  {cost.macs - proj:12.3e}   {1 - proj / cost.macs:6.1%}")

# %% [markdown]
# ```text
#     N   projections   N² products   N² share
#   128     3.020e+08     2.517e+07     7.7%
#   512     1.208e+09     4.027e+08    25.0%
#  1536     3.624e+09     3.624e+09    50.0%
#  4096     9.664e+09     2.577e+10    72.7%
# 16384     3.865e+10     4.123e+11    91.4%
# ```
#
# At N = 1536 = 2C the two halves are equal. Compute is only half the story: the N×N
# weight matrix must also be held in memory, per head and per example, and for backward
# the reference implementation keeps it. `attnkit.analysis.score_matrix_bytes` gives its
# size:

# %%
from attnkit.analysis import score_matrix_bytes

for n in (512, 4096, 16384):
    gib = score_matrix_bytes(1, 12, n) / 2**30  # batch 1, 12 heads, float32
    print(f"N = {n:5}: one layer's weights, 12 heads: {gib:8.3f} GiB")

# %% [markdown]
# ```text
# N =   512: one layer's weights, 12 heads:    0.012 GiB
# N =  4096: one layer's weights, 12 heads:    0.750 GiB
# N = 16384: one layer's weights, 12 heads:   12.000 GiB
# ```
#
# (attnkit's `fused` and `chunked` backends never build this matrix: they keep O(N)
# memory. The MACs stay the same.)
#
# ## The N² wall on images
#
# Images make N large fast. Cutting an H×W image into p×p patches gives N = HW/p²
# tokens: a 224×224 image gives 196 tokens with 16×16 patches, but 3,136 with 4×4
# patches, the resolution detection and segmentation need. Swin-T's first stage has
# exactly that: a 56×56 grid of tokens of width C = 96.
#
# Swin's answer is to let each token attend only inside its M×M window (M = 7). A window
# holds M² tokens, so each token's score product costs M²·C instead of N·C, and the total
# becomes **4hwC² + 2M²hwC** (Liu et al. 2021, eq. 2) for an h×w grid, N = hw: linear in
# the number of tokens.

# %%
from attnkit.analysis import swin_window_cost

h = w = 56
C, heads, M = 96, 3, 7
n = h * w
full = mha_cost(n, C, heads)
windows = swin_window_cost(h, w, C, heads, M)
print(f"global attention, N = {n}: {full.macs:,} MACs")
print(f"7×7 windows:               {windows.macs:,} MACs")
print(f"4hwC² + 2M²hwC =           {4 * n * C**2 + 2 * M**2 * n * C:,}")
print(f"{full.macs / windows.macs:.1f}× fewer MACs; the score products alone {n // M**2}× fewer")

# %% [markdown]
# ```text
# global attention, N = 3136: 2,003,828,736 MACs
# 7×7 windows:               145,108,992 MACs
# 4hwC² + 2M²hwC =           145,108,992
# 13.8× fewer MACs; the score products alone 64× fewer
# ```
#
# The projections (4hwC²) are the same in both; only the N² part shrinks, by N/M² = 64.
# The price: a token sees only its own window. Swin shifts the windows by half a window
# in every other block, so information crosses window borders one block later.
#
# ## The picture: formulas and measured time
#
# Now measure. The loop below times one forward pass of global attention on g×g grids
# and of window attention on the same tokens cut into 7×7 windows (windows are just a
# batch of short sequences), and draws both beside the formula counts. Times depend on
# your machine, so the printed ones are shown as `...`.

# %%
import time

import matplotlib.pyplot as plt


def best_time(fn, repeats=5):
    """Best of a few calls, in seconds (noise on a shared machine only ever adds time)."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


torch.manual_seed(0)
layer = attnkit.MultiHeadAttention(C, heads).eval()
grids = [7, 14, 21, 28, 35, 42, 49, 56]
rows = []
threads = torch.get_num_threads()
torch.set_num_threads(1)  # one thread: a busy machine stalls a thread pool at every call
with torch.inference_mode():
    for g in grids:
        n = g * g
        x = torch.randn(1, n, C)  # (1, N, C): one image, every token attends to every token
        xw = torch.randn(n // M**2, M * M, C)  # (windows, M², C): each window is a sequence
        rows.append((
            n,
            mha_cost(n, C, heads).flops / 1e9,
            swin_window_cost(g, g, C, heads, M).flops / 1e9,
            best_time(lambda x=x: layer(x)) * 1e3,
            best_time(lambda xw=xw: layer(xw)) * 1e3,
        ))  # fmt: skip
torch.set_num_threads(threads)
for n, gf, wf, gt, wt in rows:
    print(
        f"N = {n:4}: global {gf:6.3f} GFLOPs, {gt:7.2f} ms | windows {wf:6.3f} GFLOPs, {wt:6.2f} ms"
    )

n_axis = [r[0] for r in rows]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
ax1.plot(n_axis, [r[1] for r in rows], "o-", label="global: 4NC² + 2N²C")
ax1.plot(n_axis, [r[2] for r in rows], "s-", label="7×7 windows: 4NC² + 2M²NC")
ax1.set(xlabel="tokens N", ylabel="GFLOPs (formula)", title=f"cost, C = {C}")
ax2.plot(n_axis, [r[3] for r in rows], "o-", label="global")
ax2.plot(n_axis, [r[4] for r in rows], "s-", label="7×7 windows")
ax2.set(xlabel="tokens N", ylabel="ms per forward (measured)", title="time on this machine")
for ax in (ax1, ax2):
    ax.legend()
    ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig("cost.png", dpi=100)

# %% [markdown]
# ```text
# N =   49: global  0.005 GFLOPs, ... ms | windows  0.005 GFLOPs, ... ms
# N =  196: global  0.029 GFLOPs, ... ms | windows  0.018 GFLOPs, ... ms
# N =  441: global  0.107 GFLOPs, ... ms | windows  0.041 GFLOPs, ... ms
# N =  784: global  0.294 GFLOPs, ... ms | windows  0.073 GFLOPs, ... ms
# N = 1225: global  0.667 GFLOPs, ... ms | windows  0.113 GFLOPs, ... ms
# N = 1764: global  1.325 GFLOPs, ... ms | windows  0.163 GFLOPs, ... ms
# N = 2401: global  2.391 GFLOPs, ... ms | windows  0.222 GFLOPs, ... ms
# N = 3136: global  4.008 GFLOPs, ... ms | windows  0.290 GFLOPs, ... ms
# ```
#
# ![Left: formula cost of global and window attention against N. Right: measured forward time](../../assets/tutorials/07-cost/cost.png)
#
# The left panel is exact; the right one is a measurement and wobbles from run to run.
# Both have the same shape: global attention bends upward (the N² term), window attention
# stays a straight line. On the machine that drew this picture, global attention at
# N = 3136 took about 12× as long as the windows, close to the formula's 13.8×. Tiny sizes
# are dominated by fixed overheads (every call costs some microseconds whatever its size),
# so compare the shapes of the curves, not single points. For careful timings use a quiet
# machine: `attnkit flops --plot` measures the same thing on one thread and also reports
# the achieved GFLOP/s.
#
# ## Masks that skip: sliding windows and packed documents
#
# Language models rarely attend to everything. A sliding window (Mistral, Longformer, Gemma's
# local layers) lets query i see only the last w keys; packed training puts several documents
# in one sequence, each seeing only itself. Such masks describe themselves (`attnkit.masks`),
# and attnkit's compiled CPU kernel (the `chunked` backend) skips the blocks they hide. There
# are now three counts of score entries, the (query, key) pairs of Q·Kᵀ:
#
# - **dense**: all N·S of them per head, what a kernel that ignores the mask computes;
#   `mha_cost(...).macs` counts these: 4NC² + 2N²C;
# - **allowed**: the pairs the mask keeps (its density); with A of them per head, a kernel
#   that skips every masked product needs 4NC² + 2·A·C (`unmasked_macs`);
# - **computed**: what the kernel really computes, in whole blocks (`computed_macs`).
#
# A causal window of w keys keeps w keys per query, fewer in the first w rows:
# A = N·w - w(w - 1)/2, so the layer costs **4NC² + 2·A·C ≈ 4NC² + 2wNC**. That is Swin's
# 4hwC² + 2M²hwC in one dimension: there each query sees the M² keys of its window, here the w
# keys before it.

# %%
from attnkit import masks

N, C, H, w = 4096, 512, 8, 256
mask = masks.window(N, w, causal=True)  # query i sees keys i - w < j <= i
print(mask.describe(), f"density {mask.density:.4f}")
cost = mha_cost(N, C, H, mask=mask)
A = N * w - w * (w - 1) // 2  # pairs one head may attend
print(f"dense    4NC² + 2N²C  = {4 * N * C**2 + 2 * N**2 * C:>14,}  mha_cost: {cost.macs:,}")
print(f"allowed  4NC² + 2·A·C = {4 * N * C**2 + 2 * A * C:>14,}  mha_cost: {cost.unmasked_macs:,}")
print(f"about    4NC² + 2wNC  = {4 * N * C**2 + 2 * w * N * C:>14,}")
print(f"computed (blocks)     = {cost.computed_macs:>14,}")

# %% [markdown]
# ```text
# window(256, causal) density 0.0606
# dense    4NC² + 2N²C  = 21,474,836,480  mha_cost: 21,474,836,480
# allowed  4NC² + 2·A·C =  5,335,285,760  mha_cost: 5,335,285,760
# about    4NC² + 2wNC  =  5,368,709,120
# computed (blocks)     =  5,851,316,224
# ```
#
# Why does the kernel compute more than the mask allows? It works on blocks of 128 query rows
# at a time, and a block computes every key that any of its rows may see: from the first row's
# first key to the last row's last key. Under a sliding window that span is w + 127 keys wide,
# while each row needs only w of them: a triangle of 127·128/2 masked entries at each end of
# the span is computed and thrown away (the partial blocks). `kernel_work` walks the blocks
# exactly as the kernel does, with the kernel's own block sizes:

# %%
from attnkit.analysis import kernel_work

for pass_ in ("forward", "backward"):
    work = kernel_work(mask, pass_=pass_, heads=H)
    print(
        f"{pass_:8} computed {work.computed:,} entries in {work.blocks} blocks of "
        f"{work.block_q}×{work.block_k}; allowed {work.allowed:,} of {work.dense:,}"
    )
K = 128 * (128 + 256 + 30 * 383)  # one head: 32 query blocks span 128, 256, then 30 × (w + 127)
print(f"K = {K:,} per head; 4NC² + 2·K·C = {4 * N * C**2 + 2 * K * C:,}")

# %% [markdown]
# ```text
# forward  computed 12,158,976 entries in 256 blocks of 128×512; allowed 8,127,488 of 134,217,728
# backward computed 12,158,976 entries in 496 blocks of 128×256; allowed 8,127,488 of 134,217,728
# K = 1,519,872 per head; 4NC² + 2·K·C = 5,851,316,224
# ```
#
# The forward pass steps through a span 512 keys at a time, the backward pass 256 at a time:
# the same entries in more, smaller blocks. The extra is at most 127 keys per row whatever w
# is, so it matters less as the window grows:

# %%
print("    w   allowed/row   computed/row   computed/allowed")
for width in (64, 256, 1024, 4096):
    work = kernel_work(masks.window(N, width, causal=True))
    ratio = work.computed / work.allowed
    print(f"{width:5}  {work.allowed / N:12.1f}  {work.computed / N:13.1f}  {ratio:17.2f}")

# %% [markdown]
# ```text
#     w   allowed/row   computed/row   computed/allowed
#    64          63.5          189.0               2.98
#   256         248.0          371.1               1.50
#  1024         896.1         1007.2               1.12
#  4096        2048.5         2112.0               1.03
# ```
#
# (w = 4096 is the whole causal triangle: the kernel computes the diagonal blocks' upper
# halves too.) Packed documents work the same way. A causal document of L tokens allows
# L(L + 1)/2 pairs; a block of rows inside one document computes from the document's first key
# to its own last row; a block that straddles two documents spans both, so lengths that are not
# multiples of 128 cost a little more:

# %%
for lengths in ([512, 512, 1024], [500, 600, 948]):
    docs = masks.document(masks.document_ids(lengths), causal=True)  # N = sum(lengths)
    work = kernel_work(docs)
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    print(
        f"{lengths}: allowed {work.allowed:,} (ΣL(L+1)/2 = {pairs:,}), "
        f"computed {work.computed:,} of {work.dense:,}"
    )

# %% [markdown]
# ```text
# [512, 512, 1024]: allowed 787,456 (ΣL(L+1)/2 = 787,456), computed 917,504 of 4,194,304
# [500, 600, 948]: allowed 755,376 (ΣL(L+1)/2 = 755,376), computed 922,624 of 4,194,304
# ```
#
# As with the FLOP counter earlier, a referee that watches the real kernel keeps the model
# honest: `attnkit.functional.native.count_work()` counts the entries the compiled kernel
# computes, and the tests hold `kernel_work` equal to it for every mask kind, forward and
# backward. The check, where the kernel is built (it needs a C++ compiler):

# %%
from attnkit.functional import native

if native.available():
    q = torch.randn(1, H, N, 64)  # (B, H, N, D)
    with native.count_work() as counted:
        attnkit.attention(q, q, q, mask=mask, backend="chunked")
    assert counted.item() == kernel_work(mask, heads=H).computed

# %% [markdown]
# The command line gives the same counts: `attnkit flops --tokens 4096 --dim 512 --heads 8
# --mask window:256 --causal`, or `--mask document:512,512,1024` (see
# [`attnkit flops`](../cli/flops.md)).
#
# ## Try next
#
# - `attnkit.analysis.attention_memory(1, 12, 4096, backend="reference")` and
#   `backend="chunked"`: what each backend keeps for backward.
# - `mha_cost(n, C, heads, causal=True).unmasked_macs`: a causal kernel that skips the
#   masked upper triangle needs about half the score products.
# - `attnkit.analysis.vit_cost`, `bert_cost` and `transformer_cost` count whole models
#   (`attnkit flops --model vit`).
# - Tutorial [06 — the Transformer](06-transformer.md) trains a model whose attention you
#   can now count; [08 — seeing attention](08-seeing-attention.md) looks at what it computes.
# - API reference: [`attnkit.analysis`](../api/analysis.md); the [`attnkit flops`](../cli/flops.md)
#   command.
