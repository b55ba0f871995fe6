# Made from docs/en/tutorials/01-self-attention.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # Self-attention in six steps
#
# This page computes self-attention by hand on a two-word sentence, *"Thinking
# Machines"*, one small step at a time, with the dimensions of the Transformer paper
# (Vaswani et al. 2017): embeddings of dimension $d_{\text{model}} = 512$ and query/key/value
# vectors of dimension $d_k = 64$. Every number below is printed by the code above it, and
# every figure is drawn by the code on this page.
#
# You will learn:
#
# - where the query, key and value vectors come from (learned projections of the embeddings);
# - what a score is, why it is divided by $\sqrt{d_k}$, and what the softmax makes of it
#   (with autograd: how small the gradient gets without the division);
# - how the six steps become one line, $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$, and that
#   this line is exactly what `attnkit.attention` computes;
# - how the same formula grows out of something simpler: averaging the tokens that came
#   before, first with a loop, then with a matrix, then with a softmax.
#
# ## The picture
#
# Each word asks a question (its **query**), offers a label (its **key**) and
# carries some content (its **value**). To compute the new representation of
# "Thinking", we compare the query of "Thinking" with the key of every word,
# including itself. Each comparison is a **score**. The scores are scaled and
# turned by a softmax into **attention weights** that are positive and add up to 1.
# The output for "Thinking" is the weighted sum of the values: mostly the value of
# the words whose keys matched its query best.
#
# ![The six steps with this page's numbers: X, then Q, K, V, then the scores QKᵀ, divided by 8, the softmax weights A and the output Z = AV](../../assets/tutorials/01-six-steps.png)
#
# The figure holds the numbers this page computes below (the first two of the 512 or
# 64 columns of the wide matrices): step 0 gives the embeddings X, step 1 the queries, keys
# and values, step 2 the scores $QK^\top$, step 3 divides them by $\sqrt{64} = 8$, step 4 turns
# each row into weights $A$ that sum to 1, and steps 5 and 6 weight and add the values,
# $Z = AV$. The code that draws it is in [the six steps in one picture](#six-steps-picture).
#
# ## Step 0: embeddings
#
# A model first maps every word to a vector. Here an `nn.Embedding` table with one
# row per word plays that part; its rows are random (the table is not trained), which
# is all the arithmetic needs.

# %%
import math

import torch

import attnkit

torch.manual_seed(0)
words = ["Thinking", "Machines"]
d_model, d_k = 512, 64  # the widths of the Transformer paper

embed = torch.nn.Embedding(len(words), d_model)  # one learned row per word
x = embed(torch.arange(len(words))).detach()  # (N, d_model) = (2, 512)
print("x:", tuple(x.shape))
print("x1[:4] =", [round(t, 4) for t in x[0, :4].tolist()])

# %% [markdown]
# ```text
# x: (2, 512)
# x1[:4] = [-1.1258, -1.1524, -0.2506, -0.4339]
# ```
#
# ## Step 1: queries, keys and values by learned projections
#
# Three weight matrices $W^Q, W^K, W^V$ (512 × 64 each) map every embedding to a
# query, a key and a value. They are ordinary linear layers, trained with the rest
# of the model. `nn.Linear` stores its weight transposed, as (out, in) = (64, 512),
# and computes $xW^\top$.

# %%
W_q = torch.nn.Linear(d_model, d_k, bias=False)  # W^Q: 512 -> 64
W_k = torch.nn.Linear(d_model, d_k, bias=False)  # W^K
W_v = torch.nn.Linear(d_model, d_k, bias=False)  # W^V
with torch.no_grad():
    q, k, v = W_q(x), W_k(x), W_v(x)  # (2, 64) each: row i belongs to word i
print("q, k, v:", tuple(q.shape), tuple(k.shape), tuple(v.shape))
print("W^Q:", tuple(W_q.weight.shape), "=", W_q.weight.numel(), "parameters")

# %% [markdown]
# ```text
# q, k, v: (2, 64) (2, 64) (2, 64)
# W^Q: (64, 512) = 32768 parameters
# ```
#
# The vectors have 64 dimensions, not 512: $d_k$ is a choice of the model, and the
# Transformer makes it $d_{\text{model}} / h$ with $h = 8$ heads (the next tutorial).
#
# ## Step 2: scores
#
# The score of "Thinking" against each word is the dot product of its query $q_1$
# with that word's key: $q_1 \cdot k_1$ and $q_1 \cdot k_2$.

