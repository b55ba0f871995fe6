# Made from docs/en/tutorials/12-flash-attention.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # FlashAttention from scratch
#
# Attention as tutorial 1 writes it builds the whole score matrix $QK^\top$, $N \times S$ numbers,
# then the softmax of each row, then the product with $V$. At $N = S = 65{,}536$ tokens that is 4
# billion scores per head, 16 GiB in float32 — for a result, $N \times D$, that is a thousand times
# smaller. FlashAttention (Dao et al. 2022; FlashAttention-2, Dao 2023) never builds it: it walks
# over blocks of keys, keeps a running maximum and a running sum per query row, and rescales
# what it has accumulated whenever the maximum grows. This page derives that *online softmax*,
# writes the tiled loop in twenty lines, checks it against `attnkit.attention` to the last digits
# and measures its memory against the plain version. attnkit's `chunked` backend and ring
# attention are this loop.
#
# You will learn:
#
# - how to compute a softmax over a row you see one block at a time (running max and sum, and
#   the rescale by $e^{m_\text{old} - m_\text{new}}$);
# - the tiled FlashAttention forward pass, and why it returns the log-sum-exp;
# - how much memory it saves, measured: $O(N)$ against $O(N^2)$;
# - the log-sum-exp merge that attnkit's chunked kernel and ring attention share.
#
# ## The softmax of a row seen in blocks
#
# The softmax of scores $s_1, \dots, s_S$ is $e^{s_j - m} / \ell$ with $m = \max_j s_j$ (subtracted
# so that no exponential overflows; it cancels) and $\ell = \sum_j e^{s_j - m}$. Both need the
# whole row. Read the row in blocks instead and keep, after each block, the maximum $m$ so far
# and the sum $\ell$ of $e^{s_j - m}$ over the keys seen so far. When a new block arrives with a
# larger maximum $m'$, every term already in $\ell$ was taken relative to the old $m$, so the sum
# is rescaled:
#
# $$
# m' = \max\big(m, \max_{j \in \text{block}} s_j\big), \qquad
# \ell' = e^{m - m'}\,\ell + \sum_{j \in \text{block}} e^{s_j - m'} .
# $$
#
# At the end, $m + \log \ell$ is the log-sum-exp of the row, $\log \sum_j e^{s_j}$ (Milakov and
# Gimelshein 2018, "Online normalizer calculation for softmax").

# %%
import math

import torch

import attnkit

g = torch.Generator().manual_seed(0)
row = torch.randn(1000, generator=g, dtype=torch.float64) * 3  # one row of scores

m, l = -math.inf, 0.0
for block in row.split(128):  # 8 blocks, the last one shorter
    m_new = max(m, block.max().item())
    l = math.exp(m - m_new) * l + torch.exp(block - m_new).sum().item()
    m = m_new
print(f"streamed log-sum-exp {m + math.log(l):.12f}")
print(f"torch.logsumexp      {torch.logsumexp(row, 0).item():.12f}")

# %% [markdown]
# ```text
# streamed log-sum-exp 10.725138668433
# torch.logsumexp      10.725138668433
# ```
#
# ## The output is rescaled the same way
#
# A query's output is $\sum_j \frac{e^{s_j - m}}{\ell} v_j$. Keep the unnormalised sum
# $\mathbf{acc} = \sum_j e^{s_j - m} v_j$ next to $\ell$: when the maximum moves from $m$ to
# $m'$, multiply $\mathbf{acc}$ by the same $e^{m - m'}$, add the new block's
# $\sum_j e^{s_j - m'} v_j$, and divide by $\ell$ once, at the end. Done for a block of queries at
# once, each step is two matrix products of one tile, $Q_i K_j^\top$ and $P_{ij} V_j$. That is
# FlashAttention's forward pass (Algorithm 1 of FlashAttention-2, which divides by $\ell$ at the end):

# %%
BLOCK = 128  # query rows and key rows per tile


