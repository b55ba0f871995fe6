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
# - the sinusoidal encoding of the Transformer, a learned table as in BERT and ViT, and
#   the 2-D sin-cos encoding for image patches;
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
# Vaswani et al. (2017, §3.5) add a fixed table PE of shape (N, C):
#
#     PE[pos, 2i]   = sin(pos / 10000^(2i/C))
#     PE[pos, 2i+1] = cos(pos / 10000^(2i/C))
#
# Each pair of channels is a sine and a cosine at one frequency, from one turn per
# 2π positions (channels 0 and 1) down to almost one turn per 10000·2π positions (the
# last pair).
# Nothing is learned, and it exists for any position.

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
# ## Learned positions (BERT, GPT-2, ViT)
#
# BERT, GPT-2 and ViT instead learn a table of shape (max_len, C), trained with the
# rest of the model. It costs max_len · C parameters and knows nothing beyond
# max_len: a longer input is refused.

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
# ## 2-D positions for image patches
#
# Image patches sit on a grid. The 2-D sin-cos encoding (MAE, "simple ViT") spends
# the first C/2 channels on the row and the last C/2 on the column, each a 1-D sin-cos
# code. Patches in the same row share the first half; patches in the same column
# share the second half.

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
# The picture: the sinusoidal table, the similarity PE·PEᵀ of every position with
# every other (a band along the diagonal: near positions are similar), and the
# similarity of the 2-D encoding of patch (2, 3) with every patch of the grid.

# %%
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
axes[0].imshow(pe.T.numpy(), cmap="RdBu", aspect="auto")
axes[0].set(title="sinusoidal PE (C × N)", xlabel="position", ylabel="channel")
axes[1].imshow((pe @ pe.T).numpy(), cmap="viridis")
axes[1].set(title="PE·PEᵀ", xlabel="position", ylabel="position")
sim = (pe2d @ pe2d[2 * w + 3]).reshape(h, w)  # patch (2, 3) against all
axes[2].imshow(sim.numpy(), cmap="viridis")
axes[2].set(title="2-D: patch (2, 3) · every patch", xlabel="column", ylabel="row")
fig.tight_layout()
fig.savefig("positions.png", dpi=80)

# %% [markdown]
# ![The sinusoidal table, its similarity matrix, and 2-D similarities on a grid](../../assets/tutorials/05-positions/positions.png)
#
# ## DETR: positions on the queries and keys only
#
# Adding positions to the embeddings puts them into everything: queries, keys and
# **values**, so the content each token carries is mixed with where it was. DETR
# (Carion et al. 2020) adds them only where they decide *who attends to whom*:
#
#     q = (x + pos)·W^Q    k = (x + pos)·W^K    v = x·W^V
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
# positions added to x:     outputs differ by up to 0.0065
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
# ## Try next
#
# - Replace `SinusoidalPositionalEncoding` by `LearnedPositionalEmbedding(16, C)` in
#   the "dog bites man" test: untrained, it breaks the symmetry too.
# - Relative positions (RoPE, ALiBi, T5's buckets) act inside attention instead of on
#   the embeddings: `attnkit.RotaryEmbedding`, `attnkit.AlibiBias`, `attnkit.RelativePositionBias`.
# - [Masks](04-masks.md) and [multi-head attention](02-multi-head.md), if you skipped them.
