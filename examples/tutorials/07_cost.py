# Made from docs/en/tutorials/07-cost.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # What attention costs
#
# Attention is famous for costing "N²". This tutorial counts exactly what it costs,
# term by term, with `attnkit.analysis`, checks every count against PyTorch's own FLOP
# counter, finds where the N² term takes over, and shows why images hit that wall first
# and how Swin's windows get around it. It sets self-attention beside the layers it replaced,
# recurrent and convolutional ones, with FLOPs counted by PyTorch. At the end you measure the
# times on your machine and put them beside the formulas.
#
# You will learn:
#
# - where $3NC^2 + 2N^2C$ (one head) and $4NC^2 + 2N^2C$ (multi-head, with $W^O$) come from;
# - why the number of heads does not change the count;
# - at which sequence length the $N^2$ term becomes the larger one;
# - what self-attention costs next to a recurrent and a convolutional layer, and why the
#   Transformer paper took it anyway (its Table 1, counted);
# - how window attention turns $2N^2C$ into $2M^2NC$, and what that saves on a 56×56 grid;
# - what a sliding window or packed documents cost: the pairs the mask allows, and the blocks
#   a kernel that skips masked work really computes.
#
# ## Counting rule
#
# A matrix product $[a, c] \cdot [c, b]$ does $a \cdot b \cdot c$ multiply-accumulates (MACs).
# One MAC is a multiply and an add, so FLOPs = 2 × MACs. Softmax, scaling and masking are a few
# operations per score; they are kept apart (`Cost.elementwise`) because they are small
# next to the products.
#
# ## One head: 3NC² + 2N²C
#
# Take $X$ with $N$ tokens of width $C$, and one head as wide as the model ($d_k = C$):
#
# | step | product | MACs |
# | --- | --- | --- |
# | $Q, K, V = XW_q, XW_k, XW_v$ | three $[N, C] \cdot [C, C]$ | $3NC^2$ |
# | scores $QK^\top$ | $[N, C] \cdot [C, N]$ | $N^2C$ |
# | weights $\cdot V$ | $[N, N] \cdot [N, C]$ | $N^2C$ |
#
# The projections grow with $N$ (linearly) and with $C^2$, the two products with attention
# weights grow with $N^2$. ViT-B/16 has $N = 197$ tokens (196 patches and a class token) of
# width $C = 768$:

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
# Multi-head attention cuts the width $C$ into $H$ heads of width $d = C/H$. Each head's score
# product costs $N \cdot N \cdot d$, and $H$ of them cost $N^2 H d = N^2 C$: the same as one wide
# head. The projections are the same three $C \times C$ matrices, just read as $H$ slices. The
# only new term is the output projection $W^O$, one more $[N, C] \cdot [C, C]$:

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
# It also gives the parameters ($4C^2 + 4C$ = 2,362,368), the size of the score matrix, and
# the small elementwise work (scale, softmax, bias adds) that the totals leave out.
#
# ## Where N² takes over
#
# The projections cost $4NC^2$, the attention products $2N^2C$. They are equal when
#
# $$
# 4NC^2 = 2N^2C \quad\Longleftrightarrow\quad N = 2C.
# $$
#
# Below $N = 2C$, attention is mostly matrix-by-weights work, like an MLP; above it, the $N^2$
# products dominate, and doubling $N$ quadruples them.

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
# At $N = 1536 = 2C$ the two halves are equal. On log–log axes each term is a straight line,
# $4NC^2$ of slope 1 and $2N^2C$ of slope 2, so they cross once; window attention (further
# down) keeps the $N^2$ line from ever taking over. The page draws the curves from
# `mha_cost` and `swin_window_cost` for square grids of $g \times g$ tokens:

# %%
import matplotlib.pyplot as plt

from attnkit.analysis import swin_window_cost
from attnkit.viz import use_cjk_font

use_cjk_font()  # labels in any language: a CJK font as matplotlib's fallback
C, heads, M = 768, 12, 7
n_axis, proj, quad, windows = [], [], [], []
for g in range(7, 281, 7):  # g×g grids, N = g² = 49 ... 78,400 tokens
    n = g * g
    cost = mha_cost(n, C, heads)
    n_axis.append(n)
    proj.append(sum(macs for name, macs in cost.terms.items() if name.endswith("proj")))
    quad.append(cost.macs - proj[-1])  # the two N² products
    windows.append(swin_window_cost(g, g, C, heads, M).macs)