def flash_attention(q, k, v, block_q=BLOCK, block_k=BLOCK):
    """softmax(q kᵀ/√D) v, one (block_q, block_k) tile at a time; also the log-sum-exp per row.

    q (N, D), k (S, D), v (S, Dv) -> out (N, Dv), lse (N,)."""
    n, d = q.shape
    out = torch.empty(n, v.shape[1], dtype=q.dtype)
    lse = torch.empty(n, dtype=q.dtype)
    for i in range(0, n, block_q):
        q_i = q[i : i + block_q] / math.sqrt(d)  # (bq, D)
        m = torch.full((len(q_i),), -math.inf, dtype=q.dtype)  # running max per row
        l = torch.zeros(len(q_i), dtype=q.dtype)  # running sum of exp(s - m)
        acc = torch.zeros(len(q_i), v.shape[1], dtype=q.dtype)  # (bq, Dv), unnormalised
        for j in range(0, k.shape[0], block_k):
            s = q_i @ k[j : j + block_k].T  # (bq, bk): the only scores that exist
            m_new = torch.maximum(m, s.max(dim=1).values)
            p = torch.exp(s - m_new[:, None])  # (bq, bk)
            rescale = torch.exp(m - m_new)  # 0 on the first block: exp(-inf)
            l = rescale * l + p.sum(dim=1)
            acc = rescale[:, None] * acc + p @ v[j : j + block_k]
            m = m_new
        out[i : i + block_q] = acc / l[:, None]
        lse[i : i + block_q] = m + torch.log(l)
    return out, lse


# %% [markdown]
# Check it against `attnkit.attention` in float64 on sizes that no block divides (the last blocks
# are shorter): the reference backend (plain matmul and softmax) and the chunked one, which also
# returns the log-sum-exp.

# %%
g = torch.Generator().manual_seed(1)
q = torch.randn(300, 64, generator=g, dtype=torch.float64)  # N = 300
k = torch.randn(257, 64, generator=g, dtype=torch.float64)  # S = 257
v = torch.randn(257, 48, generator=g, dtype=torch.float64)  # Dv = 48
out, lse = flash_attention(q, k, v)

ref = attnkit.attention(q[None, None], k[None, None], v[None, None], backend="reference")
chunked = attnkit.attention(q[None, None], k[None, None], v[None, None], backend="chunked")
diff = (out - ref.out[0, 0]).abs().max().item()
print(f"largest difference from the reference: {diff:.0e} (float64 keeps 16 digits)")
print("below 1e-14:", diff < 1e-14)
print(
    "same log-sum-exp as the chunked backend:",
    torch.allclose(lse, chunked.lse[0, 0], rtol=1e-15, atol=0),
)

# %% [markdown]
# ```text
# largest difference from the reference: ...e-16 (float64 keeps 16 digits)
# below 1e-14: True
# same log-sum-exp as the chunked backend: True
# ```
#
# The two agree to the sixteenth digit, the precision of float64 itself: the blocks change the
# order of the additions, nothing else.
#
# ## Memory: O(N) against O(N²), measured
#
# `attnkit.analysis.peak_tensors.PeakTensors` watches every tensor that torch allocates inside a
# `with` block and records the largest number of bytes alive at once (not an estimate: the
# dispatcher reports every allocation). The plain version holds the $(N, N)$ scores and their
# softmax; the tiled one a few $(128, 128)$ tiles and the $(N, D)$ output.

# %%
from attnkit.analysis.peak_tensors import PeakTensors


def naive_attention(q, k, v):
    weights = torch.softmax(q @ k.T / math.sqrt(q.shape[1]), dim=-1)  # (N, S)
    return weights @ v


sizes = [256, 512, 1024, 2048]
peaks = {"plain": [], "tiled": []}
print(f"{'N':>5} {'plain MiB':>10} {'tiled MiB':>10}  plain/tiled")
for n in sizes:
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(n, 64, generator=g, dtype=torch.float64) for _ in range(3))
    for name, fn in (("plain", naive_attention), ("tiled", flash_attention)):
        with PeakTensors() as meter:
            fn(q, k, v)
        peaks[name].append(meter.peak / 2**20)
    plain, tiled = peaks["plain"][-1], peaks["tiled"][-1]
    print(f"{n:5d} {plain:10.2f} {tiled:10.2f}  {plain / tiled:6.1f}x")

