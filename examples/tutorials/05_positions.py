# Made from docs/en/tutorials/05-positions.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # Positions: telling attention where tokens are
#
# Attention compares every query with every key, and nothing in that comparison
# says where a token sits. Shuffle the tokens and each one gets exactly the same
# output as before, only in the new order. This page proves that with a permutation
# test, then adds positions in the ways models do.
#
# You will learn:
#
# - why attention alone ignores word order (a permutation test, "dog bites man" against "man bites dog");
# - the sinusoidal encoding of the Transformer (drawn as a heat map, with the dot products that
#   depend on distance only), a learned table as in BERT and ViT, and the 2-D sin-cos encoding
#   for image patches;
# - why concatenating a one-hot position and adding a learned position embedding are the same thing;
# - DETR's way: positions added to the queries and keys only, never to the values.
#
# ## Attention alone ignores order
#
# Give "dog bites man" and "man bites dog" the same word embeddings and run one
# multi-head attention without positions. The output for "dog" is the same in both
# sentences: attention sees a *set* of tokens, not a sequence.

# %%
import torch

import attnkit
from attnkit import positional

torch.manual_seed(0)
C = 32
vocab = {"dog": 0, "bites": 1, "man": 2}
embed = torch.nn.Embedding(len(vocab), C)
mha = attnkit.MultiHeadAttention(C, 4).eval()


def encode(sentence, add_positions=None):
    """Embeddings (1, N, C), positions added if given, through one attention."""
    x = embed(torch.tensor([[vocab[w] for w in sentence.split()]]))
    if add_positions is not None:
        x = add_positions(x)
    return mha(x)[0].detach()  # (N, C)


a = encode("dog bites man")
b = encode("man bites dog")
print("'dog' is the same in both sentences:", torch.allclose(a[0], b[2], atol=1e-6))
print("'man' is the same in both sentences:", torch.allclose(a[2], b[0], atol=1e-6))

# %% [markdown]
# ```text
# 'dog' is the same in both sentences: True
# 'man' is the same in both sentences: True
# ```
#
# The general statement is *permutation equivariance*: permuting the input tokens
# permutes the outputs in the same way, for any permutation.

# %%
x = torch.randn(2, 10, C)  # (B, N, C)
perm = torch.randperm(10)
y = mha(x)
print("mha(x[:, perm]) == mha(x)[:, perm]:", torch.allclose(mha(x[:, perm]), y[:, perm], atol=1e-6))

# %% [markdown]
# ```text
# mha(x[:, perm]) == mha(x)[:, perm]: True
# ```
#
# Word order has to be put into the tokens themselves. The usual way is to add a
# vector that depends on the position to each token's embedding.
#
# ## Sinusoidal positions (the Transformer)
#
# Vaswani et al. (2017, §3.5) add a fixed table $PE$ of shape (N, C):
#
# $$
# PE_{(pos,\,2i)} = \sin\!\left(\frac{pos}{10000^{2i/C}}\right), \qquad
# PE_{(pos,\,2i+1)} = \cos\!\left(\frac{pos}{10000^{2i/C}}\right)
# $$
#
# Each pair of dimensions is a sine and a cosine at one frequency
# $\omega_i = 10000^{-2i/C}$, from one turn per $2\pi$ positions (dimensions 0 and 1) down
# to one turn per $10000^{(C-2)/C} \cdot 2\pi$ positions for the last pair (with $C = 32$, as
# here, about $5{,}600 \cdot 2\pi$; the period approaches $10000 \cdot 2\pi$ only as $C$ grows). Nothing is learned,
# and it exists for any position.

# %%
pe = positional.sinusoidal(50, C)  # (N, C)
print("table:", tuple(pe.shape))
print("position 0, first 6 channels:", [round(t, 4) for t in pe[0, :6].tolist()])
print("position 1, first 6 channels:", [round(t, 4) for t in pe[1, :6].tolist()])

sinus = attnkit.SinusoidalPositionalEncoding(C)  # the module: x + PE[:N]
a = encode("dog bites man", sinus)
b = encode("man bites dog", sinus)
print("with positions, 'dog' differs:", not torch.allclose(a[0], b[2], atol=1e-6))

# %% [markdown]
# ```text
# table: (50, 32)
# position 0, first 6 channels: [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
# position 1, first 6 channels: [0.8415, 0.5403, 0.5332, 0.846, 0.311, 0.9504]
# with positions, 'dog' differs: True
# ```
#
# Why sines and cosines? The dot product of two positions' encodings depends only
# on how far apart they are, not on where they are. A model can read relative
# offsets from it:

# %%
pe64 = positional.sinusoidal(50, C, dtype=torch.float64)  # float64: no rounding in the sums
for p in (0, 10, 30):
    near, far = pe64[p] @ pe64[p + 1], pe64[p] @ pe64[p + 10]
    print(f"PE[{p}]·PE[{p + 1}] = {near:.4f}   PE[{p}]·PE[{p + 10}] = {far:.4f}")

