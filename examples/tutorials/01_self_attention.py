# Made from docs/en/tutorials/01-self-attention.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # Self-attention in six steps
#
# This page computes self-attention by hand on a two-word sentence, *"Thinking
# Machines"*, one small step at a time, with the widths of the Transformer paper
# (Vaswani et al. 2017): embeddings of width d_model = 512 and query/key/value
# vectors of width d_k = 64. Every number below is printed by the code above it.
#
# You will learn:
#
# - where the query, key and value vectors come from (learned projections of the embeddings);
# - what a score is, why it is divided by √d_k, and what the softmax makes of it;
# - how the six steps become one line, softmax(QKᵀ/√d_k)·V, and that this line is
#   exactly what `attnkit.attention` computes.
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
# ```
#           x1 "Thinking"              x2 "Machines"
#              |  W^Q W^K W^V              |  W^Q W^K W^V
#           q1  k1  v1                 q2  k2  v2
# score     q1·k1                      q1·k2
# ÷ √d_k    q1·k1 / 8                  q1·k2 / 8
# softmax   a11                        a12            (a11 + a12 = 1)
# output    z1 = a11·v1 + a12·v2
# ```
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
# Three weight matrices W^Q, W^K, W^V (512 × 64 each) map every embedding to a
# query, a key and a value. They are ordinary linear layers, trained with the rest
# of the model. `nn.Linear` stores its weight transposed, as (out, in) = (64, 512),
# and computes x·Wᵀ.

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
# The vectors are 64 wide, not 512: d_k is a choice of the model, and the
# Transformer makes it d_model / h with h = 8 heads (the next tutorial).
#
# ## Step 2: scores
#
# The score of "Thinking" against each word is the dot product of its query q1
# with that word's key.

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
# With d_k = 64 the divisor is √64 = 8.

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
# The softmax turns the scaled scores into weights that are positive and sum to 1.

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
# The result z1 is the new representation of "Thinking", 64 wide.

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
# keys and values as rows of Q, K, V (N × d_k each). Then QKᵀ holds every score at
# once (row i: the query of word i against every key), the softmax runs along each
# row, and multiplying by V forms every weighted sum:
#
#     Z = softmax(QKᵀ / √d_k) · V
#
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
# ## The same thing with attnkit
#
# `attnkit.attention(q, k, v)` is this formula. It takes tensors shaped
# (B, H, N, D): batch, heads, tokens, head width. Our single sentence with a single
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
# If the entries of q and k are independent with mean 0 and variance 1, their dot
# product is a sum of d_k such products and has variance d_k: a standard deviation
# of 8 for d_k = 64. Scores that large push the softmax to put almost all weight on
# one key, where its gradient is nearly zero. Dividing by √d_k brings the standard
# deviation back to 1. Measure it on 10,000 random query/key pairs, and see what the
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
# attnkit divides by √D by default; `attention(..., scale=s)` multiplies the scores
# by another `s`.
#
# ## Try next
#
# - Change `d_k` to 16 or 256 and watch the unscaled statistics grow with it.
# - Give `attnkit.attention` a batch: `Q[None, None].expand(3, 1, 2, 64)` (and the same for K, V) gives 3 identical outputs.
# - [Multi-head attention](02-multi-head.md): eight of these side by side, each 64 wide.
