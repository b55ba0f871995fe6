# Made from docs/en/tutorials/14-linear-attention.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # Linear attention against softmax attention
#
# Softmax attention compares every query with every key: $N \times S$ scores, time and memory
# that grow with the square of the length. Linear attention (Katharopoulos et al. 2020,
# "Transformers are RNNs") replaces the exponential of the softmax by a product of feature maps,
# $\mathrm{sim}(q, k) = \phi(q)^\top \phi(k)$, and then reorders one product so that the
# $N \times S$ matrix is never formed: time and memory grow linearly. This page derives it,
# writes it in a few lines (the causal form is a running sum: an RNN), counts both costs
# against softmax attention, and shows what the trick gives up, on a lookup that softmax
# attention gets right and linear attention cannot.
#
# You will learn:
#
# - the kernel trick: $(\phi(Q)\phi(K)^\top)V = \phi(Q)\,(\phi(K)^\top V)$, and the feature map
#   $\phi(x) = \mathrm{elu}(x) + 1$;
# - the causal form as running sums, one state of size $D \times D_v$ per head;
# - the arithmetic (FLOPs, counted) and the memory of both against $N$;
# - why linear attention blurs a sharp lookup: its weights have rank at most $D$, and a sharper
#   query does not sharpen them.
#
# ## The kernel trick
#
# Softmax attention gives query $i$ the output
# $\sum_j \frac{\exp(q_i^\top k_j / \sqrt D)}{\sum_{j'} \exp(q_i^\top k_{j'} / \sqrt D)}\, v_j$. Any
# positive similarity would make weights; take one that factors, $\mathrm{sim}(q, k) =
# \phi(q)^\top \phi(k)$ for a feature map $\phi$ with positive entries:
#
# $$
# \mathrm{out}_i = \frac{\sum_j \phi(q_i)^\top \phi(k_j)\, v_j^\top}{\sum_j \phi(q_i)^\top \phi(k_j)}
# = \frac{\phi(q_i)^\top \big(\sum_j \phi(k_j)\, v_j^\top\big)}{\phi(q_i)^\top \big(\sum_j \phi(k_j)\big)} .
# $$
#
# The sums in the second form do not depend on $i$: $\phi(K)^\top V$ is one $D \times D_v$
# matrix and $\sum_j \phi(k_j)$ one vector, computed once for all queries. The cost drops from
# $O(N S D)$ to $O((N + S) D D_v)$. Katharopoulos et al. choose $\phi(x) = \mathrm{elu}(x) + 1$:
# positive, and the identity plus one for $x > 0$.

# %%
import math

import torch
import torch.nn.functional as F

import attnkit


def phi(x):
    return F.elu(x) + 1  # > 0 everywhere (Katharopoulos et al. 2020, §3.2.1)


def linear_attention(q, k, v):
    """q (N, D), k (S, D), v (S, Dv) -> (N, Dv), never forming an (N, S) matrix."""
    fq, fk = phi(q), phi(k)
    kv = fk.T @ v  # (D, Dv): the sum over keys of phi(k_j) v_jᵀ
    z = fk.sum(dim=0)  # (D,): the sum over keys of phi(k_j)
    return (fq @ kv) / (fq @ z)[:, None]


def linear_attention_quadratic(q, k, v, causal=False):
    """The same weights written out as an (N, S) matrix, the way softmax attention is."""
    sim = phi(q) @ phi(k).T  # (N, S)
    if causal:
        sim = sim.tril()
    weights = sim / sim.sum(dim=-1, keepdim=True)  # rows sum to 1
    return weights @ v, weights


g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(100, 16, generator=g, dtype=torch.float64) for _ in range(3))
fast = linear_attention(q, k, v)
slow, weights = linear_attention_quadratic(q, k, v)
print("reordered == quadratic:", torch.allclose(fast, slow, rtol=0, atol=1e-13))
print("weights positive, rows sum to 1:", bool((weights > 0).all()),
      torch.allclose(weights.sum(-1), torch.ones(100, dtype=torch.float64)))  # fmt: skip