cross = next(n for n, p, q in zip(n_axis, proj, quad, strict=True) if q >= p)
print(f"4NC² = 2N²C at N = 2C = {2 * C}; first grid past it: N = {cross}")
print(f"at N = {n_axis[-1]:,}: global / windows = {cost.macs / windows[-1]:.0f}×")

total = [p + q for p, q in zip(proj, quad, strict=True)]
window_products = [w - p for w, p in zip(windows, proj, strict=True)]

fig, ax = plt.subplots(figsize=(9, 5))
ax.plot(n_axis, total, lw=3, label="global: 4NC² + 2N²C")
ax.plot(n_axis, windows, lw=3, label=f"{M}×{M} windows: 4NC² + 2M²NC")
ax.plot(n_axis, proj, "--", label="projections alone: 4NC²")
ax.plot(n_axis, quad, ":", lw=2, label="global N² products alone: 2N²C")
ax.plot(n_axis, window_products, "-.", label="window products alone: 2M²NC")
ax.axvline(2 * C, color="gray", lw=1)
ax.text(2 * C * 1.1, 2e7, f"N = 2C = {2 * C}:\nthe N² term takes over", fontsize=10)
ax.set(xscale="log", yscale="log", xlabel="tokens N", ylabel="MACs of one layer (forward)")
ax.set_title(f"One attention layer, C = {C}, H = {heads}: cost against length")
ax.grid(True, which="both", alpha=0.3)
ax.legend(loc="upper left")
fig.tight_layout()
fig.savefig("cost_curves.png", dpi=110)

# %% [markdown]
# ```text
# 4NC² = 2N²C at N = 2C = 1536; first grid past it: N = 1764
# at N = 78,400: global / windows = 50×
# ```
#
# ![MACs against N on log axes: global attention bends up past N = 2C, window attention stays a line](../../assets/tutorials/07-cost/cost_curves.png)
#
# Compute is only half the story: the $N \times N$
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
# (attnkit's `fused` and `chunked` backends never build this matrix: they keep $O(N)$
# memory. The MACs stay the same.)
#
# ## Why self-attention anyway: the paper's Table 1
#
# Before the Transformer, sequence models were recurrent (an RNN or LSTM reads token after
# token) or convolutional (each layer mixes a few neighbours). "Attention Is All You Need"
# (§4, Table 1) compares the three by what one layer costs, how many of its steps must run one
# after the other, and how many layers or steps separate the first token from the last (the
# path a signal, and a gradient, must travel). For sequence length $n$, width $d$, kernel
# size $k$ and a neighbourhood of $r$ tokens:
#
# | layer | per-layer complexity | sequential operations | maximum path length |
# | --- | --- | --- | --- |
# | self-attention | $O(n^2 \cdot d)$ | $O(1)$ | $O(1)$ |
# | recurrent | $O(n \cdot d^2)$ | $O(n)$ | $O(n)$ |
# | convolutional | $O(k \cdot n \cdot d^2)$ | $O(1)$ | $O(n/k)$, $O(\log_k n)$ dilated |
# | restricted self-attention | $O(r \cdot n \cdot d)$ | $O(1)$ | $O(n/r)$ |
#
# The code below builds one layer of each, counts its FLOPs with PyTorch's counter (on the
# `meta` device: shapes only, nothing is computed, so $n = 2048$ costs nothing) and finds the
# path length by following, layer after layer, which positions each position has heard from.
# Self-attention here is the attention alone, $\text{softmax}(XX^\top/\sqrt{d})\,X$ with one
# head and no projections, as in the table (the four projections add $8nd^2$ FLOPs to every
# attention layer, as much as a $k = 4$ convolution).

# %%
from torch import nn

