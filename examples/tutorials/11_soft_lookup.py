# Made from docs/en/tutorials/11-soft-lookup.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # Attention as a soft lookup
#
# Before queries and keys were vectors, they were numbers on a line. This page follows the
# path of *Dive into Deep Learning* (Zhang et al., chapter 11): a 1-D regression problem solved
# by looking up the training points near a query and averaging their values with weights —
# Nadaraya–Watson kernel regression (Nadaraya 1964; Watson 1964). The weights come from a
# softmax of how close the query is to each key, so this *is* attention, and attnkit computes it.
# Then the comparison is learned: additive attention (Bahdanau et al. 2015) and scaled
# dot-product attention (Vaswani et al. 2017), the one the rest of these tutorials use.
#
# You will learn:
#
# - what the words query, key and value mean in the simplest case that has all three;
# - that a Gaussian kernel smoother is `attnkit.attention` with one scalar per token, a bias
#   and a scale, to the last digits;
# - how a learned kernel width sharpens the weights, and what the weights look like;
# - the two scoring functions of the literature, additive and scaled dot-product, side by side
#   on the same queries and keys, with padded keys masked out.
#
# ## A 1-D lookup table with noise
#
# Fifty training points $(x_i, y_i)$ with $y_i = 2\sin x_i + x_i^{0.8} + \epsilon$, noise
# $\epsilon \sim \mathcal{N}(0, 0.5^2)$, and fifty queries on a grid where we want to predict
# $f(x)$. In the language of attention the $x_i$ are the **keys**, the $y_i$ the **values**
# and the grid points the **queries**.

# %%
import math

import torch

import attnkit

g = torch.Generator().manual_seed(0)
n = 50


def f(x):
    return 2 * torch.sin(x) + x**0.8


x_keys = torch.sort(torch.rand(n, generator=g, dtype=torch.float64) * 5).values  # (S,)
y_values = f(x_keys) + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)  # (S,)
x_queries = torch.arange(0, 5, 0.1, dtype=torch.float64)  # (N,)
truth = f(x_queries)


def error(prediction):
    return float(((prediction - truth) ** 2).mean())


print(f"{len(x_keys)} keys and values, {len(x_queries)} queries")
average = y_values.mean().expand(len(x_queries))  # the same answer for every query
print(f"average of all values: mean squared error {error(average):.2f}")

# %% [markdown]
# ```text
# 50 keys and values, 50 queries
# average of all values: mean squared error 1.04
# ```
#
# The plain average ignores the query. A better guess gives more weight to the points whose
# $x_i$ is close to the query $x$.
#
# ## Nadaraya–Watson: weights from a kernel
#
# Nadaraya and Watson weighted each value by a kernel $K(x - x_i)$, normalised to sum to 1:
#
# $$
# f(x) = \sum_{i} \frac{K(x - x_i)}{\sum_j K(x - x_j)}\, y_i .
# $$
#
# With the Gaussian kernel $K(u) = e^{-u^2/2}$ the weights are a softmax:
#
# $$
# \alpha(x, x_i) = \mathrm{softmax}_i\!\left(-\tfrac{1}{2}(x - x_i)^2\right), \qquad
# f(x) = \sum_i \alpha(x, x_i)\, y_i .
# $$
#
# This is **attention pooling** (d2l's name): a weighted average of the values, whose weights
# compare the query with each key. The weights are positive and sum to 1 in every row.

# %%
distance = x_queries[:, None] - x_keys[None, :]  # (N, S): every query minus every key
print("distances:", tuple(distance.shape))


def kernel_weights(x_q, x_k, w=1.0):
    """Gaussian-kernel weights (N, S); w is the inverse width of the kernel."""
    return torch.softmax(-(((x_q[:, None] - x_k[None, :]) * w) ** 2) / 2, dim=1)


weights_fixed = kernel_weights(x_queries, x_keys)  # (N, S)
pred_fixed = weights_fixed @ y_values  # (N,)
print(f"Gaussian kernel, width 1: mean squared error {error(pred_fixed):.2f}")
print("rows sum to 1:", torch.allclose(weights_fixed.sum(1), torch.ones(len(x_queries)).double()))