# %%
q1 = q[0]  # the query of "Thinking"
scores = torch.stack([q1 @ k[0], q1 @ k[1]])  # q1·k1, q1·k2
print("scores:", [round(s, 4) for s in scores.tolist()])

# %% [markdown]
# ```text
# scores: [0.462, -5.2876]
# ```
#
# ## Step 3: divide by √d_k
#
# With $d_k = 64$ the divisor is $\sqrt{64} = 8$.

# %%
scaled = scores / math.sqrt(d_k)
print("sqrt(d_k) =", math.sqrt(d_k))
print("scaled:", [round(s, 4) for s in scaled.tolist()])

# %% [markdown]
# ```text
# sqrt(d_k) = 8.0
# scaled: [0.0577, -0.6609]
# ```
#
# ## Step 4: softmax
#
# The softmax turns the scaled scores $s_j$ into weights that are positive and sum to 1:
#
# $$
# a_j = \frac{e^{s_j}}{\sum_{j'} e^{s_{j'}}}
# $$

# %%
a1 = torch.softmax(scaled, dim=0)  # attention weights of "Thinking"
print("weights:", [round(w, 4) for w in a1.tolist()], "sum =", round(a1.sum().item(), 6))

# %% [markdown]
# ```text
# weights: [0.6723, 0.3277] sum = 1.0
# ```
#
# "Thinking" keeps about two thirds of its own value and takes one third from "Machines".
#
# ## Steps 5 and 6: weight the values, then sum
#
# Each value vector is multiplied by its weight, and the weighted values are added up.
# The result $z_1 = a_{11} v_1 + a_{12} v_2$ is the new representation of "Thinking", with
# 64 dimensions.

# %%
weighted = a1[:, None] * v  # (2, 64): a11·v1 and a12·v2
z1 = weighted.sum(dim=0)  # (64,)
print("z1:", tuple(z1.shape), "first 4:", [round(t, 4) for t in z1[:4].tolist()])

# %% [markdown]
# ```text
# z1: (64,) first 4: [-0.1779, 0.0239, 0.1001, 0.3266]
# ```
#
# ## All words at once: the matrix form
#
# Doing this for every word is the same arithmetic on matrices. Stack the queries,
# keys and values as rows of $Q, K, V$ ($N \times d_k$ each). Then $QK^\top$ holds every score
# at once (row $i$: the query of word $i$ against every key), the softmax runs along each
# row, and multiplying by $V$ forms every weighted sum:
#
# $$
# Z = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V
# $$

# %%
Q, K, V = q, k, v  # (N, d_k) = (2, 64)
A = torch.softmax(Q @ K.T / math.sqrt(d_k), dim=-1)  # (N, N) = (2, 2), softmax per row
Z = A @ V  # (N, d_k) = (2, 64)
print("QKᵀ:", tuple((Q @ K.T).shape), " Z:", tuple(Z.shape))
print(A)
print("row 0 is step 4:", torch.allclose(A[0], a1), " Z[0] is z1:", torch.allclose(Z[0], z1))

# %% [markdown]
# ```text
# QKᵀ: (2, 2)  Z: (2, 64)
# tensor([[0.6723, 0.3277],
#         [0.3556, 0.6444]])
# row 0 is step 4: True  Z[0] is z1: True
# ```
#
# The second row is "Machines" asking the same question of both words.
#
# ## The six steps in one picture {#six-steps-picture}
#
# `attnkit.viz.attention_steps_figure` draws the matrices of the six steps, each with its
# numbers (the figure at the top of this page). It recomputes the scores, the weights and
# the output from `q`, `k` and `v` in float64, so the picture checks the steps above.

# %%
from attnkit.viz import attention_steps_figure

fig = attention_steps_figure(x, q, k, v, tokens=words, lang="en")
fig.savefig("01-six-steps.png", dpi=100)