# %% [markdown]
# ```text
#     N  plain MiB  tiled MiB  plain/tiled
#   256       1.00       0.76     1.3x
#   512       4.00       0.88     4.5x
#  1024      16.00       1.14    14.1x
#  2048      64.00       1.64    38.9x
# ```
#
# The plain peak is $16 N^2$ bytes, the scores and their softmax in float64: each doubling of $N$
# multiplies it by 4. The tiled peak is a few $(128, 128)$ tiles, the same at every $N$, plus the
# $(N, D)$ output and the row statistics, which grow with $N$: each doubling adds twice what the
# previous one added (0.12, 0.26, 0.50 MiB). Quadratic against linear, and the gap widens with
# every doubling. (These numbers are exact byte counts of float64 tensors: they are the same on
# every machine.)

# %%
from attnkit.viz.lessons_more import curves_figure

fig = curves_figure(
    sizes,
    {"peak memory of one attention call (float64, D = 64)": {
        "plain: softmax(QKᵀ/√D)V": peaks["plain"],
        "tiled (FlashAttention)": peaks["tiled"],
    }},
    xlabel="sequence length N", ylabel="MiB alive at once", logx=True, logy=True,
    lang="en",
)  # fmt: skip
fig.savefig("12-memory.png", dpi=100)

# %% [markdown]
# ![Peak memory against N on log-log axes: the plain version's line rises with slope 2 (quadratic), the tiled one stays near 1 MiB and grows linearly](../../assets/tutorials/12-memory.png)
#
# Time is another matter: the tiled loop does the same multiplications and runs a Python loop
# over tiles, so on the page it is slower than one big matrix product. FlashAttention's speed on
# a GPU comes from doing this loop inside one kernel, where the tiles stay in fast on-chip
# memory; attnkit's compiled CPU kernel does the same in C++ (tutorial 7 has its costs).
#
# ## One merge for blocks, kernels and GPUs
#
# The running update has a closed form for two partial results. Compute attention over two
# disjoint sets of keys, $A$ and $B$, each giving $(\mathrm{out}_A, \mathrm{lse}_A)$ and
# $(\mathrm{out}_B, \mathrm{lse}_B)$. The attention over all keys is
#
# $$
# \mathrm{lse} = \log\big(e^{\mathrm{lse}_A} + e^{\mathrm{lse}_B}\big), \qquad
# \mathrm{out} = e^{\mathrm{lse}_A - \mathrm{lse}}\,\mathrm{out}_A + e^{\mathrm{lse}_B - \mathrm{lse}}\,\mathrm{out}_B ,
# $$
#
# because each partial output was normalised by its own sum $e^{\mathrm{lse}}$. The loop above
# merges one new key block at a time; attnkit's `chunked` kernel does the same per key block (in
# C++ on the CPU); [ring attention](../guides/ring-attention.md) merges the blocks that arrive
# from the other GPUs of a ring, in this exact form. That is why the chunked backend returns the
# log-sum-exp: it is what a merge needs, and what the backward pass needs to recompute the
# weights $P = e^{S - \mathrm{lse}}$ block by block instead of storing them.

# %%
g = torch.Generator().manual_seed(2)
q = torch.randn(1, 1, 100, 64, generator=g, dtype=torch.float64)  # (B, H, N, D)
k = torch.randn(1, 1, 200, 64, generator=g, dtype=torch.float64)  # (B, H, S, D)
v = torch.randn(1, 1, 200, 32, generator=g, dtype=torch.float64)  # (B, H, S, Dv)