# %% [markdown]
# ```text
# reordered == quadratic: True
# weights positive, rows sum to 1: True True
# ```
#
# ## Causal: a running sum, an RNN
#
# With a causal mask, query $i$ may only use keys $j \le i$, so the two sums become prefix
# sums, updated one token at a time:
#
# $$
# S_i = S_{i-1} + \phi(k_i)\, v_i^\top, \qquad z_i = z_{i-1} + \phi(k_i), \qquad
# \mathrm{out}_i = \frac{\phi(q_i)^\top S_i}{\phi(q_i)^\top z_i} .
# $$
#
# That is a recurrent network whose state $(S_i, z_i)$ has a fixed size, $D \times D_v + D$,
# however long the sequence: generating a token costs the same at position 10 and at position
# 100,000, where softmax attention's KV cache grows with every token.

# %%
d, dv = q.shape[1], v.shape[1]  # 16, 16


def causal_linear_attention(q, k, v):
    """Token by token, as an RNN: the state is S (D, Dv) and z (D,)."""
    S = torch.zeros(q.shape[1], v.shape[1], dtype=q.dtype)
    z = torch.zeros(q.shape[1], dtype=q.dtype)
    out = []
    for fq_i, fk_i, v_i in zip(phi(q), phi(k), v, strict=True):
        S = S + torch.outer(fk_i, v_i)  # (D, Dv)
        z = z + fk_i  # (D,)
        out.append((fq_i @ S) / (fq_i @ z))
    return torch.stack(out)  # (N, Dv)


rnn = causal_linear_attention(q, k, v)
masked, _ = linear_attention_quadratic(q, k, v, causal=True)
print("RNN form == masked quadratic form:", torch.allclose(rnn, masked, rtol=0, atol=1e-13))
print("state size:", d * dv + d, "numbers, for any N")

# %% [markdown]
# ```text
# RNN form == masked quadratic form: True
# state size: 272 numbers, for any N
# ```
#
# (Training does not loop in Python: `torch.cumsum` of the $\phi(k_j) v_j^\top$ gives every $S_i$ at
# once, at the price of an $(N, D, D_v)$ tensor, or a chunked scan keeps memory small; see the
# exercises.)
#
# ## The costs, counted
#
# Softmax attention as tutorial 1 writes it (`plain`), attnkit's own `attnkit.attention` (whose
# CPU kernel is tiled: $O(N)$ memory, still $O(N^2)$ arithmetic), and `linear_attention`, for
# one head of $D = 64$ in float32. Two costs that do not depend on the machine or on what else
# it is doing: the floating-point operations of the matrix products (2 per multiply-add, the
# rule of tutorial 7), counted by torch's `FlopCounterMode` on the call itself, and memory, the
# peak of the tensors alive at once, counted exactly by `PeakTensors` (tutorial 12). The counter
# cannot see inside attnkit's kernel, so for it `attnkit.analysis.kernel_work` counts the score
# entries a tiled kernel computes (all $N \cdot S$ of them without a mask), each one a $D$-wide
# product $q \cdot k$ and a $D_v$-wide one with $v$. Time follows the arithmetic, but loosely and
# noisily (memory traffic, threads, other work on the machine), so this page does not print it.

# %%
from torch.utils.flop_counter import FlopCounterMode

from attnkit.analysis import kernel_work
from attnkit.analysis.peak_tensors import PeakTensors


def plain_softmax(q, k, v):
    return torch.softmax(q @ k.T / math.sqrt(q.shape[1]), dim=-1) @ v  # (N, S) scores


def with_attnkit(q, k, v):
    return attnkit.attention(q[None, None], k[None, None], v[None, None]).out[0, 0]