# %% [markdown]
# ## The same thing with attnkit
#
# `attnkit.attention(q, k, v)` is this formula. It takes tensors shaped
# (B, H, N, D): batch, heads, tokens, head dimension. Our single sentence with a single
# head is B = H = 1, so we add two leading axes. `need_weights=True` also returns
# the weights A.

# %%
res = attnkit.attention(Q[None, None], K[None, None], V[None, None], need_weights=True)
print("out:", tuple(res.out.shape), " weights:", tuple(res.weights.shape))
torch.testing.assert_close(res.out[0, 0], Z)  # raises if they differ
torch.testing.assert_close(res.weights[0, 0], A)
print("equal:", torch.allclose(res.out[0, 0], Z) and torch.allclose(res.weights[0, 0], A))

# %% [markdown]
# ```text
# out: (1, 1, 2, 64)  weights: (1, 1, 2, 2)
# equal: True
# ```
#
# ## Why divide by √d_k?
#
# If the entries of $q$ and $k$ are independent with mean 0 and variance 1, their dot
# product $q \cdot k = \sum_{i=1}^{d_k} q_i k_i$ is a sum of $d_k$ such products and has variance
# $d_k$: a standard deviation of 8 for $d_k = 64$. Scores that large push the softmax to put
# almost all weight on one key, where its gradient is nearly zero. Dividing by $\sqrt{d_k}$
# brings the standard deviation back to 1. Measure it on 10,000 random query/key pairs, and see what the
# softmax does over 10 keys with and without the division:

# %%
g = torch.Generator().manual_seed(0)
qs = torch.randn(10_000, d_k, generator=g)
ks = torch.randn(10_000, d_k, generator=g)
dots = (qs * ks).sum(-1)
print(f"std of q·k: {dots.std():.2f}   after / sqrt(d_k): {(dots / math.sqrt(d_k)).std():.2f}")

rows = dots.reshape(1000, 10)  # 1000 queries, 10 keys each
raw = torch.softmax(rows, -1).max(-1).values.mean()
fair = torch.softmax(rows / math.sqrt(d_k), -1).max(-1).values.mean()
print(f"mean largest weight over 10 keys: unscaled {raw:.2f}, scaled {fair:.2f}")

# %% [markdown]
# ```text
# std of q·k: 8.00   after / sqrt(d_k): 1.00
# mean largest weight over 10 keys: unscaled 0.87, scaled 0.32
# ```
#
# Without the division, the largest of 10 weights takes 0.87 on average: each
# query nearly copies one value. With it, the weights stay spread out and trainable.
#
# **Try it.** One query against 10 keys at $d_k = 64$ (scores with a standard deviation of about
# 8): drag the divisor from 1 (no scaling) to 16 and watch the row of weights sharpen onto one
# key or flatten towards $1/10$ each. It starts at $\sqrt{d_k} = 8$.
#
# <div class="ak-play" data-play="softmax"></div>
#
# "Trainable" is a claim about gradients, so let autograd measure it. The softmax's
# derivative is $\partial a_i / \partial s_j = a_i(\delta_{ij} - a_j)$: when one weight is
# nearly 1 and the others nearly 0, every entry is nearly 0, and whatever gradient arrives
# at the weights hardly reaches the scores (and through them $W^Q$ and $W^K$). Take
# $d_k = 512$, 1,000 queries with 16 keys each, send a random gradient into the weights
# and look at the largest $|\partial L / \partial s|$ of each query's scores:

# %%
d_big = 512
g = torch.Generator().manual_seed(0)
qs = torch.randn(1000, 1, d_big, generator=g, dtype=torch.float64)  # 1000 queries
ks = torch.randn(1000, 16, d_big, generator=g, dtype=torch.float64)  # 16 keys for each
upstream = torch.randn(1000, 1, 16, generator=g, dtype=torch.float64)  # dL/d(weights)

print(f"{'':14} {'std of scores':>13} {'largest weight':>15}  max |dL/ds| per query")
grads = {}
for name, scale in (("unscaled", 1.0), ("÷ sqrt(512)", 1 / math.sqrt(d_big))):
    s = (qs @ ks.transpose(1, 2) * scale).requires_grad_()  # (1000, 1, 16)
    weights = torch.softmax(s, dim=-1)
    (weights * upstream).sum().backward()
    grads[name] = s.grad.abs().amax(-1).median()  # the typical query
    largest = weights.amax(-1).mean()
    print(f"{name:14} {s.std():13.1f} {largest:15.2f}  {grads[name]:.0e} (median)")