# %% [markdown]
# ```text
# PE[0]·PE[1] = 15.3136   PE[0]·PE[10] = 10.0589
# PE[10]·PE[11] = 15.3136   PE[10]·PE[20] = 10.0589
# PE[30]·PE[31] = 15.3136   PE[30]·PE[40] = 10.0589
# ```
#
# The reason is $\sin a \sin b + \cos a \cos b = \cos(a - b)$: each pair of dimensions
# contributes the cosine of its angle difference, so
#
# $$
# PE_{p} \cdot PE_{p+k} = \sum_{i=0}^{C/2-1} \cos(k\,\omega_i),
# $$
#
# which has no $p$ in it. The picture: the table as a heat map (positions down, dimensions
# across: fast stripes on the left, slow ones on the right) and $PE_p \cdot PE_{p+k}$ against
# the distance $k$ for three starting positions, whose curves lie on top of each other.

# %%
from attnkit.viz import plot_positional_encoding

fig = plot_positional_encoding(pe, starts=(0, 10, 30), max_offset=16, lang="en")
fig.savefig("sinusoidal.png", dpi=100)

# %% [markdown]
# ![The sinusoidal table, 50 positions by 32 dimensions, and the dot product of two positions against their distance: the curves for positions 0, 10 and 30 coincide](../../assets/tutorials/05-positions/sinusoidal.png)
#
# ## Learned positions (BERT, GPT-2, ViT)
#
# BERT, GPT-2 and ViT instead learn a table of shape (`max_len`, C), trained with the
# rest of the model. It costs `max_len` $\cdot\, C$ parameters and knows nothing beyond
# `max_len`: a longer input is refused.

# %%
learned = attnkit.LearnedPositionalEmbedding(max_len=8, dim=C)  # BERT: 512 × 768
print("parameters:", sum(p.numel() for p in learned.parameters()), "= 8 ·", C)
print("3 tokens:", tuple(learned(torch.zeros(1, 3, C)).shape))
try:
    learned(torch.zeros(1, 9, C))
except ValueError as err:
    print("ValueError:", err)
print("sinusoidal at position 10,000:", tuple(positional.sinusoidal(1, C, offset=10_000).shape))

# %% [markdown]
# ```text
# parameters: 256 = 8 · 32
# 3 tokens: (1, 3, 32)
# ValueError: positions 0..8 exceed max_len=8 (x has 9 tokens)
# sinusoidal at position 10,000: (1, 32)
# ```
#
# ## Concatenating a one-hot position is adding a learned embedding
#
# Why *add* a position vector to the token, rather than append the position to it? Append
# it, and the two end up the same. Write position $n$ of at most $L$ as the one-hot vector
# $p_n \in \{0, 1\}^L$ and concatenate it to the token vector $x$. The first thing a
# Transformer does with its input is a linear map (the query, key and value projections), and
# a linear map of a concatenation splits into two:
#
# $$
# W \begin{bmatrix} x \\ p_n \end{bmatrix} = W_x\, x + W_p\, p_n = W_x\, x + (W_p)_{:,n}
# $$
#
# $W_p\, p_n$ picks column $n$ of $W_p$: one trained vector per position, added to the
# projected token. That is a learned position table, $P = W_p^\top$ of shape ($L$, C). Check it
# with tensors:

# %%
L = 8  # positions the one-hot vector can name
tokens = embed(torch.tensor([[0, 1, 2, 1]])).detach()  # (1, N, C): "dog bites man bites"
one_hot = torch.eye(L)[:4][None]  # (1, N, L): row n is the one-hot vector of position n
first = torch.nn.Linear(C + L, C, bias=False)  # the first layer reads [x; p]
concatenated = first(torch.cat([tokens, one_hot], dim=-1))  # W [x; p]
W_x, W_p = first.weight.split([C, L], dim=1)  # (C, C) and (C, L)
print("W [x; p] == W_x x + W_p p:", torch.allclose(concatenated, tokens @ W_x.T + one_hot @ W_p.T))

table = attnkit.LearnedPositionalEmbedding(max_len=L, dim=C)
with torch.no_grad():
    table.weight.copy_(W_p.T)  # the position table is W_p's columns, (L, C)
same = torch.allclose(concatenated, table(tokens @ W_x.T))
print("== W_x x plus a learned position table:", same)