a = attnkit.attention(q, k[:, :, :120], v[:, :, :120], backend="chunked")  # keys 0..119
b = attnkit.attention(q, k[:, :, 120:], v[:, :, 120:], backend="chunked")  # keys 120..199
lse = torch.logaddexp(a.lse, b.lse)  # (B, H, N)
out = torch.exp(a.lse - lse)[..., None] * a.out + torch.exp(b.lse - lse)[..., None] * b.out
whole = attnkit.attention(q, k, v, backend="chunked")
print("merged == all keys at once:", torch.allclose(out, whole.out, rtol=0, atol=1e-14))
print("merged lse == lse of all keys:", torch.allclose(lse, whole.lse, rtol=0, atol=1e-13))

# %% [markdown]
# ```text
# merged == all keys at once: True
# merged lse == lse of all keys: True
# ```
#
# ## Exercises
#
# Each answer is code that runs; try before you open it.
#
# **1.** The block sizes are a choice of speed, not of result. Run `flash_attention` with blocks
# of 1, 7 and 300 queries and keys, and compare.
#
# /// details | Answer
# %%
g = torch.Generator().manual_seed(3)
q, k, v = (torch.randn(20, 16, generator=g, dtype=torch.float64) for _ in range(3))
outs = [flash_attention(q, k, v, b, b)[0] for b in (1, 7, 300)]
print("blocks 1, 7, 300 agree:", all(torch.allclose(o, outs[0], rtol=0, atol=1e-14) for o in outs))

# %% [markdown]
# ```text
# blocks 1, 7, 300 agree: True
# ```
#
# With blocks of 1 key, the loop is the streaming softmax of the first section; with one block
# of all keys, it is plain attention.
# ///
#
# **2.** With a causal mask, query $i$ sees keys $0..i$. Which tiles of an $N = S = 512$ loop with
# $64 \times 64$ tiles can be skipped entirely, and what fraction of the work is that?
#
# /// details | Answer
# %%
nb = 512 // 64
skipped = sum(1 for i in range(nb) for j in range(nb) if j * 64 > i * 64 + 63)
print(f"{skipped} of {nb * nb} tiles lie above the diagonal: {skipped / nb**2:.0%} of the work")


# %% [markdown]
# ```text
# 28 of 64 tiles lie above the diagonal: 44% of the work
# ```
#
# The 8 tiles on the diagonal are partly masked and still computed; FlashAttention skips the
# 28 above it, and attnkit's chunked kernel skips every block a structured mask empties
# (tutorial 4).
# ///
#
# **3.** The merge is associative: merge three key ranges in two different orders.
#
# /// details | Answer
# %%
def merge(x, y):
    lse = torch.logaddexp(x[1], y[1])
    return torch.exp(x[1] - lse)[..., None] * x[0] + torch.exp(y[1] - lse)[..., None] * y[0], lse


parts = [attnkit.attention(q[None, None], k[None, None, s], v[None, None, s], backend="chunked")
         for s in (slice(0, 5), slice(5, 12), slice(12, 20))]  # fmt: skip
parts = [(p.out, p.lse) for p in parts]
left = merge(merge(parts[0], parts[1]), parts[2])
right = merge(parts[0], merge(parts[1], parts[2]))
print("(a·b)·c == a·(b·c):", torch.allclose(left[0], right[0], rtol=0, atol=1e-14))

# %% [markdown]
# ```text
# (a·b)·c == a·(b·c): True
# ```
#
# This is why a ring may receive the key blocks of the other GPUs in any order.
# ///
#
# ## Try next
#
# - Add `causal` to `flash_attention`: skip the tiles above the diagonal and mask the diagonal
#   ones; compare with `attnkit.attention(..., causal=True)`.
# - Write the backward pass from the saved `lse` (Algorithm 2 of FlashAttention-2), checked
#   with `torch.autograd.gradcheck` on a small float64 input.
# - [What attention costs](07-cost.md): the FLOPs and the memory of each backend;
#   [Ring attention](../guides/ring-attention.md): the merge across GPUs.
# - Sources: Milakov and Gimelshein, "Online normalizer calculation for softmax" (2018); Rabe
#   and Staats, "Self-attention Does Not Need O(n²) Memory" (2021); Dao, Fu, Ermon, Rudra, Ré,
#   "FlashAttention" (2022); Dao, "FlashAttention-2" (2023).