ratio = grads["÷ sqrt(512)"] / grads["unscaled"]
print(f"the scaled scores get about 10^{math.log10(ratio):.0f} times more gradient")

# %% [markdown]
# ```text
#                std of scores  largest weight  max |dL/ds| per query
# unscaled                22.8            0.95  2e-04 (median)
# ÷ sqrt(512)              1.0            0.24  2e-01 (median)
# the scaled scores get about 10^3 times more gradient
# ```
#
# Unscaled, the scores have a standard deviation of about $\sqrt{512} \approx 22.6$, the
# largest of 16 weights takes 0.95 on average, and the gradient that reaches the scores is
# about a thousand times smaller than with the division: the queries and keys would barely
# learn. attnkit divides by $\sqrt{D}$ by default; `attention(..., scale=s)` multiplies the
# scores by `s` instead of $1/\sqrt{D}$ (`scale=1.0` gives plain dot products).
#
# ## Attention grown from averaging the past
#
# Here is another way to arrive at the same formula, the one Andrej Karpathy takes in his
# lecture on building GPT: start from the simplest way for a token to gather information
# from the tokens before it, an average, and improve it one step at a time. Six tokens of
# four channels, and for each token $t$ the mean of tokens $0 \ldots t$:

# %%
T, C = 6, 4  # 6 tokens, 4 channels
g = torch.Generator().manual_seed(1)
seq = torch.randn(T, C, generator=g)

# 1. a loop: token t averages tokens 0..t
avg_loop = torch.zeros(T, C)
for t in range(T):
    avg_loop[t] = seq[: t + 1].mean(dim=0)

# 2. the same with one matrix product: row t of W holds 1/(t+1) in its first t+1 places
W = torch.tril(torch.ones(T, T))
W = W / W.sum(dim=1, keepdim=True)
avg_matrix = W @ seq  # (T, T) @ (T, C) -> (T, C)
print(W[:3].numpy().round(3))
print("matrix == loop:", torch.allclose(avg_matrix, avg_loop))

# 3. the same weights from a softmax: 0 where allowed, -inf in the future
allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))
zeros = torch.zeros(T, T).masked_fill(~allowed, float("-inf"))
W_soft = torch.softmax(zeros, dim=-1)  # equal scores -> equal weights
print("softmax == matrix:", torch.allclose(W_soft, W), torch.allclose(W_soft @ seq, avg_loop))

# %% [markdown]
# ```text
# [[1.    0.    0.    0.    0.    0.   ]
#  [0.5   0.5   0.    0.    0.    0.   ]
#  [0.333 0.333 0.333 0.    0.    0.   ]]
# matrix == loop: True
# softmax == matrix: True True
# ```
#
# Step 3 is the key: a softmax over equal scores gives equal weights, and $-\infty$ gives
# weight 0. The average is attention whose scores are all the same. Now let each token
# decide how much it wants from each earlier one: the score becomes the data-dependent dot
# product of a query and a key, and the values become a projection of the tokens too.

# %%
head = 4  # head dimension
query, key, value = (torch.nn.Linear(C, head, bias=False) for _ in range(3))
with torch.no_grad():
    q4, k4, v4 = query(seq), key(seq), value(seq)  # (T, head) each
    scores = (q4 @ k4.T / math.sqrt(head)).masked_fill(~allowed, float("-inf"))  # (T, T)
    weights = torch.softmax(scores, dim=-1)  # rows sum to 1, zeros in the future
    out = weights @ v4  # (T, head)
    res = attnkit.attention(q4[None, None], k4[None, None], v4[None, None], causal=True)
print("rows sum to 1:", torch.allclose(weights.sum(-1), torch.ones(T)))
print("no weight on the future:", bool((weights.triu(1) == 0).all()))
print("== attnkit.attention(causal=True):", torch.allclose(res.out[0, 0], out, atol=1e-6))