# %% [markdown]
# ```text
# W [x; p] == W_x x + W_p p: True
# == W_x x plus a learned position table: True
# ```
#
# So adding a learned table loses nothing against concatenating one-hot positions, and it
# keeps the width at C instead of $C + L$.
#
# ## 2-D positions for image patches
#
# Image patches sit on a grid. The 2-D sin-cos encoding (MAE, "simple ViT") spends half of
# the $C$ dimensions on the row and half on the column, each a 1-D sin-cos code of $C/2$
# dimensions. attnkit's `sincos_2d` puts the row in the first $C/2$ and the column in the last
# $C/2$, so patches in the same row share the first half and patches in the same column share
# the second half. MAE's code (`get_2d_sincos_pos_embed`, whose `np.meshgrid(grid_w, grid_h)`
# puts "w first") and simple ViT's (`concat([sin x, cos x, sin y, cos y])`) put the *column*
# first: the same table as attnkit's for MAE (same frequencies $10000^{-i/(C/4)}$) with its two
# halves swapped, so MAE's fixed table loads into attnkit with `torch.cat([pe[:, C//2:],
# pe[:, :C//2]], 1)` (simple ViT also spaces its frequencies as $i/(C/4 - 1)$, not $i/(C/4)$).

# %%
h, w = 6, 8
pe2d = positional.sincos_2d(h, w, C)  # (h·w, C), patches in row-major order
print("table:", tuple(pe2d.shape))
same_row = torch.equal(pe2d[0, : C // 2], pe2d[5, : C // 2])  # patches (0, 0) and (0, 5)
same_col = torch.equal(pe2d[0, C // 2 :], pe2d[3 * w, C // 2 :])  # patches (0, 0) and (3, 0)
print("same row shares the first half:", same_row, " same column the second:", same_col)

# %% [markdown]
# ```text
# table: (48, 32)
# same row shares the first half: True  same column the second: True
# ```
#
# The picture: the similarity $PE\,PE^\top$ of every position with every other (a band
# along the diagonal: near positions are similar), and the similarity of the 2-D encoding of
# patch (2, 3) with every patch of the grid.

# %%
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), width_ratios=(1, 1.3))
image = axes[0].imshow((pe @ pe.T).numpy(), cmap="viridis")
fig.colorbar(image, ax=axes[0])
axes[0].set(title="PE·PEᵀ", xlabel="position", ylabel="position")
sim = (pe2d @ pe2d[2 * w + 3]).reshape(h, w)  # patch (2, 3) against all
image = axes[1].imshow(sim.numpy(), cmap="viridis")
fig.colorbar(image, ax=axes[1])
axes[1].set(title="2-D: patch (2, 3) · every patch", xlabel="column", ylabel="row")
fig.tight_layout()
fig.savefig("positions.png", dpi=100)

# %% [markdown]
# ![The similarity matrix of the sinusoidal table, and 2-D similarities on a grid](../../assets/tutorials/05-positions/positions.png)
#
# ## DETR: positions on the queries and keys only
#
# Adding positions to the embeddings puts them into everything: queries, keys and
# **values**, so the content each token carries is mixed with where it was. DETR
# (Carion et al. 2020) adds them only where they decide *who attends to whom*:
#
# $$
# q = (x + \mathrm{pos})\,W^Q, \qquad k = (x + \mathrm{pos})\,W^K, \qquad v = x\,W^V
# $$
#
# `MultiHeadAttention(..., pos=)` does exactly that. Check it against the formula:

# %%
x = torch.randn(2, 10, C)
pos = positional.sinusoidal(10, C)[None].expand(2, 10, C)  # (B, N, C)
W_q, W_k, W_v = mha.in_proj.qkv.weight.split(C)  # (C, C) each, from the fused (3C, C)
b_q, b_k, b_v = mha.in_proj.qkv.bias.split(C)
q = (x + pos) @ W_q.T + b_q
k = (x + pos) @ W_k.T + b_k
v = x @ W_v.T + b_v  # no positions in the values


def heads(t):
    return t.unflatten(-1, (4, C // 4)).transpose(1, 2)  # (B, N, C) -> (B, H, N, D)


o = attnkit.attention(heads(q), heads(k), heads(v)).out  # (B, H, N, D)
by_hand = mha.proj(o.transpose(1, 2).flatten(2))  # (B, N, C)
print("mha(x, pos=pos) == formula:", torch.allclose(mha(x, pos=pos), by_hand, atol=1e-6))

# %% [markdown]
# ```text
# mha(x, pos=pos) == formula: True
# ```
#
# The difference shows when every token carries the same content. With positions in
# the values, the outputs differ from token to token even though the content is the
# same. With DETR's positions, the weights still differ from token to token, but every
# value is the same vector, so every output is that vector too: the values carry
# content only.

# %%
same = torch.randn(1, 1, C).expand(2, 10, C)  # 10 identical tokens
added = mha(same + pos)  # positions everywhere
detr = mha(same, pos=pos)  # positions on q and k only


def spread(y):
    return (y - y[:, :1]).abs().max().item()  # how far the tokens' outputs are from token 0's


print(f"positions added to x:     outputs differ by up to {spread(added):.4f}")
print(f"positions on q and k:     outputs differ by up to {spread(detr):.4f}")

# %% [markdown]
# ```text
# positions added to x:     outputs differ by up to 0.0062
# positions on q and k:     outputs differ by up to 0.0000
# ```
#
# (The first number is small because these untrained weights are almost uniform, so
# every output is close to the mean of the values; the second is zero up to rounding
# for any weights.)
#
# In DETR's decoder, the object queries attend to the image features with positions on
# both sides: `mha(queries, memory, pos=query_pos, context_pos=memory_pos)`, where
# `positional.detr_sine_2d(mask, C)` gives the image features' positions from the
# padding mask of the batch.

# %%
keep = torch.ones(2, 6, 8, dtype=torch.bool)  # (B, h, w): True = real pixel
keep[1, :, 5:] = False  # the second image is narrower
memory_pos = positional.detr_sine_2d(keep, C)  # (B, h·w, C)
memory = torch.randn(2, 6 * 8, C)  # image features, flattened row by row
queries, query_pos = torch.zeros(2, 5, C), torch.randn(2, 5, C)  # 5 object queries
real = keep.flatten(1)[:, None, None, :]  # (B, 1, 1, S) key-padding mask
out = mha(queries, memory, pos=query_pos, context_pos=memory_pos, mask=real)
print("memory_pos:", tuple(memory_pos.shape), " out:", tuple(out.shape))

# %% [markdown]
# ```text
# memory_pos: (2, 48, 32)  out: (2, 5, 32)
# ```
#
# ## Exercises
#
# **1.** Check the closed form $PE_p \cdot PE_{p+k} = \sum_i \cos(k\,\omega_i)$ against the table for
# every distance $k$ from 0 to 20.
#
# /// details | Answer
# %%
omega = 10000.0 ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)  # (C/2,) frequencies
closed = torch.stack([torch.cos(k * omega).sum() for k in range(21)])
from_table = torch.stack([pe64[7] @ pe64[7 + k] for k in range(21)])  # any start: here 7
print("closed form == table:", torch.allclose(closed, from_table))

# %% [markdown]
# ```text
# closed form == table: True
# ```
# ///
#
# **2.** Moving $k$ positions ahead rotates every (sin, cos) pair by the angle $k\,\omega_i$, the
# same rotation wherever you start. Build that rotation for $k = 5$ and check that it maps
# position 3 to 8 and position 20 to 25.
#
# /// details | Answer
# For one pair, $(\sin(a + b), \cos(a + b))$ is $(\sin a, \cos a)$ times a 2 × 2 matrix that
# depends on $b$ only:

# %%
k = 5  # positions ahead
cos_k, sin_k = torch.cos(k * omega), torch.sin(k * omega)  # one angle per pair, (C/2,)


def shift(row):
    s, c = row[0::2], row[1::2]  # the sines and the cosines, (C/2,) each
    return torch.stack([s * cos_k + c * sin_k, c * cos_k - s * sin_k], -1).flatten()


print("3 -> 8:", torch.allclose(shift(pe64[3]), pe64[8]))
print("20 -> 25:", torch.allclose(shift(pe64[20]), pe64[25]))

# %% [markdown]
# ```text
# 3 -> 8: True
# 20 -> 25: True
# ```
#
# A linear map that depends on $k$ alone takes any position to the one $k$ further: this is
# the property Vaswani et al. hoped would let attention learn relative offsets, and the idea
# that RoPE (`attnkit.RotaryEmbedding`) applies to the queries and keys directly.
# ///
#
# **3.** Repeat the permutation test of the first section with `SinusoidalPositionalEncoding`
# applied before the attention. Is the layer still permutation-equivariant?
#
# /// details | Answer
# No: a token that moves gets another position vector, so its output changes, not just its
# place.

# %%
with_positions = torch.nn.Sequential(sinus, mha)
x = torch.randn(2, 10, C)
perm = torch.randperm(10)
equivariant = torch.allclose(with_positions(x[:, perm]), with_positions(x)[:, perm], atol=1e-6)
print("still permutation-equivariant:", equivariant)

# %% [markdown]
# ```text
# still permutation-equivariant: False
# ```
# ///
#
# ## Try next
#
# - Replace `SinusoidalPositionalEncoding` by `LearnedPositionalEmbedding(16, C)` in
#   the "dog bites man" test: untrained, it breaks the symmetry too.
# - Relative positions (RoPE, ALiBi, T5's buckets) act inside attention instead of on
#   the embeddings: `attnkit.RotaryEmbedding`, `attnkit.AlibiBias`, `attnkit.RelativePositionBias`.
# - [Masks](04-masks.md) and [multi-head attention](02-multi-head.md), if you skipped them.