# %% [markdown]
# ```text
# distances: (50, 50)
# Gaussian kernel, width 1: mean squared error 0.68
# rows sum to 1: True
# ```
#
# ## It is `attnkit.attention`, to the last digits
#
# Expand the square: $-\tfrac12 (x - x_i)^2 = x\,x_i - \tfrac12 x_i^2 - \tfrac12 x^2$. The last
# term is the same for every key of a row, and the softmax ignores what a whole row shares
# (tutorial 1, exercise 2). What is left is a dot product of a 1-dimensional query with a
# 1-dimensional key, plus a bias $-\tfrac12 x_i^2$ per key, with scale 1 instead of
# $1/\sqrt{d}$. That is a call of `attnkit.attention` with head dimension $D = 1$:

# %%
as_tensors = dict(
    q=x_queries[None, None, :, None],  # (B, H, N, D) = (1, 1, 50, 1)
    k=x_keys[None, None, :, None],  # (1, 1, S, 1)
    v=y_values[None, None, :, None],  # (1, 1, S, 1)
)
res = attnkit.attention(
    **as_tensors,
    bias=-(x_keys**2 / 2)[None, None, None, :],  # (1, 1, 1, S): one number per key
    scale=1.0,
    need_weights=True,
)
print("same weights:", torch.allclose(res.weights[0, 0], weights_fixed, rtol=0, atol=1e-15))
print("same predictions:", torch.allclose(res.out[0, 0, :, 0], pred_fixed, rtol=0, atol=1e-14))

# %% [markdown]
# ```text
# same weights: True
# same predictions: True
# ```
#
# A kernel of width $1/w$ (the exponent $-\tfrac12 (w(x - x_i))^2$) is the same call with
# `scale=w**2` and the bias multiplied by $w^2$.
#
# ## A learned width
#
# The width 1 was a guess, and the curve it gives is too smooth (the figure below). Make the
# inverse width $w$ a parameter and learn it. Each training point is predicted from the other
# 49 (leaving itself out, or $w \to \infty$ would copy its own noisy value), and 100 steps of
# gradient descent minimise the squared error:

# %%
w = torch.ones(1, dtype=torch.float64, requires_grad=True)
optimizer = torch.optim.SGD([w], lr=1.0)
others = ~torch.eye(n, dtype=torch.bool)  # (S, S): every key but the point itself
keys_loo = x_keys.expand(n, n)[others].reshape(n, n - 1)  # (S, S - 1)
values_loo = y_values.expand(n, n)[others].reshape(n, n - 1)  # (S, S - 1)
for _ in range(100):
    a = torch.softmax(-(((x_keys[:, None] - keys_loo) * w) ** 2) / 2, dim=1)  # (S, S - 1)
    loss = ((a * values_loo).sum(1) - y_values).pow(2).mean() / 2
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

with torch.no_grad():
    weights_learned = kernel_weights(x_queries, x_keys, w)
    pred_learned = weights_learned @ y_values
print(f"learned w = {w.item():.1f} (a kernel {1 / w.item():.2f} wide)")
print(f"learned width: mean squared error {error(pred_learned):.2f}")

# %% [markdown]
# ```text
# learned w = 3.2 (a kernel 0.31 wide)
# learned width: mean squared error 0.12
# ```
#
# The weights of the learned kernel sit in a narrow band around each query: a query looks up
# the few keys nearest to it. On the left the predictions, on the right the weights
# (queries down, keys across; the keys are sorted, so near means near the diagonal):

# %%
from attnkit.viz.lessons_more import kernel_regression_figure

fig = kernel_regression_figure(
    x_keys, y_values, x_queries,
    {"width 1": pred_fixed, "learned width": pred_learned},
    {"weights, width 1": weights_fixed, "weights, learned": weights_learned},
    truth=truth, lang="en",
)  # fmt: skip
fig.savefig("11-kernel-regression.png", dpi=100)