d, k, r = 512, 3, 64  # width, kernel size, neighbourhood
conv = nn.Conv1d(d, d, k, padding=k // 2, bias=False, device="meta")
rnn = nn.RNN(d, d, bias=False, batch_first=True, device="meta")


def self_attention(x):  # (1, n, d) -> (1, 1, n, d): softmax(x·xᵀ/√d)·x, one head
    return attnkit.attention(x[:, None], x[:, None], x[:, None], backend="reference").out


def restricted(x):  # each query attends to the r tokens around it
    keys = nn.functional.pad(x[0].T, (r // 2, r - 1 - r // 2)).unfold(1, r, 1)  # (d, n, r)
    keys = keys.permute(1, 2, 0)  # (n, r, d): the r neighbours of each query
    weights = torch.softmax(torch.einsum("nd,nrd->nr", x[0], keys) / d**0.5, -1)  # (n, r)
    return torch.einsum("nr,nrd->nd", weights, keys)


def flops_of(layer, n):
    with FlopCounterMode(display=False) as counter:
        layer(torch.randn(1, n, d, device="meta"))  # (B, n, d); meta: shapes only
    return counter.get_total_flops()


def path_length(reads):
    """Layers until the last position has heard from the first; reads: (n, n) bool, row i
    marks what position i reads in one layer (or one step of a recurrence)."""
    one, heard, hops = reads.float(), reads.float(), 1
    while heard[-1, 0] == 0:
        heard, hops = (heard @ one).clamp(max=1), hops + 1
    return hops


n = 128
i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]  # query and key positions
layers = [  # name, layer, FLOPs formula, sequential steps, what position i reads
    ("self-attention", self_attention, "4n²d", "1", torch.ones(n, n, dtype=torch.bool)),
    ("recurrent (RNN)", rnn, "4nd²", "n", (j == i) | (j == i - 1)),  # h_i from x_i, h_(i-1)
    (f"convolution, k = {k}", lambda x: conv(x.transpose(1, 2)), "2knd²", "1", (i - j).abs() <= k // 2),
    (f"restricted, r = {r}", restricted, "4rnd", "1", (i - j).abs() <= r // 2),
]  # fmt: skip
header = ("d = 512", "FLOPs, n = 128", "n = 2048", "formula", "sequential", "path")
print("{:21}{:>16}{:>15}{:>9}{:>12}{:>6}".format(*header))
for name, layer, formula, steps, reads in layers:
    small, large = flops_of(layer, 128), flops_of(layer, 2048)
    print(f"{name:21}{small:16,}{large:15,}{formula:>9}{steps:>12}{path_length(reads):6}")

# %% [markdown]
# ```text
# d = 512                FLOPs, n = 128       n = 2048  formula  sequential  path
# self-attention             33,554,432  8,589,934,592     4n²d           1     1
# recurrent (RNN)           134,217,728  2,147,483,648     4nd²           n   127
# convolution, k = 3        201,326,592  3,221,225,472    2knd²           1   127
# restricted, r = 64         16,777,216    268,435,456     4rnd           1     4
# ```
#
# Every count is its formula (a product costs two FLOPs per multiply-add): the RNN's two
# $d \times d$ matrices per step give $4nd^2$, the convolution's $k$ of them $2knd^2$,
# attention's two $n \times n$ products $4n^2d$. Read the table as the paper did:
#
# - An RNN must run its $n$ steps one after the other (no parallelism across the sequence),
#   and the first token reaches the last through $n - 1$ of them: long paths are where
#   gradients vanish and long-range dependencies get lost.
# - A convolution is parallel, but with $k = 3$ each layer widens the view by one token on each
#   side: 127 layers before the last token hears the first (dilated convolutions, as in
#   ByteNet and WaveNet, bring that down to $\log_k n$).
# - Self-attention connects every pair in one layer, in one parallel step. Its $n^2 d$ is
#   *cheaper* than the RNN's $n d^2$ while $n < d$, which held for the sentences of machine
#   translation (a few dozen word pieces, $d = 512$): at $n = 128$ it costs a quarter of the RNN.
#   At $n = 2048$ it costs four times as much, and it is the $N^2$ wall of the previous section.
# - Restricted self-attention, attending only to $r$ neighbours, is linear in $n$ again and
#   pays in path length: a window of $r$ reaches $r/2$ positions to each side, so crossing
#   the sequence takes $\lceil (n-1)/(r/2) \rceil$ layers, here 4 (the $O(n/r)$ of the table; the sliding windows of Longformer and Mistral,
#   and Swin's windows below, are this row).
#
# ## The N² wall on images
#
# Images make $N$ large fast. Cutting an $H \times W$ image into $p \times p$ patches gives
# $N = HW/p^2$ tokens: a 224×224 image gives 196 tokens with 16×16 patches, but 3,136 with 4×4
# patches, the resolution detection and segmentation need. Swin-T's first stage has
# exactly that: a 56×56 grid of tokens of width $C = 96$.
#
# Swin's answer is to let each token attend only inside its $M \times M$ window ($M = 7$). A
# window holds $M^2$ tokens, so each token's score product costs $M^2 C$ instead of $NC$, and
# for an $h \times w$ grid ($N = hw$) the total becomes (Liu et al. 2021, eq. 2)
#
# $$
# \Omega(\text{window}) = 4hwC^2 + 2M^2hwC \quad\text{instead of}\quad
# \Omega(\text{global}) = 4hwC^2 + 2(hw)^2C,
# $$
#
# linear in the number of tokens.

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
# The projections ($4hwC^2$) are the same in both; only the $N^2$ part shrinks, by $N/M^2 = 64$.
# The price: a token sees only its own window. Swin shifts the windows by half a window
# in every other block, so information crosses window borders one block later.
#
# ### The relative bias: a table, not a tensor of scores
#
# Swin also adds a learned relative-position bias to every score: a table of $(2M-1)^2$ rows
# (one per 2-D offset between two tokens of a window) and $H$ columns, read at each
# (query, key) offset. Swin's code gathers it into an $(H, M^2, M^2)$ tensor and adds that;
# attnkit's `WindowAttention` hands the table to the kernel as a score function
# (`attnkit.score_mods.relative_bias` with `window_offsets(M)`), which reads it where the
# scores are, block by block. The FLOPs are the same, one add per score, and small beside the
# $2M^2hwC$ MACs of the formula; what changes is the memory: the size of the table, not $M^4$
# numbers per head. ALiBi and T5's buckets, on long sequences, show the difference better: a
# dense bias $(1, H, N, S)$ grows as $N^2$, while a score function holds $H$ slopes, or the
# table read along the $N + S - 1$ distances of the call. `dense=True` gives the classic
# count, the bias built once and added to every score.

# %%
from attnkit.analysis import alibi_cost, relative_bias_cost

dense = swin_window_cost(h, w, C, heads, M, dense=True)
print(f"relative bias: {windows.elementwise['position bias']:,} FLOPs, one add per score")
print(f"score function holds {windows.memory_elements:,} numbers: {windows.memory}")
print(f"dense (H, M², M²):   {dense.memory_elements:,} numbers: {dense.memory}")

n_dec, h_dec = 4096, 32  # a long decoder: N = S = 4096, 32 heads
for name, cost in [
    ("ALiBi, score function", alibi_cost(n_dec, h_dec)),
    ("ALiBi, dense bias", alibi_cost(n_dec, h_dec, dense=True)),
    ("T5, score function", relative_bias_cost(n_dec, h_dec)),
    ("T5, dense bias", relative_bias_cost(n_dec, h_dec, dense=True)),
]:
    print(f"{name:22} {cost.elementwise_flops:>13,} FLOPs {cost.memory_elements:>12,} numbers")

# %% [markdown]
# ```text
# relative bias: 460,992 FLOPs, one add per score
# score function holds 774 numbers: {'relative values': 507, 'relative index': 267}
# dense (H, M², M²):   9,604 numbers: {'relative bias': 7203, 'relative index': 2401}
# ALiBi, score function  1,073,741,824 FLOPs           32 numbers
# ALiBi, dense bias      1,090,519,040 FLOPs  536,870,912 numbers
# T5, score function       536,903,676 FLOPs      270,303 numbers
# T5, dense bias           603,979,776 FLOPs  553,648,128 numbers
# ```
#
# The dense ALiBi bias of this decoder is 2 GiB in float32 (536,870,912 numbers × 4 bytes),
# for every call; its score function holds 32 slopes and pays for it with one more multiply
# per score (2 FLOPs instead of 1; building the dense table costs about as much once). T5's
# score function buckets only the 8,191 distances, not the 16.8 million (query, key) pairs.
# The classic formulas of this page count matmuls and do not move: $4NC^2 + 2N^2C$, and
# $4hwC^2 + 2M^2hwC$ for the windows.
#
# ## The picture: formulas and measured time
#
# Now measure. The loop below times one forward pass of global attention on $g \times g$ grids
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
# Both have the same shape: global attention bends upward (the $N^2$ term), window attention
# stays a straight line. On the machine that drew this picture, global attention at
# $N = 3136$ took about 12× as long as the windows, close to the formula's 13.8×. Tiny sizes
# are dominated by fixed overheads (every call costs some microseconds whatever its size),
# so compare the shapes of the curves, not single points. For careful timings use a quiet
# machine: `attnkit flops --plot` measures the same thing on one thread and also reports
# the achieved GFLOP/s.
#
# ## Masks that skip: sliding windows and packed documents
#
# Language models rarely attend to everything. A sliding window (Mistral, Longformer, Gemma's
# local layers) lets query $i$ see only the last $w$ keys; packed training puts several documents
# in one sequence, each seeing only itself. Such masks describe themselves (`attnkit.masks`),
# and attnkit's compiled CPU kernel (the `chunked` backend) skips the blocks they hide. There
# are now three counts of score entries, the (query, key) pairs of $QK^\top$:
#
# - **dense**: all $N \cdot S$ of them per head, what a kernel that ignores the mask computes;
#   `mha_cost(...).macs` counts these: $4NC^2 + 2N^2C$;
# - **allowed**: the pairs the mask keeps (its density); with $A$ of them per head, a kernel
#   that skips every masked product needs $4NC^2 + 2AC$ (`unmasked_macs`);
# - **computed**: what the kernel really computes, in whole blocks (`computed_macs`).
#
# A causal window of $w$ keys keeps $w$ keys per query, fewer in the first $w$ rows:
#
# $$
# A = Nw - \frac{w(w - 1)}{2}, \qquad \text{cost} = 4NC^2 + 2AC \approx 4NC^2 + 2wNC.
# $$
#
# That is Swin's $4hwC^2 + 2M^2hwC$ in one dimension: there each query sees the $M^2$ keys of
# its window, here the $w$ keys before it.

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
# computed (blocks)     =  5,460,852,736
# ```
#
# Why does the kernel compute more than the mask allows? It works on blocks of $b$ query rows
# at a time, and a block computes every key that any of its rows may see: from the first row's
# first key to the last row's last key. Under a sliding window that span is $w + b - 1$ keys
# wide, while each row needs only $w$ of them: a triangle of $(b - 1) b/2$ masked entries at each
# end of the span is computed and thrown away (the partial blocks). Smaller blocks waste less,
# but each block is a call with a fixed cost, so the kernel sizes its query blocks to the mask
# (16, 32, 64 or 128 rows, whichever its cost estimate finds cheapest): for this window, 32 rows,
# so the first 8 blocks span 32, 64, …, 256 keys and the other 120 span $w + 31$. (Both passes
# take the first block, whose rows see at most 32 keys, as four tiles of 8 rows spanning 8, 16,
# 24 and 32 keys: 640 entries instead of 1,024.) `kernel_work`
# walks the blocks exactly as the kernel does, with the kernel's own block sizes:

# %%
from attnkit.analysis import kernel_work

for pass_ in ("forward", "backward"):
    work = kernel_work(mask, pass_=pass_, heads=H)
    print(
        f"{pass_:8} computed {work.computed:,} entries in {work.blocks} blocks of "
        f"{work.block_q}×{work.block_k}; allowed {work.allowed:,} of {work.dense:,}"
    )
K = 8 * (8 + 16 + 24 + 32) + 32 * (64 + 96 + 128 + 160 + 192 + 224 + 256)  # one head, forward
K += 120 * 32 * (w + 31)
print(f"K = {K:,} per head; 4NC² + 2·K·C = {4 * N * C**2 + 2 * K * C:,}")

# %% [markdown]
# ```text
# forward  computed 9,108,480 entries in 1016 blocks of 32×512; allowed 8,127,488 of 134,217,728
# backward computed 9,108,480 entries in 1976 blocks of 32×256; allowed 8,127,488 of 134,217,728
# K = 1,138,560 per head; 4NC² + 2·K·C = 5,460,852,736
# ```
#
# The forward pass steps through a span 512 keys at a time, the backward pass 256 at a time:
# the same entries in more, smaller blocks. The extra is at most $b - 1$ keys per row whatever
# $w$ is, so it matters less as the window grows:

# %%
print("    w   allowed/row   computed/row   computed/allowed")
for width in (64, 256, 1024, 4096):
    work = kernel_work(masks.window(N, width, causal=True))
    ratio = work.computed / work.allowed
    print(f"{width:5}  {work.allowed / N:12.1f}  {work.computed / N:13.1f}  {ratio:17.2f}")

# %% [markdown]
# ```text
#     w   allowed/row   computed/row   computed/allowed
#    64          63.5           63.7               1.00
#   256         248.0          278.0               1.12
#  1024         896.1          951.2               1.06
#  4096        2048.5         2112.0               1.03
# ```
#
# ($w = 64$: no row sees more than 64 keys, so the kernel computes such blocks a row at a time
# over each row's own keys, and nearly nothing extra (the backward does the same up to 32 keys a
# row, and on AVX-512 builds for bands of up to 64 keys, 8 queries at a time with the keys
# addressed by their offset from each query, as it does for rows of several runs (a 2-D
# neighbourhood in token order); `ATTNKIT_OFFSET_BACKWARD=0` turns that off, and `kernel_work(..., plain=False)` counts a call
# with a bias, dropout or a score function, whose backward keeps the blocks there); $w = 4096$ is
# the whole causal triangle:
# the kernel computes the diagonal blocks' upper halves too.) Packed documents work the same way. A causal document of $L$ tokens allows
# $L(L + 1)/2$ pairs; a block of rows inside one document computes from the document's first key
# to its own last row; a block that straddles two documents spans both, so lengths that are not
# multiples of the block cost a little more than they would otherwise (the kernel sizes its query
# blocks to each mask, so the two packings below get different blocks):

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
# [512, 512, 1024]: allowed 787,456 (ΣL(L+1)/2 = 787,456), computed 851,968 of 4,194,304
# [500, 600, 948]: allowed 755,376 (ΣL(L+1)/2 = 755,376), computed 804,736 of 4,194,304
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
# ## Exercises
#
# 1. For $C = 768$, at which length $N$ are the two $N^2$ products 90% of a layer's MACs?
#    Solve $2N^2C = 0.9\,(4NC^2 + 2N^2C)$, then check with `mha_cost`.
#
# /// details | Answer
# $2N^2C \cdot 0.1 = 0.9 \cdot 4NC^2$ gives $N = 18C$:

# %%
C = 768
n = 18 * C
cost = mha_cost(n, C, 12)
share = (cost.terms["scores (QKᵀ)"] + cost.terms["weights·V"]) / cost.macs
print(f"N = {n:,}: N² products {share:.1%} of the MACs")

# %% [markdown]
# ```text
# N = 13,824: N² products 90.0% of the MACs
# ```
# ///
#
# 2. At which length does one self-attention layer cost as much as one RNN layer of the same
#    width $d$? Check it with `flops_of`.
#
# /// details | Answer
# $4n^2d = 4nd^2$ when $n = d$:

# %%
same = flops_of(self_attention, d) == flops_of(rnn, d)
print(f"n = d = {d}:", same, f"({flops_of(rnn, d):,} FLOPs each)")

# %% [markdown]
# ```text
# n = d = 512: True (536,870,912 FLOPs each)
# ```
# ///
#
# 3. An LSTM has four gates, each with its own pair of $d \times d$ matrices. Count one LSTM
#    layer at $n = 128$ and compare with the RNN.
#
# /// details | Answer
# %%
lstm = nn.LSTM(d, d, bias=False, batch_first=True, device="meta")
lstm_flops = flops_of(lstm, 128)
print(f"LSTM {lstm_flops:,} FLOPs = 4 × RNN:", lstm_flops == 4 * flops_of(rnn, 128))

# %% [markdown]
# ```text
# LSTM 536,870,912 FLOPs = 4 × RNN: True
# ```
#
# $16nd^2$: the LSTM buys its memory cell with four times the RNN's products, and it is just as
# sequential.
# ///
#
# 4. Swin's windows keep the products $2M^2NC$ below the projections $4NC^2$ when $M^2 < 2C$.
#    For Swin-T's first stage ($C = 96$, $M = 7$), what fraction of the projections are they,
#    and how large could a window be before they pass them?
#
# /// details | Answer
# %%
C, M = 96, 7
print(f"2M²NC / 4NC² = M² / 2C = {M**2 / (2 * C):.2f}")
print(f"M² = 2C at M = {(2 * C) ** 0.5:.1f}: windows up to 13×13 stay below the projections")

# %% [markdown]
# ```text
# 2M²NC / 4NC² = M² / 2C = 0.26
# M² = 2C at M = 13.9: windows up to 13×13 stay below the projections
# ```
# ///
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