def counted_flops(fn, q, k, v):
    """The FLOPs of fn's matrix products, as torch counts them on the call."""
    with FlopCounterMode(display=False) as counter:
        fn(q, k, v)
    return counter.get_total_flops()


def tiled_kernel_flops(q, k, v):
    """The score entries the kernel computes, each a q·k and a weights·v product."""
    entries = kernel_work(n=q.shape[0], s=k.shape[0]).computed
    return 2 * entries * (q.shape[1] + v.shape[1])


methods = {
    "plain softmax": plain_softmax,
    "attnkit.attention": with_attnkit,
    "linear": linear_attention,
}
sizes = [512, 1024, 2048, 4096]
flops = {name: [] for name in methods}
mib = {name: [] for name in methods}
for n in sizes:
    g = torch.Generator().manual_seed(n)
    qkv = [torch.randn(n, 64, generator=g) for _ in range(3)]  # q, k, v: (N, 64) each
    for name, fn in methods.items():
        if fn is with_attnkit:  # torch's counter does not see inside the kernel
            flops[name].append(tiled_kernel_flops(*qkv))
        else:
            flops[name].append(counted_flops(fn, *qkv))
        with PeakTensors() as meter:
            fn(*qkv)
        mib[name].append(meter.peak / 2**20)
print(f"{'N':>5} {'plain MFLOP':>12} {'linear MFLOP':>13} {'plain MiB':>10} {'linear MiB':>11}")
for i, n in enumerate(sizes):
    print(f"{n:5d} {flops['plain softmax'][i] / 1e6:12,.0f} {flops['linear'][i] / 1e6:13,.1f} "
          f"{mib['plain softmax'][i]:10.2f} {mib['linear'][i]:11.2f}")  # fmt: skip
same = flops["attnkit.attention"] == flops["plain softmax"]
print("attnkit.attention: the FLOPs of plain softmax:", same)
ratio = flops["plain softmax"][-1] / flops["linear"][-1]
print(f"N = 4096: softmax attention does {ratio:.0f}x the arithmetic of linear attention")

# %% [markdown]
# ```text
#     N  plain MFLOP  linear MFLOP  plain MiB  linear MiB
#   512           67           8.4       2.00        0.52
#  1024          268          16.8       8.00        1.02
#  2048        1,074          33.6      32.00        2.02
#  4096        4,295          67.1     128.00        4.03
# attnkit.attention: the FLOPs of plain softmax: True
# N = 4096: softmax attention does 64x the arithmetic of linear attention
# ```
#
# Softmax attention's two products cost $2 \cdot N S (D + D_v) = 4 N^2 D$ FLOPs here, 4 times more
# per doubling of $N$; linear attention's, $\phi(K)^\top V$ and $\phi(Q)$ times it, cost
# $4 N D D_v$, twice as much per doubling (the normaliser's matrix-vector product, $2 N D$ more,
# is not among what torch counts). Their ratio is $N / D_v$: 64 at $N = 4096$, and it keeps
# growing with $N$. The plain version's memory is
# the $(N, N)$ scores and their softmax, 4 times more per doubling; linear attention holds
# $\phi(Q)$, $\phi(K)$ and two $(N, D)$ results, twice as much per doubling. attnkit's tiled
# kernel is $O(N)$ in memory too (tutorial 12), but it does every multiplication of the plain
# version: tiling saves memory, not arithmetic. The curves (log-log axes; on the left,
# attnkit.attention's line lies on top of the plain version's):

# %%
from attnkit.viz.lessons_more import curves_figure

# the legend's name of each method
labels = dict(zip(methods, ("plain softmax", "attnkit.attention", "linear"), strict=True))
fig = curves_figure(
    sizes,
    {
        "matrix-product FLOPs of one head": {labels[name]: [f / 1e6 for f in flops[name]] for name in methods},
        "peak memory": {labels[name]: mib[name] for name in methods},
    },
    xlabel="sequence length N", ylabel=["MFLOP", "MiB alive at once"], logx=True, logy=True,
    lang="en",
)  # fmt: skip
fig.savefig("14-costs.png", dpi=100)