# %% [markdown]
# ![Left: the noisy training points, the true function, the width-1 prediction (too smooth) and the learned-width prediction. Right: the two weight matrices, a wide band for width 1 and a narrow one for the learned width, each with a colour bar](../../assets/tutorials/11-kernel-regression.png)
#
# ## Scoring functions: from a kernel to learned comparisons
#
# Write the weights as a softmax of a **score** $a(\mathbf q, \mathbf k_i)$, an *attention scoring
# function* in d2l's words:
#
# $$
# \alpha(\mathbf q, \mathbf k_i) = \mathrm{softmax}_i\big(a(\mathbf q, \mathbf k_i)\big), \qquad
# \mathrm{out}(\mathbf q) = \sum_i \alpha(\mathbf q, \mathbf k_i)\, \mathbf v_i .
# $$
#
# The Gaussian kernel scored $a(q, k) = -\tfrac12 (q - k)^2$, fixed. With vectors, the
# comparison is learned. Two scoring functions have been used most.
#
# **Additive attention** (Bahdanau et al. 2015, the first attention of neural machine
# translation) runs query and key through one hidden layer:
# $a(\mathbf q, \mathbf k) = \mathbf w_v^\top \tanh(W_q \mathbf q + W_k \mathbf k)$. Query
# and key may have different sizes. Here 4 queries of size 20 score 10 keys of size 2 with
# $h = 8$ hidden units; the first 6 keys are real and the last 4 are padding, masked out
# (True = may attend, as everywhere in attnkit):

# %%
g = torch.Generator().manual_seed(1)
queries = torch.randn(4, 20, generator=g)  # (N, 20)
keys = torch.randn(10, 2, generator=g)  # (S, 2)
values = torch.randn(10, 4, generator=g)  # (S, Dv)
valid = torch.arange(10) < 6  # (S,): keys 6..9 are padding

torch.manual_seed(0)
W_q = torch.nn.Linear(20, 8, bias=False)
W_k = torch.nn.Linear(2, 8, bias=False)
w_v = torch.nn.Linear(8, 1, bias=False)
with torch.no_grad():
    hidden = torch.tanh(W_q(queries)[:, None, :] + W_k(keys)[None, :, :])  # (N, S, h)
    additive_scores = w_v(hidden)[..., 0]  # (N, S)
    additive = torch.softmax(additive_scores.masked_fill(~valid, float("-inf")), dim=-1)
print("additive weights:", tuple(additive.shape), " hidden tensor:", tuple(hidden.shape))
print("padding gets weight 0:", bool((additive[:, ~valid] == 0).all()))

# %% [markdown]
# ```text
# additive weights: (4, 10)  hidden tensor: (4, 10, 8)
# padding gets weight 0: True
# ```
#
# **Scaled dot-product attention** (Vaswani et al. 2017) needs query and key of one size $d$
# and scores $a(\mathbf q, \mathbf k) = \mathbf q^\top \mathbf k / \sqrt d$: one matrix
# product for all pairs, no $(N, S, h)$ tensor. Project the queries and keys to $d = 8$ and let
# `attnkit.attention` do the rest, mask included:

# %%
P_q = torch.nn.Linear(20, 8, bias=False)
P_k = torch.nn.Linear(2, 8, bias=False)
with torch.no_grad():
    q8, k8 = P_q(queries), P_k(keys)  # (N, 8), (S, 8)
    res = attnkit.attention(
        q8[None, None], k8[None, None], values[None, None],
        mask=valid[None, None, None, :], need_weights=True,
    )  # fmt: skip
dot = res.weights[0, 0]  # (N, S)
by_hand = torch.softmax((q8 @ k8.T / math.sqrt(8)).masked_fill(~valid, float("-inf")), -1)
print("attnkit == softmax(q·k/√d) by hand:", torch.allclose(dot, by_hand, atol=1e-6))
print("padding gets weight 0:", bool((dot[:, ~valid] == 0).all()))

# %% [markdown]
# ```text
# attnkit == softmax(q·k/√d) by hand: True
# padding gets weight 0: True
# ```
#
# Both rows of weights, drawn on one colour scale (the masked keys are white: weight 0). The
# weights are untrained, so their pattern means nothing yet; what matters is their shape
# (queries × keys), the rows that sum to 1 and the columns the mask empties:

# %%
from attnkit.viz.lessons_more import weights_figure