# %% [markdown]
# ```text
# rows sum to 1: True
# no weight on the future: True
# == attnkit.attention(causal=True): True
# ```
#
# That is self-attention (with a causal mask, as in GPT): the uniform average of step 2
# with its weights now computed from the tokens. One query row, drawn: the scaled scores
# of all queries (the future is $-\infty$), the softmax of row 4, and the weighted sum of the
# values that gives the output of token 4.

# %%
from attnkit.viz import attention_row_figure

fig = attention_row_figure(q4, k4, v4, 4, mask=allowed, lang="en")
fig.savefig("01-one-row.png", dpi=100)

# %% [markdown]
# ![The score grid of six tokens with the future masked, the softmax of row 4 as bars, and the values weighted and summed into the output of token 4](../../assets/tutorials/01-one-row.png)
#
# **Try it.** Pick another query token of these six: its scaled scores (the future is
# $-\infty$) and its row of weights, as `attnkit.attention(..., causal=True, need_weights=True)`
# gives them for the tokens above. Token 0 can only look at itself; token 5 sees all six.
#
# <div class="ak-play" data-play="row"></div>
#
# ## Exercises
#
# Each answer is code that runs; try before you open it.
#
# **1.** Self-attention has no idea of order. Permute the two words (swap the rows of `X`):
# show that the output rows are swapped the same way and nothing else changes.
#
# /// details | Answer
# %%
perm = torch.tensor([1, 0])
with torch.no_grad():
    Z_perm = attnkit.attention(*(W(x[perm])[None, None] for W in (W_q, W_k, W_v))).out[0, 0]
print("output of the swapped words == swapped output:", torch.allclose(Z_perm, Z[perm]))

# %% [markdown]
# ```text
# output of the swapped words == swapped output: True
# ```
#
# This is why Transformers add positional encodings ([Positions](05-positions.md)).
# ///
#
# **2.** Add the same number, say 100, to every score of a row. What happens to the weights?
# And if you multiply the scores by 2?
#
# /// details | Answer
# %%
s = Q @ K.T / math.sqrt(d_k)
print("+ 100:", torch.allclose(torch.softmax(s + 100, -1), A))
print("× 2 :", torch.softmax(2 * s, -1)[0].numpy().round(2), "instead of", A[0].numpy().round(2))

# %% [markdown]
# ```text
# + 100: True
# × 2 : [0.81 0.19] instead of [0.67 0.33]
# ```
#
# Adding a constant changes nothing: $e^{s_j + c} / \sum e^{s_{j'} + c}$ cancels $e^c$. Multiplying
# sharpens: the larger weight grows. Dividing by $\sqrt{d_k}$ is such a multiplication, by $1/8$.
# ///
#
# **3.** What if the scores are not divided by $\sqrt{d_k}$? Compute the weights of both words
# without the division.
#
# /// details | Answer
# %%
A_raw = torch.softmax(Q @ K.T, dim=-1)
print(A_raw.numpy().round(3))

# %% [markdown]
# ```text
# [[0.997 0.003]
#  [0.009 0.991]]
# ```
#
# Each word now takes more than 99% of its own value: the scores 0.46 and −5.29 are 8 times
# further apart than the scaled ones. The rows are nearly one-hot, where the softmax's gradient
# vanishes (the table above).
# ///
#
# **4.** How many parameters do $W^Q$, $W^K$, $W^V$ have together, and how many would one head
# with $d_k = d_{\text{model}} = 512$ need?
#
# /// details | Answer
# %%
n = sum(W.weight.numel() for W in (W_q, W_k, W_v))
print(f"d_k = 64: {n:,}   d_k = 512: {3 * 512 * 512:,}")

# %% [markdown]
# ```text
# d_k = 64: 98,304   d_k = 512: 786,432
# ```
#
# $3 \cdot 512 \cdot 64 = 98{,}304$. The Transformer runs 8 heads of 64, which together cost what
# one head of 512 would: the next tutorial.
# ///
#
# ## Try next
#
# - Change `d_k` to 16 or 256 and watch the unscaled statistics grow with it.
# - Give `attnkit.attention` a batch: `Q[None, None].expand(3, 1, 2, 64)` (and the same for K, V) gives 3 identical outputs.
# - [Multi-head attention](02-multi-head.md): eight of these side by side, each of dimension 64.