# %% [markdown]
# ![Two log-log panels against N from 512 to 4096. FLOPs: plain softmax and attnkit.attention lie on one line of slope 2, linear attention rises with slope 1 and far below. Memory: plain softmax rises with slope 2, attnkit.attention and linear attention with slope 1](../../assets/tutorials/14-costs.png)
#
# ## What linear attention loses: a sharp lookup
#
# Give 32 keys, random unit vectors of dimension 16, each a one-hot value, and ask for the value
# of key $t$ with the query $q = \beta\, k_t$, the key itself scaled by $\beta$. A perfect lookup
# returns $v_t$: weight 1 on key $t$. Softmax attention's weight on the right key is
# $e^{\beta} / \sum_j e^{\beta k_t^\top k_j}$, which goes to 1 as $\beta$ grows: the query can
# make itself as sharp as it needs. Linear attention's weights are
# $\phi(\beta k_t)^\top \phi(k_j)$ normalised, and $\phi$ is nearly linear: scaling the query
# scales every similarity alike, and the weights hardly change.

# %%
g = torch.Generator().manual_seed(0)
n_keys, d = 32, 16
keys = F.normalize(torch.randn(n_keys, d, generator=g, dtype=torch.float64), dim=-1)  # (S, D)
values = torch.eye(n_keys, dtype=torch.float64)  # (S, S): value j is one-hot at j
print(
    f"{'beta':>4} {'softmax: weight on the right key':>33} {'linear: weight on the right key':>32}"
)
for beta in (1, 4, 16):
    queries = beta * keys  # query t asks for key t
    soft = torch.softmax(queries @ keys.T, dim=-1)  # (N, S); scale 1: beta is the temperature
    _, lin = linear_attention_quadratic(queries, keys, values)
    print(f"{beta:4d} {soft.diagonal().mean():33.2f} {lin.diagonal().mean():32.2f}")
found = (
    (linear_attention(16 * keys, keys, values).argmax(-1) == torch.arange(n_keys)).float().mean()
)
print(f"linear attention, beta = 16: right key found (argmax) for {found:.0%} of the queries")
print("rank of the weights, softmax:", torch.linalg.matrix_rank(soft).item(),
      " linear:", torch.linalg.matrix_rank(lin).item())  # fmt: skip

# %% [markdown]
# ```text
# beta  softmax: weight on the right key  linear: weight on the right key
#    1                              0.08                             0.03
#    4                              0.54                             0.04
#   16                              1.00                             0.04
# linear attention, beta = 16: right key found (argmax) for 81% of the queries
# rank of the weights, softmax: 32  linear: 16
# ```
#
# Softmax attention puts all of its weight on the right key at $\beta = 16$; linear attention
# never gets past 0.04, barely above the $1/32 = 0.03$ of a uniform average, and its output is a
# blur of all the values (even where its largest weight is on the right key). The rank says why:
# linear attention's weights are $\phi(Q)\phi(K)^\top$, a product through $D = 16$ features, so the
# $32 \times 32$ matrix has rank at most 16; the identity-like matrix of a perfect lookup needs
# rank 32. The exponential of the softmax is what lets $N$ queries pick $N$ different keys out
# of vectors of a smaller dimension. Recall tasks like this one are where linear attention and
# its successors fall behind softmax attention in practice (Arora et al. 2023, "Zoology"), and
# why long-context models usually keep softmax attention and make it cheaper instead: tiling
# (tutorial 12), windows and sparse masks (tutorial 4).

# %%
from attnkit.viz.lessons_more import weights_figure

fig = weights_figure(
    {"softmax, beta = 16": soft, "linear (elu + 1), beta = 16": lin},
    title="Query t asks for key t: the weights of 32 queries",
    lang="en",
)
fig.savefig("14-lookup.png", dpi=100)