fig = weights_figure(
    {"additive (Bahdanau)": additive, "scaled dot-product": dot},
    title="Two scoring functions, keys 6-9 masked",
    lang="en",
)
fig.savefig("11-scoring-functions.png", dpi=100)

# %% [markdown]
# ![Two heat maps of 4 queries by 10 keys with one shared colour bar: additive and scaled dot-product weights; the last four key columns are white (masked, weight 0)](../../assets/tutorials/11-scoring-functions.png)
#
# Why did dot products win? The additive score builds an $(N, S, h)$ tensor and a $\tanh$ for
# every pair; the dot product is one matrix product, which hardware runs at its peak rate, and
# the $1/\sqrt d$ keeps its scores in the range where the softmax still has gradient
# (tutorial 1). Vaswani et al. report the two performing alike for small $d$, and additive
# attention ahead for large $d$ *without* the scaling, which is why the scaling is there.

# %%
N = S = 1024
h = d = 64
print(f"additive: an (N, S, h) tensor of {N * S * h:,} numbers and as many tanh")
print(f"dot-product: an (N, S) tensor of {N * S:,} scores, one matrix product")

# %% [markdown]
# ```text
# additive: an (N, S, h) tensor of 67,108,864 numbers and as many tanh
# dot-product: an (N, S) tensor of 1,048,576 scores, one matrix product
# ```
#
# ## Exercises
#
# Each answer is code that runs; try before you open it.
#
# **1.** What happens to Nadaraya–Watson as the inverse width $w$ goes to 0, and as it grows
# large? Check both ends.
#
# /// details | Answer
# %%
flat = kernel_weights(x_queries, x_keys, 1e-6) @ y_values
print("w -> 0 is the plain average:", torch.allclose(flat, average))
sharp = kernel_weights(x_queries, x_keys, 100.0)
print(f"w = 100: the largest weight of a row is {sharp.max(1).values.mean():.2f} on average")

# %% [markdown]
# ```text
# w -> 0 is the plain average: True
# w = 100: the largest weight of a row is 0.94 on average
# ```
#
# A very wide kernel gives every key the same weight: the average of the first section. A
# very narrow one copies the value of the nearest key (a nearest-neighbour lookup, a *hard*
# lookup). Attention sits between the two, and learning chooses where.
# ///
#
# **2.** Replace the Gaussian by the Laplace kernel $K(u) = e^{-|u|}$ (still a softmax, of
# $-|x - x_i|$). Is it a scaled dot product plus a bias as the Gaussian was?
#
# /// details | Answer
# %%
laplace = torch.softmax(-(x_queries[:, None] - x_keys[None, :]).abs(), dim=1)
print(f"Laplace kernel, width 1: mean squared error {error(laplace @ y_values):.2f}")

# %% [markdown]
# ```text
# Laplace kernel, width 1: mean squared error 0.65
# ```
#
# It fits about as well as the Gaussian of width 1; a learned width would help it too. But $|x - x_i|$ does not
# split into a product $x\,x_i$ plus terms of one side only, so it is not a dot-product score:
# it needs its own kernel (attnkit's `score_mod` hook exists for such scores).
# ///
#
# **3.** Show that masking a key out is the same as deleting it: the additive weights of the
# 6 real keys equal a softmax over those keys alone.
#
# /// details | Answer
# %%
alone = torch.softmax(additive_scores[:, valid], dim=-1)  # (N, 6)
print("masked == deleted:", torch.allclose(additive[:, valid], alone))

# %% [markdown]
# ```text
# masked == deleted: True
# ```
# ///
#
# ## Try next
#
# - Change the noise to 0.1 or the number of points to 500 and learn $w$ again: how does the
#   learned width follow the density of the keys?
# - [Self-attention in six steps](01-self-attention.md): queries, keys and values are now
#   learned projections of the same tokens.
# - [Masks](04-masks.md): the mask of the padding above, and every other mask.
# - Sources: Nadaraya (1964), Watson (1964); Bahdanau, Cho, Bengio, "Neural Machine Translation
#   by Jointly Learning to Align and Translate" (2015); Vaswani et al., "Attention Is All You
#   Need" (2017); Zhang, Lipton, Li, Smola, *Dive into Deep Learning*, §11.1–11.3.