# %% [markdown]
# ![Two 32 by 32 weight matrices on one colour bar: softmax attention's is a sharp diagonal (weight 1 on the right key), linear attention's a nearly uniform pale grid](../../assets/tutorials/14-lookup.png)
#
# ## Exercises
#
# Each answer is code that runs; try before you open it.
#
# **1.** Compute the causal form without a Python loop: every $S_i$ at once with `torch.cumsum`,
# and compare with `causal_linear_attention`.
#
# /// details | Answer
# %%
fq, fk = phi(q), phi(k)
S_all = torch.cumsum(fk[:, :, None] * v[:, None, :], dim=0)  # (N, D, Dv): S_1 ... S_N
z_all = torch.cumsum(fk, dim=0)  # (N, D)
out = torch.einsum("nd,nde->ne", fq, S_all) / (fq * z_all).sum(-1, keepdim=True)
print("cumsum == RNN:", torch.allclose(out, rnn, rtol=0, atol=1e-13))

# %% [markdown]
# ```text
# cumsum == RNN: True
# ```
#
# The $(N, D, D_v)$ tensor is the price of doing it at once; chunked forms (compute the state at
# every 64th token, loop inside the chunks) keep memory at $O(N D)$.
# ///
#
# **2.** Does a larger feature dimension rescue the lookup? Give the keys $D = 64$ dimensions
# (rank is no longer the limit: $64 > 32$).
#
# /// details | Answer
# %%
g = torch.Generator().manual_seed(0)
keys64 = F.normalize(torch.randn(n_keys, 64, generator=g, dtype=torch.float64), dim=-1)
_, lin64 = linear_attention_quadratic(16 * keys64, keys64, values)
print(
    f"weight on the right key: {lin64.diagonal().mean():.2f}, rank {torch.linalg.matrix_rank(lin64).item()}"
)

# %% [markdown]
# ```text
# weight on the right key: 0.03, rank 32
# ```
#
# Full rank, and still a blur: $\phi(x) = \mathrm{elu}(x) + 1$ keeps every similarity positive and of
# similar size, and scaling the query cannot sharpen it. A feature map that could (random
# features of the exponential, as Performer's, Choromanski et al. 2021) needs many more features
# to approximate a sharp softmax.
# ///
#
# **3.** Linear attention is the softmax's weights with $\exp(s)$ replaced by $\phi(q)^\top
# \phi(k)$. What does softmax attention become if the query is scaled by $\beta \to 0$?
#
# /// details | Answer
# %%
flat = torch.softmax(1e-6 * keys @ keys.T, dim=-1)
print(
    "beta -> 0: uniform weights 1/32:",
    torch.allclose(flat, torch.full_like(flat, 1 / 32), atol=1e-6),
)

# %% [markdown]
# ```text
# beta -> 0: uniform weights 1/32: True
# ```
#
# Softmax attention spans the whole range from a plain average ($\beta \to 0$) to a hard lookup
# ($\beta \to \infty$), as Nadaraya–Watson's width did (tutorial 11); linear attention stays near
# the average end.
# ///
#
# ## Try next
#
# - Time `causal_linear_attention` step by step against a KV-cached softmax decoder as $N$ grows:
#   one has a state of fixed size, the other a cache that grows.
# - Train both on the reverse task of tutorial 6 (`attnkit.seq2seq`), with the attention swapped.
# - [FlashAttention from scratch](12-flash-attention.md): the exact softmax at $O(N)$ memory;
#   [What attention costs](07-cost.md).
# - Sources: Katharopoulos, Vyas, Pappas, Fleuret, "Transformers are RNNs: Fast Autoregressive
#   Transformers with Linear Attention" (2020); Choromanski et al., "Rethinking Attention with
#   Performers" (2021); Arora et al., "Zoology: Measuring and Improving Recall in Efficient
#   Language Models" (2023).
